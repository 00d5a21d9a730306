"""ficco.kernels.scaled (the persistent FP8 GEMM) and the fused kernel with FP8 operands, under
the Triton CPU interpreter where there is no GPU.

The interpreter computes fp8 `tl.dot` on the same bits a GPU reads, and takes fp8 tensor
descriptors (Triton 3.9), so both kernels are checked against ficco's one FP8 GEMM definition
(`ficco.kernels.scaled_mm.scaled_matmul`, upcasting on CPU) on small ragged shapes, every
scale pair, e4m3 and e5m2. Both compute in fp32 and round once to bf16, so they may differ by
accumulation order only: at most one bf16 rounding step of the result's magnitude.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import persistent  # noqa: E402
from ficco.kernels.configs import GemmConfig  # noqa: E402
from ficco.kernels.fused import FusedChunkViews, FusedGemm  # noqa: E402
from ficco.kernels.scaled import (  # noqa: E402
    prepare_operands,
    random_operands,
    scaled_matmul,
    tune_scaled,
)
from ficco.kernels.scaled_configs import (  # noqa: E402
    FP8_GPU_CONFIGS,
    FP8_INTERPRETER_CONFIGS,
    FP8_SMALLEST,
    scaled_candidate_configs,
)
from ficco.kernels.scaled_mm import scaled_matmul as reference_matmul  # noqa: E402
from ficco.validate import InputError  # noqa: E402
from ficco.verdict import Unavailable  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the GPU runs tests/gpu/test_kernels_scaled_gpu.py"
)
ROOT = Path(__file__).resolve().parents[1]
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _scales(kind: str, sa: torch.Tensor, sb: torch.Tensor):
    """(a_scale, b_scale) of one granularity pair; per-tensor values of the data's size."""
    a_scale = sa if kind[0] == "row" else sa.amax().reshape(1, 1)
    b_scale = sb if kind[1] == "col" else sb.amax().reshape(1)
    return a_scale, b_scale


def _close(out: torch.Tensor, want: torch.Tensor) -> None:
    # one bf16 step (2^-7 relative) of the largest magnitude: accumulation order only
    bound = want.float().abs().max() * 2**-7
    assert (out.float() - want.float()).abs().max() <= bound


PAIRS = [("row", "col"), ("row", "tensor"), ("tensor", "col"), ("tensor", "tensor")]


@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "/".join(p))
def test_scaled_matmul_equals_the_emulation_on_ragged_shapes(dtype, pair):
    a, b, sa, sb, _ = random_operands(45, 72, 80, dtype, "cpu", seed=3)
    a_scale, b_scale = _scales(pair, sa, sb)
    before = persistent.LAUNCH_COUNTS["scaled"]
    for config in FP8_INTERPRETER_CONFIGS:  # ragged tiles in M; N tiles; several programs
        out = scaled_matmul(a, b, a_scale, b_scale, sm_budget=3, config=config)
        _close(out, reference_matmul(a, b, a_scale, b_scale))
    assert persistent.LAUNCH_COUNTS["scaled"] == before + len(FP8_INTERPRETER_CONFIGS)


def test_scaled_matmul_writes_a_row_slice_from_either_layout_of_b():
    a, b, sa, sb, _ = random_operands(40, 48, 64, torch.float8_e4m3fn, "cpu", seed=5)
    want = reference_matmul(a, b, sa, sb)
    for b_view, k_major in ((b, True), (b.contiguous(), False)):  # row-major: taken as it is
        ops = prepare_operands(a, b_view, sa, sb, torch.bfloat16, None)
        assert ops.b_k_major is k_major and ops.b.data_ptr() == b_view.data_ptr()
        big = torch.full((72, 48), 7.0, dtype=torch.bfloat16)
        view = big[16:56]
        got = scaled_matmul(a, b_view, sa, sb, out=view, config=FP8_INTERPRETER_CONFIGS[0])
        assert got.data_ptr() == view.data_ptr()
        _close(view, want)
        assert (big[:16] == 7.0).all() and (big[56:] == 7.0).all()


def test_scaled_matmul_refuses_what_it_cannot_take():
    a, b, sa, sb, _ = random_operands(32, 48, 64, torch.float8_e4m3fn, "cpu", seed=7)
    with pytest.raises(InputError, match="a_scale"):
        scaled_matmul(a, b, sa[:5], sb)  # neither one scale nor one per row
    with pytest.raises(InputError, match="b_scale"):
        scaled_matmul(a, b, sa, -sb)
    with pytest.raises(InputError, match="fp8"):
        scaled_matmul(a.float(), b, sa, sb)
    # a base 8 bytes past 16-byte alignment: TMA cannot load it, and the refusal says why
    storage = torch.empty(32 * 64 + 8, dtype=torch.uint8).view(torch.float8_e4m3fn)
    shifted = storage[8:].view(32, 64)
    shifted.copy_(a)
    with pytest.raises(Unavailable, match="16-byte aligned"):
        scaled_matmul(shifted, b, sa, sb)
    # K = 40: a's rows are 40 bytes apart, not a multiple of 16
    a40, b40, sa40, sb40, _ = random_operands(32, 48, 40, torch.float8_e4m3fn, "cpu", seed=7)
    with pytest.raises(Unavailable, match="row stride"):
        scaled_matmul(a40, b40, sa40, sb40)
    out = torch.empty(32, 48, dtype=torch.float16)
    with pytest.raises(ValueError, match="out"):
        scaled_matmul(a, b, sa, sb, out=out)


def test_without_the_interpreter_a_cpu_tensor_is_refused_naming_the_device():
    code = (
        "import torch\n"
        "from ficco.kernels.scaled import random_operands, scaled_matmul\n"
        "from ficco.verdict import Unavailable\n"
        "a, b, sa, sb, _ = random_operands(32, 32, 32, torch.float8_e4m3fn, 'cpu', seed=1)\n"
        "try:\n"
        "    scaled_matmul(a, b, sa, sb)\n"
        "except Unavailable as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert "refused: the Triton FP8 GEMM runs on CUDA devices" in got.stdout, got.stderr


def test_the_tuner_checks_every_candidate_and_keeps_only_correct_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))
    from ficco.kernels import tuning

    tuning.clear_memory()
    best = tune_scaled(48, 64, 64, torch.float8_e4m3fn, 3, "cpu")
    assert best in FP8_INTERPRETER_CONFIGS
    key = tuning.TuningKey.for_problem(48, 64, 64, torch.float8_e4m3fn, 3, torch.device("cpu"))
    entry = tuning.cache_entry(key)
    assert "float8_e4m3fn" in str(key)
    assert set(entry["timings_ms"]) == {c.name for c in FP8_INTERPRETER_CONFIGS}
    tuning.clear_memory()


def test_fp8_space_is_its_own_and_fits_hopper_shared_memory():
    from ficco.kernels.configs import GPU_CONFIGS, HOPPER_SHARED_MEMORY_BYTES

    assert not set(FP8_GPU_CONFIGS) & set(GPU_CONFIGS)
    for cfg in FP8_GPU_CONFIGS:
        assert cfg.block_k >= 128  # fp8 wgmma K steps of 32; tiles of 128 bytes per row
        assert cfg.shared_memory_bytes(1, 2) <= HOPPER_SHARED_MEMORY_BYTES, cfg.name
    # pruning as bf16's: a 256-row problem takes no 256-row tile
    assert all(c.block_m <= 256 for c in scaled_candidate_configs(256, 4096, 4096))
    small = scaled_candidate_configs(64, 4096, 4096)
    assert small and all(c.block_m == 64 for c in small)
    assert scaled_candidate_configs(16, 16, 16) == [FP8_SMALLEST]
    # two programs per SM: each within half an SM's shared memory, only on a full budget
    pairs = [c for c in scaled_candidate_configs(4096, 4096, 4096) if c.programs_per_sm == 2]
    assert pairs and all(2 * (c.shared_memory_bytes(1, 2) + 1024) <= 233_472 for c in pairs)
    assert all(
        c.programs_per_sm == 1
        for c in scaled_candidate_configs(4096, 4096, 4096, full_budget=False)
    )


def test_fused_fp8_one_row_chunks_beside_per_row_ones():
    # a chunk of one row carries a [1, 1] scale: per row and per tensor at once
    a, b, sa, sb, _ = random_operands(7, 32, 64, torch.float8_e4m3fn, "cpu", seed=13)
    out = torch.full((7, 32), float("nan"), dtype=torch.bfloat16)
    bounds = ((0, 1), (1, 4), (4, 5), (5, 7))
    views = [FusedChunkViews(a[lo:hi], out[lo:hi], a_scale=sa[lo:hi]) for lo, hi in bounds]
    gemm = FusedGemm(
        views, b, sm_budget=2, timeout_s=10.0, b_scale=sb, config=GemmConfig(32, 32, 32, 4, 1, 4)
    )
    assert gemm.scales.rowwise
    gemm()
    _close(out, reference_matmul(a, b, sa, sb))


@pytest.mark.parametrize("path", ["tma", "ptr"])
@pytest.mark.parametrize("rowwise", [True, False], ids=["row/col", "tensor/tensor"])
@pytest.mark.parametrize("b_layout", ["col", "row"])
def test_fused_fp8_chunks_equal_the_emulation(path, rowwise, b_layout):
    a, b, sa, sb, _ = random_operands(50, 48, 96, torch.float8_e5m2, "cpu", seed=11)
    if b_layout == "row":
        b = b.contiguous()
    a_scale, b_scale = (sa, sb) if rowwise else (sa.amax().reshape(1, 1), sb.amax().reshape(1, 1))
    out = torch.full((50, 48), float("nan"), dtype=torch.bfloat16)
    flags = torch.ones(2, dtype=torch.int32)  # preset: both chunks ready
    views = [
        FusedChunkViews(
            a[lo:hi],
            out[lo:hi],
            wait=flags[i : i + 1],
            a_scale=a_scale[lo:hi] if rowwise else a_scale,
        )
        for i, (lo, hi) in enumerate(((0, 32), (32, 50)))
    ]
    gemm = FusedGemm(
        views, b, sm_budget=3, timeout_s=10.0, path=path, b_scale=b_scale,
        config=GemmConfig(32, 32, 32, 4, 1, 4),
    )  # fmt: skip
    gemm()
    _close(out, reference_matmul(a, b, a_scale, b_scale))


def test_fused_refuses_scales_that_do_not_fit():
    a, b, sa, sb, _ = random_operands(32, 32, 64, torch.float8_e4m3fn, "cpu", seed=2)
    out = torch.empty(32, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="need b_scale"):
        FusedGemm([FusedChunkViews(a, out, a_scale=sa)], b, sm_budget=2, timeout_s=5.0)
    with pytest.raises(ValueError, match="one granularity"):
        views = [
            FusedChunkViews(a[:16], out[:16], a_scale=sa[:16]),
            FusedChunkViews(a[16:], out[16:], a_scale=sa[:1]),
        ]
        FusedGemm(views, b, sm_budget=2, timeout_s=5.0, b_scale=sb)
    x = torch.randn(32, 64)
    with pytest.raises(ValueError, match="scales are for fp8"):
        FusedGemm(
            [FusedChunkViews(x, out.float(), a_scale=sa)], torch.randn(64, 32), sm_budget=2,
            timeout_s=5.0,
        )  # fmt: skip


def test_bench_script_lists_both_shape_sets_without_a_gpu():
    got = subprocess.run(
        [sys.executable, "scripts/bench_fp8_gemm.py", "--out", "/nonexistent", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert got.returncode == 0, got.stderr
    last = got.stdout.strip().splitlines()[-1]
    assert last.startswith("56 shapes (40 full, 16 chunk only)"), last
    first_two = got.stdout.splitlines()[:2]
    assert "full" in first_two[0] and "full" not in first_two[1].split()[3]


def test_bench_script_runs_its_loop_under_the_interpreter(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))  # in this process: its imports are done
    import bench_fp8_gemm

    assert bench_fp8_gemm.main(["--out", str(tmp_path), "--interpret"]) == 0
    result = json.loads((tmp_path / "fp8_gemm.json").read_text())
    assert [(r["M"], r["N"], r["K"]) for r in result["rows"]] == [(64, 80, 64), (64, 48, 32)]
    for row in result["rows"]:
        assert row["rel_errors"] and max(row["rel_errors"].values()) <= 1e-2
        assert row["fused_rel_error"] <= 1e-2 and not row["rejected"]
    assert result["environment"]["git_commit"]
    tuning = json.loads((tmp_path / "fp8_gemm_tuning.json").read_text())
    assert len(tuning["entries"]) == 2


def test_both_kernels_compile_to_fp8_wgmma_for_sm90_and_lagged_adds_wait_on_no_wgmma():
    from offline_sm90 import offline_compile

    lagged = next(c for c in FP8_GPU_CONFIGS if c.lagged_promotion)
    kernels = offline_compile("compile_scaled_sm90.py", "--config", lagged.name)["kernels"]
    assert list(kernels) == [lagged.name]
    for name, found in kernels.items():
        for kernel in ("scaled", "scaled_b_row_major", "fused"):
            assert any(".e4m3.e4m3" in w for w in found[kernel]["wgmma"]), (name, kernel, found)
        for kernel in ("scaled", "scaled_b_row_major"):  # the adds overlap the next wgmma:
            ptxas = found[kernel]["ptxas"]  # ptxas neither serializes nor adds waits
            assert ptxas is None or (ptxas["notes"] == [] and ptxas["spill_bytes"] == 0), ptxas


def test_bench_tuning_entries_carry_the_faster_timed_config():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_fp8_gemm

    pick, faster = FP8_INTERPRETER_CONFIGS
    row = {
        "M": 64, "N": 96, "K": 128, "sm_budget": 3, "config": pick.name,
        "config_fields": pick.to_dict(), "best_config": faster.name,
        "best_config_fields": faster.to_dict(), "persistent_best_ms": 0.5,
        "tune_timings_ms": {pick.name: 0.4, faster.name: 0.6}, "tune_failures": {},
    }  # fmt: skip
    entries = bench_fp8_gemm.tuning_entries([row], "NVIDIA H100", "3.6.0")
    ((key, entry),) = entries.items()
    assert key == "NVIDIA H100|triton=3.6.0|float8_e4m3fn|m=64,n=96,k=128|sm=3"
    assert GemmConfig.from_dict(entry["config"]) == faster


def test_check_values_false_reads_no_scale_but_still_checks_shapes():
    a, b, sa, sb, _ = random_operands(32, 48, 64, torch.float8_e4m3fn, "cpu", seed=9)
    nan_scales = torch.full_like(sa, float("nan"))  # rows whose scales have not landed yet
    with pytest.raises(InputError, match="finite and positive"):
        scaled_matmul(a, b, nan_scales, sb)
    out = scaled_matmul(a, b, nan_scales, sb, check_values=False)
    assert torch.isnan(out.float()).all()  # computed, not refused: verification catches it
    with pytest.raises(InputError, match="a_scale"):
        scaled_matmul(a, b, sa[:3], sb, check_values=False)


def test_two_programs_per_sm_on_a_full_budget_only():
    from ficco.kernels.scaled import programs

    cpu = torch.device("cpu")  # the interpreter's device: 4 SMs
    two = GemmConfig(32, 32, 32, 4, 1, 4, programs_per_sm=2)
    assert programs(two, 4, cpu) == 8 and programs(two, 3, cpu) == 3
    assert programs(FP8_INTERPRETER_CONFIGS[0], 4, cpu) == 4
    a, b, sa, sb, _ = random_operands(96, 96, 64, torch.float8_e4m3fn, "cpu", seed=17)
    want = reference_matmul(a, b, sa, sb)
    _close(scaled_matmul(a, b, sa, sb, sm_budget=4, config=two), want)
    out = torch.full((96, 96), float("nan"), dtype=torch.bfloat16)
    views = [
        FusedChunkViews(a[lo : lo + 48], out[lo : lo + 48], a_scale=sa[lo : lo + 48])
        for lo in (0, 48)
    ]
    gemm = FusedGemm(views, b, sm_budget=4, timeout_s=10.0, b_scale=sb, config=two)
    assert gemm.grid == (8,)
    gemm()
    _close(out, want)


def test_a_shipped_fp8_entry_answers_where_the_cache_has_none(tmp_path, monkeypatch):
    from ficco.kernels import scaled, tuning

    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path / "cache"))  # an empty cache
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "1")
    tuning.clear_memory()
    card = tmp_path / "schedules" / "card"
    card.mkdir(parents=True)
    shipped = FP8_INTERPRETER_CONFIGS[1]
    key = tuning.TuningKey.for_problem(40, 48, 64, torch.float8_e4m3fn, 3, torch.device("cpu"))
    entry = {"config": shipped.to_dict(), "name": shipped.name}
    (card / "fp8_gemm_tuning.json").write_text(
        json.dumps({"format": 1, "entries": {str(key): entry}})
    )
    monkeypatch.setattr(tuning, "SHIPPED_TUNING", tmp_path / "schedules")
    tuning.clear_memory()

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuned")

    monkeypatch.setattr(scaled, "tune_scaled", no_tuning)
    try:
        assert scaled.scaled_config_for(40, 48, 64, torch.float8_e4m3fn, 3, "cpu") == shipped
        # another shape has no entry: tuned (here: refused by the stand-in)
        with pytest.raises(AssertionError, match="tuned"):
            scaled.scaled_config_for(40, 48, 128, torch.float8_e4m3fn, 3, "cpu")
    finally:
        tuning.clear_memory()


@pytest.mark.parametrize("k", [128, 96], ids=["whole-segments", "ragged-segment"])
def test_promoting_every_few_k_steps_computes_the_same_product(k):
    a, b, sa, sb, _ = random_operands(40, 64, k, torch.float8_e4m3fn, "cpu", seed=19)
    config = GemmConfig(32, 32, 32, 4, 1, 4, promote_every=2)
    assert config.name.endswith("_pe2")
    _close(scaled_matmul(a, b, sa, sb, sm_budget=3, config=config), reference_matmul(a, b, sa, sb))
    # offered only where asked for: the default space promotes after every K step
    assert all(c.promote_every == 1 for c in scaled_candidate_configs(4096, 4096, 4096))
    assert any(
        c.promote_every > 1 for c in scaled_candidate_configs(4096, 4096, 4096, promote_every=4)
    )


@pytest.mark.parametrize("k", [96, 128], ids=["odd-steps", "even-steps"])
def test_lagged_promotion_computes_the_same_product(k):
    a, b, sa, sb, _ = random_operands(40, 64, k, torch.float8_e4m3fn, "cpu", seed=23)
    config = GemmConfig(32, 32, 32, 4, 1, 4, lagged_promotion=True)
    assert config.name.endswith("_lag")
    want = reference_matmul(a, b, sa, sb)
    for b_view in (b, b.contiguous()):  # K-major and row-major B
        _close(scaled_matmul(a, b_view, sa, sb, sm_budget=3, config=config), want)


def test_promotion_every_128_products_and_what_lagging_refuses():
    from ficco.kernels.scaled import PROMOTION_K, imprecise_acc, lagged

    assert PROMOTION_K == 128
    assert imprecise_acc(GemmConfig(128, 128, 256, 8, 3, 8), False) == 128  # twice a step
    assert imprecise_acc(GemmConfig(128, 128, 64, 8, 3, 8), False) == 64
    assert imprecise_acc(GemmConfig(128, 128, 128, 8, 3, 8), True) is None  # never
    long_step = GemmConfig(128, 128, 256, 8, 2, 8, lagged_promotion=True)
    with pytest.raises(ValueError, match="lagged_promotion needs block_k <= 128"):
        lagged(long_step, False)
    assert lagged(GemmConfig(128, 128, 128, 8, 2, 8, lagged_promotion=True), True) is False
    with pytest.raises(ValueError, match="lagged_promotion takes neither"):
        GemmConfig(128, 128, 128, 8, 2, 8, promote_every=2, lagged_promotion=True)
    # a stage holds a K step pair
    pair = GemmConfig(128, 128, 128, 8, 2, 8, lagged_promotion=True)
    assert pair.shared_memory_bytes(1, 2) == 2 * 2 * 2 * 128 * 128 + 128 * 128 * 2
    # the space's lagged tiles: K steps of 128, three fp32 tiles of <= 64 registers a thread
    offered = [c for c in FP8_GPU_CONFIGS if c.lagged_promotion]
    assert offered
    for cfg in offered:
        assert cfg.block_k <= PROMOTION_K
        assert cfg.block_m * cfg.block_n // (32 * cfg.num_warps) <= 64, cfg.name


def test_the_fused_kernel_takes_a_lagged_tile_as_single_steps_in_the_same_memory():
    from ficco.kernels.scaled_fused import unlagged

    lag = next(c for c in FP8_GPU_CONFIGS if c.lagged_promotion)
    plain = unlagged(lag)
    assert not plain.lagged_promotion and plain.num_stages == 2 * lag.num_stages
    assert plain.shared_memory_bytes(1, 2) == lag.shared_memory_bytes(1, 2)
    assert unlagged(FP8_GPU_CONFIGS[0]) is FP8_GPU_CONFIGS[0]


def test_every_dtype_shares_the_untuned_fused_tiles():
    from ficco.kernels.fused_configs import fused_config, pointer_config, untuned_fused_config
    from ficco.kernels.scaled_fused import fused_scaled_config

    for device, path in ((torch.device("cpu"), "tma"), (torch.device("cuda", 0), "ptr")):
        want = untuned_fused_config(512, 256, 128, 4, device, path)
        assert want is not None
        got = fused_scaled_config(512, 256, 128, 4, torch.float8_e4m3fn, 3, device, path)
        assert got == want == fused_config(512, 256, 128, 4, torch.bfloat16, 3, device, path)
    assert want == pointer_config(128)  # the largest chunk's rows
    assert untuned_fused_config(512, 256, 128, 4, torch.device("cuda", 0), "tma") is None


def test_accumulation_probe_names_every_variant_and_its_nearest_match():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_fp8_gemm

    found = bench_fp8_gemm.accumulation_probe("cpu", 2, (32, 32, 128))
    names = {name for name, _, _ in bench_fp8_gemm.PROBE_CONFIGS}
    assert names <= set(found["errors"]) and not found["failures"]
    assert all(0 < e < 1e-3 for e in found["errors"].values())  # fp32 output, exact inputs
    assert found["scaled_mm_matches"] in names


def test_a_one_warpgroup_128_row_tile_runs_as_two_64_row_dots():
    from ficco.kernels.scaled import split_rows

    config = GemmConfig(128, 32, 32, 4, 1, 4)
    assert split_rows(config, False) and not split_rows(config, True)  # fast: one dot
    assert not split_rows(GemmConfig(128, 128, 128, 8, 4, 8), False)  # two warpgroups
    assert not split_rows(GemmConfig(128, 32, 32, 4, 1, 4, lagged_promotion=True), False)
    # ragged: the second tile's top half partly inside M, its bottom half past it
    a, b, sa, sb, _ = random_operands(160, 48, 96, torch.float8_e4m3fn, "cpu", seed=29)
    want = reference_matmul(a, b, sa, sb)
    for b_view in (b, b.contiguous()):  # K-major and row-major B
        _close(scaled_matmul(a, b_view, sa, sb, sm_budget=3, config=config), want)
