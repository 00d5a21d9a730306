"""ficco.kernels on any machine: under the Triton CPU interpreter where there is no GPU.

The interpreter computes fp32 and fp16 `tl.dot` correctly but not bf16 (relative error ~1e10
seen with Triton 3.9), so bf16 is covered by tests/gpu/test_kernels_gpu.py only. Tolerances
come from the data: the error of a torch matmul in the same dtype against a float64 reference.
"""

import os

import torch

if not torch.cuda.is_available():
    # Triton reads this when kernels are decorated: before ficco.kernels is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import (  # noqa: E402
    GPU_CONFIGS,
    INTERPRETER_CONFIGS,
    GemmConfig,
    TuningKey,
    cache_path,
    cached_config,
    candidate_configs,
    matmul,
    select_path,
    tune,
)
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels import tuning as tuning_mod  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    HOPPER_SHARED_MEMORY_BYTES,
    SplitPlan,
    split_plan,
    suits_shape,
)
from ficco.kernels.persistent import INTERPRETER, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETER:
    raise RuntimeError(
        "ficco.kernels was imported before TRITON_INTERPRET=1 was set: run this module first "
        "or set TRITON_INTERPRET=1 in the environment"
    )
DTYPES = [torch.float32, torch.float16]  # not bf16: the interpreter miscomputes it
SMALL = INTERPRETER_CONFIGS[0] if DEVICE == "cpu" else GemmConfig(64, 64, 32, 8, 3, 4)


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)


def _assert_close(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, add=None) -> None:
    """Elementwise error within 2x that of torch's own matmul in the same dtype (+ 1 ulp)."""
    ref = a.double().cpu() @ b.double().cpu()
    base = (a @ b).double().cpu()
    if add is not None:
        ref = ref + add.double().cpu()
        base = (base.to(add.dtype).to(add.device) + add).double().cpu()
    eps = torch.finfo(got.dtype).eps
    tol = 2 * (base - ref).abs().max().item() + eps * ref.abs().max().item() + 1e-30
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= tol, f"max abs error {err:.3g} > tolerance {tol:.3g}"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", [(5, 123, 123), (96, 80, 72), (1, 1, 1), (257, 33, 65)])
def test_odd_shapes(mnk, dtype, gen):
    m, n, k = mnk
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    out = matmul(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    _assert_close(out, a, b)


def test_both_kernels_agree(gen):
    # 96x80x72 fp32 views are TMA-aligned: select_path picks 'tma'; the pointer kernel must
    # compute the same function.
    a, b = _rand(96, 72, dtype=torch.float32, gen=gen), _rand(72, 80, dtype=torch.float32, gen=gen)
    out_tma = torch.full((96, 80), float("nan"), device=DEVICE)
    out_ptr = out_tma.clone()
    assert select_path(a, b, out_tma) == "tma"
    for out, path in ((out_tma, "tma"), (out_ptr, "ptr")):
        launch(a, b, out, accumulate=False, sm_budget=3, config=SMALL, path=path)
        _assert_close(out, a, b)


def test_misaligned_views_take_pointer_kernel(gen):
    a = _rand(5, 123, dtype=torch.float32, gen=gen)  # row stride 492 bytes: not 16-aligned
    b = _rand(123, 123, dtype=torch.float32, gen=gen)
    assert select_path(a, b, torch.empty(5, 123, device=DEVICE)) == "ptr"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("col0", [16, 3], ids=["aligned", "misaligned"])
def test_column_slice_output(dtype, col0, gen):
    m, n, k = 40, 48, 32
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    big = torch.full((m + 8, 128), float("nan"), dtype=dtype, device=DEVICE)
    view = big[4 : 4 + m, col0 : col0 + n]  # c [M, N] with row stride 128
    assert matmul(a, b, out=view) is view
    _assert_close(view, a, b)
    rest = big.clone()
    rest[4 : 4 + m, col0 : col0 + n] = 0
    assert rest.isnan().sum().item() == big.numel() - m * n  # nothing written outside


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_slice_output(dtype, gen):
    m, n, k = 33, 64, 48
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    big = torch.full((100, n), float("nan"), dtype=dtype, device=DEVICE)
    view = big[16 : 16 + m]
    matmul(a, b, out=view)
    _assert_close(view, a, b)
    assert big[:16].isnan().all() and big[16 + m :].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", ["tma", "ptr"])
def test_accumulate(dtype, path, gen):
    m, n, k = 48, 64, 40
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    before = _rand(m, n, dtype=dtype, gen=gen)
    out = before.clone()
    launch(a, b, out, accumulate=True, sm_budget=2, config=INTERPRETER_CONFIGS[2], path=path)
    _assert_close(out, a, b, add=before)


def test_accumulate_into_float32_slice(gen):
    # Split-K schedules add fp16 partial products into an fp32 buffer, here a row slice.
    a, b = _rand(32, 24, dtype=torch.float16, gen=gen), _rand(24, 64, dtype=torch.float16, gen=gen)
    big = _rand(64, 64, dtype=torch.float32, gen=gen)
    before = big.clone()
    matmul(a, b, out=big[16:48], accumulate=True)
    ref = before[16:48].double().cpu() + a.double().cpu() @ b.double().cpu()
    assert (big[16:48].double().cpu() - ref).abs().max().item() < 1e-4
    assert torch.equal(big[:16], before[:16]) and torch.equal(big[48:], before[48:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_operands(dtype, gen):
    m, n, k = 40, 48, 64
    w = _rand(n, k, dtype=dtype, gen=gen)  # a [N, K] weight, used as b = w^T [K, N]
    x = _rand(k, m, dtype=dtype, gen=gen)  # a = x^T [M, K], column-major
    assert select_path(x.t(), w.t(), torch.empty(m, n, dtype=dtype, device=DEVICE)) == "tma"
    _assert_close(matmul(x.t().contiguous(), w.t()), x.t(), w.t())
    _assert_close(matmul(x.t(), w.t()), x.t(), w.t())
    # a misaligned transposed view takes the pointer kernel with the same result
    w_odd = _rand(n, k + 1, dtype=dtype, gen=gen)[:, :k]
    _assert_close(matmul(x.t(), w_odd.t()), x.t(), w_odd.t())


@pytest.mark.parametrize("sm_budget", [1, 2, 10_000])
def test_sm_budget(sm_budget, gen):
    # 64x80 output in 16x16 tiles = 20 tiles: budget 1 walks them all in one program,
    # 10,000 starts one program per tile.
    a, b = _rand(64, 32, dtype=torch.float32, gen=gen), _rand(32, 80, dtype=torch.float32, gen=gen)
    out = matmul(a, b, sm_budget=sm_budget, config=SMALL)
    _assert_close(out, a, b)


@pytest.mark.parametrize(
    "tiles, programs, k_steps, expected",
    [
        (24, 132, 64, SplitPlan(0, 24, 5, 13)),  # one short wave: 24 tiles x 5 K ranges
        (160, 132, 128, SplitPlan(132, 28, 4, 32)),  # a full wave, then 28 tiles x 4
        (264, 132, 64, None),  # whole waves only
        (200, 132, 64, None),  # last wave 68/132 full: nothing to gain
        (10, 132, 6, None),  # too few K steps to split
        (3, 100, 100, SplitPlan(0, 3, 8, 13)),  # at most 8 ranges
    ],
)
def test_split_plan(tiles, programs, k_steps, expected):
    plan = split_plan(tiles, programs, k_steps)
    assert plan == expected
    if plan is not None:
        assert plan.units <= (tiles // programs) * programs + programs
        assert (plan.split - 1) * plan.k_per_split < k_steps <= plan.split * plan.k_per_split


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("sm_budget", [4, 16])  # a full wave + split tail; one split wave
def test_split_tail(sm_budget, accumulate, gen):
    m, n, k = 40, 64, 160  # 16x32 tiles: 3 x 2 = 6 tiles, 10 K steps
    cfg = (
        INTERPRETER_CONFIGS[3]
        if DEVICE == "cpu"
        else GemmConfig(64, 64, 32, 8, 3, 4, split_tail=True)
    )
    assert cfg.split_tail
    a, b = _rand(m, k, dtype=torch.float32, gen=gen), _rand(k, n, dtype=torch.float32, gen=gen)
    big = torch.full((m, 80), float("nan"), device=DEVICE)
    if accumulate:
        big[:, 8:72] = _rand(m, n, dtype=torch.float32, gen=gen)
    before = big[:, 8:72].clone()
    view = big[:, 8:72]
    runs = []
    for _ in range(2):
        view.copy_(before)
        launch(a, b, view, accumulate=accumulate, sm_budget=sm_budget, config=cfg, path="tma")
        runs.append(view.clone())
    _assert_close(view, a, b, add=before if accumulate else None)
    assert torch.equal(runs[0], runs[1])  # fixed summation order: deterministic
    assert big[:, :8].isnan().all() and big[:, 72:].isnan().all()
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


def test_empty_and_zero_k(gen):
    a, b = _rand(0, 8, dtype=torch.float32, gen=gen), _rand(8, 4, dtype=torch.float32, gen=gen)
    assert matmul(a, b).shape == (0, 4)
    a, b = torch.empty(3, 0, device=DEVICE), torch.empty(0, 5, device=DEVICE)
    assert torch.equal(matmul(a, b), torch.zeros(3, 5, device=DEVICE))
    out = torch.ones(3, 5, device=DEVICE)
    assert torch.equal(matmul(a, b, out=out, accumulate=True), torch.ones(3, 5, device=DEVICE))


# ---------------------------------------------------------------------------------------------
# Validation


def _ok(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: matmul(_ok(4, 8)[0], _ok(8, 4)), r"a must be 2-D \[M, K\]"),
        (lambda: matmul(_ok(4, 8), [[1.0]]), "b must be a torch.Tensor"),
        (lambda: matmul(_ok(4, 8), _ok(7, 4)), "must agree on K"),
        (lambda: matmul(_ok(4, 8, dtype=torch.int32), _ok(8, 4, dtype=torch.int32)), "a.dtype"),
        (lambda: matmul(_ok(4, 8), _ok(8, 4, dtype=torch.float16)), "b.dtype must equal"),
        (lambda: matmul(_ok(4, 8), _ok(8, 4), out=_ok(4, 5)), r"out must have shape \[M, N\]"),
        (
            lambda: matmul(_ok(4, 8), _ok(8, 4), out=_ok(4, 4, dtype=torch.float16)),
            "out.dtype must be",
        ),
        (lambda: matmul(_ok(4, 8), _ok(8, 4), accumulate=True), "accumulate=True needs out"),
        (lambda: matmul(_ok(4, 8), _ok(8, 4), sm_budget=0), "sm_budget must be a positive int"),
        (lambda: matmul(_ok(4, 8), _ok(8, 4), sm_budget=2.0), "sm_budget must be a positive int"),
        (
            lambda: matmul(_ok(4, 8), _ok(8, 4), config={"block_m": 16}),
            "config must be a GemmConfig",
        ),
        (lambda: matmul(_ok(1, 8).expand(4, 8), _ok(8, 4)), "a must not have a zero stride"),
        (lambda: GemmConfig(48, 64, 32), r"block_m must be a power of two"),
        (lambda: GemmConfig(64, 64, 32, num_warps=3), "num_warps must be one of"),
        (lambda: GemmConfig.from_dict({"block_m": 64}), "bad GemmConfig fields"),
        (lambda: tune(0, 4, 4, torch.float32, 1, DEVICE), "m, n, k must be positive"),
    ],
)
def test_validation_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU device rule")
def test_cpu_tensors_need_the_interpreter():
    code = (
        "import os; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import torch; from ficco.kernels import matmul\n"
        "try:\n    matmul(torch.ones(2, 2), torch.ones(2, 2))\n"
        "except ValueError as e:\n    print('ValueError', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert "ValueError a must be on a CUDA device" in res.stdout, res.stderr


def test_import_ficco_does_not_import_triton():
    code = "import sys, ficco; assert 'triton' not in sys.modules, 'triton imported'"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------------------------
# Configuration space


def test_gpu_space_fits_hopper_shared_memory():
    for cfg in GPU_CONFIGS:
        assert cfg.shared_memory_bytes(2, 2) <= HOPPER_SHARED_MEMORY_BYTES, cfg.name
    assert len({cfg.name for cfg in GPU_CONFIGS}) == len(GPU_CONFIGS)  # no duplicates
    assert any(cfg.block_m == 64 for cfg in GPU_CONFIGS)
    assert any(cfg.block_m * cfg.block_n >= 128 * 256 for cfg in GPU_CONFIGS)


def test_pruning():
    small_m = candidate_configs(64, 4096, 4096, 2, 2)
    assert small_m and all(cfg.block_m <= 64 for cfg in small_m)
    big = candidate_configs(8192, 8192, 8192, 2, 2)
    plain = [cfg for cfg in big if not cfg.split_tail]
    assert plain == list(GPU_CONFIGS)
    # 128x256 tiles: 2048 tiles on 132 programs leave 68 in the last wave, too many to split;
    # 128x128: 4096 tiles leave 4, split 8 ways
    assert replace(GPU_CONFIGS[0], split_tail=True) not in big
    assert GemmConfig(128, 128, 64, 8, 4, 8, split_tail=True) in big
    # fp32 operands double the tiles: the biggest configs no longer fit
    assert len(candidate_configs(8192, 8192, 8192, 4, 4)) < len(big)
    assert not suits_shape(GemmConfig(256, 128, 64), 100, 4096, 4096)
    assert candidate_configs(4, 4, 4, 4, 4, interpreter=True)  # never empty
    cfg = GPU_CONFIGS[0]
    assert GemmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_accumulate_fits_shared_memory():
    # accumulate=True reads the C tile back through a second staging buffer: the 4-stage
    # 128x256 config (229,376 bytes) would need 262,144 and fail to launch on Hopper.
    cfg = GPU_CONFIGS[0]
    assert cfg.shared_memory_bytes(2, 2, True) > HOPPER_SHARED_MEMORY_BYTES
    fitted = kernel_paths.fit_shared_memory(cfg, 2, 2, HOPPER_SHARED_MEMORY_BYTES, True)
    assert fitted == replace(cfg, num_stages=3)
    assert fitted.shared_memory_bytes(2, 2, True) <= HOPPER_SHARED_MEMORY_BYTES
    small = GemmConfig(64, 128, 64, 8, 5, 4)
    assert kernel_paths.fit_shared_memory(small, 2, 2, HOPPER_SHARED_MEMORY_BYTES, True) == small


def test_fp32_configs_fit_shared_memory_without_accumulate():
    # fp32 tiles are twice bf16's: the 4-stage 128x128x64 config needs 327,680 bytes even
    # without accumulating (an untuned heuristic config failed to launch so on an H100)
    cfg = GemmConfig(128, 128, 64, 8, 4, 8)
    assert cfg.shared_memory_bytes(4, 4, False) > HOPPER_SHARED_MEMORY_BYTES
    fitted = kernel_paths.fit_shared_memory(cfg, 4, 4, HOPPER_SHARED_MEMORY_BYTES, False)
    assert fitted.num_stages < cfg.num_stages
    assert fitted.shared_memory_bytes(4, 4, False) <= HOPPER_SHARED_MEMORY_BYTES


# ---------------------------------------------------------------------------------------------
# Tuning cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))
    tuning_mod.clear_memory()
    yield tmp_path
    tuning_mod.clear_memory()


def _scripted_timer(times):
    it = iter(times)
    return lambda fn: next(it)


def _never_timer(fn):
    raise AssertionError("a cached shape must not be timed again")


def test_tune_cache_round_trip(cache_dir):
    configs = INTERPRETER_CONFIGS[:2]
    m, n, k = 40, 24, 32
    best = tune(
        m, n, k, torch.float32, 3, DEVICE, configs=configs, timer=_scripted_timer([5.0, 1.0])
    )
    assert best == configs[1]  # the faster one
    path = cache_path()
    assert path == cache_dir / "gemm_tuning.json"
    data = json.loads(path.read_text())
    assert data["format"] == 1 and len(data["entries"]) == 1
    key_str, entry = next(iter(data["entries"].items()))
    key = TuningKey.for_problem(m, n, k, torch.float32, 3, torch.device(DEVICE))
    assert key_str == str(key)
    import triton

    for part in (
        key.device_name,
        f"triton={triton.__version__}",
        "float32",
        "m=40,n=24,k=32",
        "sm=3",
    ):
        assert part in key_str
    assert entry["config"] == configs[1].to_dict()
    assert entry["timings_ms"] == {configs[0].name: 5.0, configs[1].name: 1.0}
    assert not [p for p in cache_dir.iterdir() if p.name != "gemm_tuning.json"]  # no temp files
    # a fresh process (memory layer cleared) reads it back and does not re-time
    tuning_mod.clear_memory()
    assert cached_config(key) == configs[1]
    assert (
        tune(m, n, k, torch.float32, 3, DEVICE, configs=configs, timer=_never_timer) == configs[1]
    )
    # another SM budget is another key
    other = tune(
        m, n, k, torch.float32, 2, DEVICE, configs=configs, timer=_scripted_timer([1.0, 2.0])
    )
    assert other == configs[0]
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_tune_default_space_and_matmul_use(cache_dir, gen):
    # Real interpreter timings over the interpreter space; matmul then reads the cache.
    best = tune(20, 36, 16, torch.float16, 2, DEVICE)
    assert best in candidate_configs(20, 36, 16, 2, 2, interpreter=True)
    a, b = _rand(20, 16, dtype=torch.float16, gen=gen), _rand(16, 36, dtype=torch.float16, gen=gen)
    _assert_close(matmul(a, b, sm_budget=2), a, b)


def test_corrupt_cache_is_ignored_with_a_warning(cache_dir):
    cache_path().write_text('{"format": 1, "entries": {"x": ')  # truncated write
    configs = INTERPRETER_CONFIGS[:1]
    with pytest.warns(UserWarning, match="corrupt GEMM tuning cache"):
        best = tune(16, 16, 16, torch.float32, 1, DEVICE, configs=configs, timer=lambda fn: 1.0)
    assert best == configs[0]
    assert len(json.loads(cache_path().read_text())["entries"]) == 1  # rewritten, valid


def test_bad_cache_entry_is_ignored_with_a_warning(cache_dir):
    key = TuningKey.for_problem(16, 16, 16, torch.float32, 1, torch.device(DEVICE))
    bad = {"format": 1, "entries": {str(key): {"config": {"block_m": 48}}}}
    cache_path().write_text(json.dumps(bad))
    with pytest.warns(UserWarning, match="ignoring bad entry"):
        assert cached_config(key) is None
