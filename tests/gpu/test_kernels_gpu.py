"""ficco.kernels on a CUDA GPU: bf16 numerics with tuned configurations, and the TMA path.

Skipped without CUDA. Tolerances come from the data: the relative error of torch.matmul in
the same dtype against an fp32 reference, times two, and never above the 1e-2 bar.
"""

from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ficco.kernels import (  # noqa: E402
    GPU_CONFIGS,
    GemmConfig,
    cached_config,
    default_sm_budget,
    matmul,
    select_path,
    tma_available,
    tune,
)
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels import tuning as tuning_mod  # noqa: E402
from ficco.kernels.configs import split_plan  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", torch.cuda.current_device())
HOPPER = tma_available(DEV)
# A few configurations of the space keep compile time (~1 s each) small here; the full space
# is exercised by scripts/bench_gemm.py.
TUNE_CONFIGS = [GPU_CONFIGS[0], GemmConfig(128, 128, 64, 8, 4, 8), GemmConfig(64, 128, 64, 8, 5, 4)]


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))
    tuning_mod.clear_memory()
    yield
    tuning_mod.clear_memory()


@pytest.fixture
def gen():
    return torch.Generator(device=DEV).manual_seed(7)


def _rand(*shape, gen, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32).to(dtype)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref).norm() / ref.norm())


def _check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, add=None) -> float:
    ref = a.float() @ b.float()
    base = a @ b
    if add is not None:
        ref = ref + add.float()
        base = base + add
    tol = min(2 * _rel(base, ref) + 1e-4, 1e-2)
    err = _rel(out, ref)
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g} (torch: {_rel(base, ref):.3g})"
    return err


def _launches(path: str) -> int:
    return kernel_paths.LAUNCH_COUNTS[path]


def _run_with_late_chunks(kernel, late, arriving, flags):
    """Run the compiled fused ``kernel`` while a side stream lands each chunk of ``late`` late
    (its rows from ``arriving``) and then sets its flag ``flags[i]``."""
    kernel.compile()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i, chunk in enumerate(late):
            torch.cuda._sleep(2_000_000)
            chunk.a.copy_(arriving[i])
            flags[i : i + 1].fill_(1)
    kernel()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    kernel.raise_on_timeout("test")


@pytest.mark.parametrize("mnk", [(1024, 3072, 4096), (256, 4096, 2048), (1000, 3000, 520)])
def test_bf16_tuned(mnk, gen):
    m, n, k = mnk
    cfg = tune(m, n, k, torch.bfloat16, None, DEV, configs=TUNE_CONFIGS)
    assert cfg in TUNE_CONFIGS
    budget = default_sm_budget(DEV)
    key = tuning_mod.TuningKey.for_problem(m, n, k, torch.bfloat16, budget, DEV)
    assert cached_config(key) == cfg
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    before = _launches("tma")
    matmul(a, b, out)  # the tuned configuration, from the cache
    _check(out, a, b)
    if HOPPER:
        assert select_path(a, b, out) == "tma"
        assert _launches("tma") == before + 1, "the TMA kernel did not run"


@pytest.mark.skipif(not HOPPER, reason="TMA needs sm_90+ and Triton host tensor descriptors")
def test_tma_kernel_uses_tma_and_wgmma(gen):
    a, b = _rand(512, 512, gen=gen), _rand(512, 1024, gen=gen)
    matmul(a, b, config=GPU_CONFIGS[0])
    ttgir = kernel_paths.LAST_COMPILED["tma"].asm["ttgir"]
    assert "async_tma_copy_global_to_local" in ttgir  # TMA loads
    assert "async_tma_copy_local_to_global" in ttgir  # TMA stores
    assert "warp_group_dot" in ttgir  # wgmma


@pytest.mark.parametrize("path", ["tma", "ptr"])
@pytest.mark.parametrize("cfg", [GPU_CONFIGS[0], GemmConfig(64, 128, 64, 8, 5, 4)], ids=str)
def test_views_accumulate_and_transposed_b(path, cfg, gen):
    if path == "tma" and not HOPPER:
        pytest.skip("no TMA here")
    m, n, k = 777, 1000, 1096
    a = _rand(m, k, gen=gen)
    w = _rand(n, k, gen=gen)  # b = w^T [K, N], column-major
    big = torch.full((m + 64, 2048), float("nan"), device=DEV, dtype=torch.bfloat16)
    view = big[32 : 32 + m, 512 : 512 + n]  # row and column slice; 16-byte aligned
    kernel_paths.launch(a, w.t(), view, accumulate=False, sm_budget=132, config=cfg, path=path)
    _check(view, a, w.t())
    outside = big.clone()
    outside[32 : 32 + m, 512 : 512 + n] = 0
    assert outside.isnan().sum().item() == big.numel() - m * n
    before = view.clone()
    kernel_paths.launch(a, w.t(), view, accumulate=True, sm_budget=132, config=cfg, path=path)
    _check(view, a, w.t(), add=before)


@pytest.mark.skipif(not HOPPER, reason="the split tail is a TMA-kernel feature")
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    "mnk, sm_budget",
    [((1024, 5120, 8192), 132), ((256, 3072, 4096), 132), ((640, 1536, 768), 7)],
)
def test_split_tail(mnk, sm_budget, accumulate, gen):
    m, n, k = mnk
    cfg = replace(GPU_CONFIGS[0], split_tail=True)
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    assert split_plan(tiles, sm_budget, -(-k // cfg.block_k)) is not None
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    before = _rand(m, n, gen=gen)
    out = before.clone()
    runs = []
    for _ in range(3):  # a race would show as run-to-run differences
        out.copy_(before)
        kernel_paths.launch(
            a, b, out, accumulate=accumulate, sm_budget=sm_budget, config=cfg, path="tma"
        )
        runs.append(out.clone())
    _check(out, a, b, add=before if accumulate else None)
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


@pytest.mark.parametrize("sm_budget", [1, 7, 66, 132, 100_000])
def test_sm_budgets(sm_budget, gen):
    a, b = _rand(640, 1536, gen=gen), _rand(1536, 768, gen=gen)
    out = matmul(a, b, sm_budget=sm_budget, config=GemmConfig(128, 128, 64, 8, 4, 8))
    _check(out, a, b)


def test_misaligned_view_falls_back_with_a_warning(gen):
    a = _rand(257, 65, gen=gen)  # 130-byte rows: TMA cannot describe them
    b = _rand(65, 33, gen=gen)
    kernel_paths._warned.clear()
    before = _launches("ptr")
    with pytest.warns(RuntimeWarning, match="pointer kernel"):
        out = matmul(a, b, config=GemmConfig(64, 64, 32, 8, 3, 4))
    assert _launches("ptr") == before + 1
    _check(out, a, b)


def test_fp16_and_fp32_output(gen):
    a, b = (
        _rand(512, 384, gen=gen, dtype=torch.float16),
        _rand(384, 640, gen=gen, dtype=torch.float16),
    )
    _check(matmul(a, b, config=GemmConfig(128, 128, 64, 8, 4, 8)), a, b)
    out32 = torch.zeros(512, 640, device=DEV)
    matmul(a, b, out32, accumulate=True, config=GemmConfig(128, 128, 64, 8, 4, 8))
    assert _rel(out32, a.float() @ b.float()) < 1e-5


# --- the fused flag-waiting GEMM (ficco.kernels.fused) ----------------------------------------


def _fused_case(gen, b_col_major: bool):
    """Three chunks from two buffers (one ragged), the middle one flagged and signalling."""
    from ficco.kernels.fused import FusedChunkViews

    k, n = 1096, 1000
    local = _rand(300, k, gen=gen)
    gathered = _rand(400, k, gen=gen)
    b = _rand(n, k, gen=gen).t() if b_col_major else _rand(k, n, gen=gen)
    out = torch.full((700, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    flags = torch.zeros(4, dtype=torch.int32, device=DEV)
    chunks = [
        FusedChunkViews(local, out[:300]),
        FusedChunkViews(gathered[:256], out[300:556], wait=flags[0:1], signal=flags[2:3]),
        FusedChunkViews(gathered[256:], out[556:], wait=flags[1:2]),
    ]
    return chunks, b, out, flags, torch.cat([local, gathered])


@pytest.mark.parametrize("b_col_major", [False, True])
@pytest.mark.parametrize(
    "path, cfg",
    [
        ("tma", GPU_CONFIGS[0]),
        ("tma", GemmConfig(64, 128, 64, 8, 5, 4)),
        ("tma", GemmConfig(128, 128, 64, 8, 4, 8)),
        ("ptr", GemmConfig(128, 128, 64, 8, 3, 8)),
    ],
    ids=str,
)
def test_fused_gemm_paths_match_matmul(path, cfg, b_col_major, gen):
    from ficco.kernels.fused import FusedGemm

    if path == "tma" and not HOPPER:
        pytest.skip("no TMA here")
    chunks, b, out, flags, a = _fused_case(gen, b_col_major)
    kernel = FusedGemm(chunks, b, sm_budget=132, timeout_s=5.0, config=cfg, path=path)
    assert kernel.path == path and kernel.b_col_major == (path == "tma" and b_col_major)
    flags[:2] = 1
    before = _launches(f"fused_{path}")
    kernel()
    torch.cuda.synchronize()
    kernel.raise_on_timeout("test")
    assert _launches(f"fused_{path}") == before + 1
    _check(out, a, b)
    assert flags[2].item() == 1  # the signalled chunk's last tile set its flag


@pytest.mark.skipif(not HOPPER, reason="the TMA path's flag wait")
def test_fused_tma_reads_a_chunk_only_after_its_flag(gen):
    from ficco.kernels.fused import FusedGemm

    chunks, b, out, flags, a = _fused_case(gen, False)
    arriving = chunks[1].a.clone(), chunks[2].a.clone()
    chunks[1].a.fill_(float("nan"))  # not there yet
    chunks[2].a.fill_(float("nan"))
    kernel = FusedGemm(chunks, b, sm_budget=120, timeout_s=10.0)  # default path and tile
    assert kernel.path == "tma"
    _run_with_late_chunks(kernel, chunks[1:], arriving, flags)
    _check(out, a, b)  # a: the chunks' rows as they arrived


@pytest.mark.skipif(not HOPPER, reason="the TMA path's host descriptors")
@pytest.mark.parametrize("cfg", [GPU_CONFIGS[0], GemmConfig(128, 128, 64, 8, 4, 8)], ids=str)
def test_fused_host_descriptors_wait_and_signal(cfg, gen):
    """Every chunk in one buffer on 128-row boundaries (the last ragged, ending it): A and C
    through host-built descriptors; late chunks read only after their flags, one signals."""
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    k, n = 1096, 1000
    a = _rand(700, k, gen=gen)
    b = _rand(k, n, gen=gen)
    out = torch.full((700, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    flags = torch.zeros(4, dtype=torch.int32, device=DEV)
    rows = [(0, 256), (256, 512), (512, 700)]
    chunks = [
        FusedChunkViews(a[0:256], out[0:256]),
        FusedChunkViews(a[256:512], out[256:512], wait=flags[0:1], signal=flags[2:3]),
        FusedChunkViews(a[512:700], out[512:700], wait=flags[1:2]),
    ]
    arriving = [a[lo:hi].clone() for lo, hi in rows[1:]]
    for chunk in chunks[1:]:
        chunk.a.fill_(float("nan"))  # not there yet
    kernel = FusedGemm(chunks, b, sm_budget=120, timeout_s=10.0, config=cfg)
    assert kernel.path == "tma" and kernel.host is not None
    _run_with_late_chunks(kernel, chunks[1:], arriving, flags)
    _check(out, a, b)
    assert flags[2].item() == 1


@pytest.mark.skipif(not HOPPER, reason="the TMA path's host descriptors")
@pytest.mark.parametrize("chunk_group", [2, 4])
def test_fused_grouped_chunks_read_each_chunk_only_after_its_flag(chunk_group, gen):
    """Four equal 128-row chunks, three arriving late: grouped (``chunk_group``), a group's
    tiles interleave its chunks, and each still waits on its own chunk's flag."""
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    k, n = 1024, 2048
    a = _rand(512, k, gen=gen)
    b = _rand(k, n, gen=gen)
    out = torch.full((512, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    flags = torch.zeros(3, dtype=torch.int32, device=DEV)
    chunks = [FusedChunkViews(a[0:128], out[0:128])] + [
        FusedChunkViews(a[lo : lo + 128], out[lo : lo + 128], wait=flags[i : i + 1])
        for i, lo in enumerate((128, 256, 384))
    ]
    arriving = [c.a.clone() for c in chunks[1:]]
    for chunk in chunks[1:]:
        chunk.a.fill_(float("nan"))  # not there yet
    cfg = GemmConfig(128, 128, 64, 8, 4, 8, chunk_group=chunk_group)
    kernel = FusedGemm(chunks, b, sm_budget=120, timeout_s=10.0, config=cfg)
    assert kernel.host is not None and kernel.chunk_group == chunk_group
    _run_with_late_chunks(kernel, chunks[1:], arriving, flags)
    _check(out, a, b)


def _ready_runs_case(gen, dest_fill=float("nan")):
    """Six equal 256-row chunks of A [1536, 1024] against B [1024, 1536], five waiting on
    ``flags``: (a, b, out, flags, views(out) -> the chunk views into ``out``)."""
    from ficco.kernels.fused import FusedChunkViews

    k, n = 1024, 1536
    a = _rand(1536, k, gen=gen)
    b = _rand(k, n, gen=gen)
    out = torch.full((1536, n), dest_fill, device=DEV, dtype=torch.bfloat16)
    flags = torch.zeros(5, dtype=torch.int32, device=DEV)

    def views(dest):
        return [FusedChunkViews(a[0:256], dest[0:256])] + [
            FusedChunkViews(a[lo : lo + 256], dest[lo : lo + 256], wait=flags[i : i + 1])
            for i, lo in enumerate(range(256, 1536, 256))
        ]

    return a, b, out, flags, views


@pytest.mark.skipif(not HOPPER, reason="the TMA path's host descriptors")
@pytest.mark.parametrize("programs", [7, 120])
@pytest.mark.parametrize("chunk_group", [1, 2])
def test_fused_ready_runs_read_each_chunk_only_after_its_flag(programs, chunk_group, gen):
    """Ready runs (tiles by program, flattened runs over the arrived chunks, whose first
    loads are issued ahead under the last tile): five chunks landing late one by one; a run
    stops at the first chunk not yet arrived. The same launch with its tiles claimed gives
    the same bits."""
    from ficco.kernels.fused import FusedGemm
    from ficco.kernels.persistent import LAUNCH_COUNTS

    a, b, out, flags, views = _ready_runs_case(gen)
    chunks = views(out)
    arriving = [c.a.clone() for c in chunks[1:]]
    for chunk in chunks[1:]:
        chunk.a.fill_(float("nan"))  # not there yet
    cfg = GemmConfig(128, 128, 64, 8, 4, 8, chunk_group=chunk_group)
    kernel = FusedGemm(chunks, b, sm_budget=programs, timeout_s=10.0, config=cfg, ready_runs=True)
    before = LAUNCH_COUNTS["fused_ready_runs"]
    _run_with_late_chunks(kernel, chunks[1:], arriving, flags)
    assert LAUNCH_COUNTS["fused_ready_runs"] == before + 1
    _check(out, a, b)
    claimed = torch.full_like(out, float("nan"))
    FusedGemm(views(claimed), b, sm_budget=programs, timeout_s=10.0, config=cfg, ready_runs=False)()
    torch.cuda.synchronize()
    assert torch.equal(out, claimed)


@pytest.mark.skipif(not HOPPER, reason="the TMA path's host descriptors")
@pytest.mark.parametrize(
    "programs, chunk_group",
    [
        (7, 1),
        (120, 1),
        (7, 2),
        (120, 2),  # hung on one H200 (call R) until the give-up CAS left the spin's
        # barriers (flags._give_up); 21 launches and this test passed there in call S
    ],
)  # fmt: skip
def test_fused_ready_runs_give_up_on_a_chunk_that_never_arrives(programs, chunk_group, gen):
    """The third late chunk never comes: it is named, its rows untouched, every other chunk
    computed (its group's other chunk too)."""
    from ficco.kernels.flags import FlagTimeout
    from ficco.kernels.fused import FusedGemm

    a, b, out, flags, views = _ready_runs_case(gen)
    flags[[0, 1, 3, 4]] = 1
    cfg = GemmConfig(128, 128, 64, 8, 4, 8, chunk_group=chunk_group)
    short = FusedGemm(views(out), b, sm_budget=programs, timeout_s=0.2, config=cfg, ready_runs=True)
    short()
    torch.cuda.synchronize()
    with pytest.raises(FlagTimeout, match="chunk 3"):
        short.raise_on_timeout("launch")
    assert torch.isnan(out[768:1024]).all()
    keep = torch.ones(1536, dtype=torch.bool, device=DEV)
    keep[768:1024] = False
    _check(out[keep], a[keep], b)


@pytest.mark.skipif(not HOPPER, reason="the TMA path's host descriptors")
@pytest.mark.parametrize("chunk_group", [1, 2])
def test_fused_split_tail_with_a_late_chunk(chunk_group, gen):
    """16 tiles on 120 programs: every tile's K split seven ways, the late chunk's ranges each
    waiting on its flag; the last range of a tile sums the partials."""
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    k, n = 4096, 1024
    a = _rand(128, k, gen=gen)
    b = _rand(k, n, gen=gen)
    out = torch.full((128, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    flags = torch.zeros(1, dtype=torch.int32, device=DEV)
    chunks = [
        FusedChunkViews(a[0:64], out[0:64]),
        FusedChunkViews(a[64:128], out[64:128], wait=flags[0:1]),
    ]
    arriving = [chunks[1].a.clone()]
    chunks[1].a.fill_(float("nan"))  # not there yet
    cfg = GemmConfig(64, 128, 64, 8, 4, 4, split_tail=True, chunk_group=chunk_group)
    kernel = FusedGemm(chunks, b, sm_budget=120, timeout_s=10.0, config=cfg)
    assert kernel.plan is not None and kernel.plan.split == 7 and kernel.host is not None
    _run_with_late_chunks(kernel, chunks[1:], arriving, flags)
    _check(out, a, b)
    assert kernel.arrivals.eq(0).all() and kernel.work.eq(0).all()


def test_fused_tma_never_set_flag_times_out(gen):
    import time

    from ficco.kernels.fused import FlagTimeout, FusedGemm

    chunks, b, out, flags, _ = _fused_case(gen, False)
    flags[0] = 1  # chunk 2's flag never comes
    kernel = FusedGemm(chunks, b, sm_budget=132, timeout_s=0.3)
    start = time.monotonic()
    kernel()
    torch.cuda.synchronize()
    assert time.monotonic() - start < 10
    with pytest.raises(FlagTimeout, match="chunk 2"):
        kernel.raise_on_timeout("test")
    assert out[556:].isnan().all() and not out[:556].isnan().any()


def test_fused_default_tile_is_the_persistent_choice_until_fused_tuning(gen, monkeypatch):
    from ficco.kernels.configs import heuristic_config
    from ficco.kernels.fused import FusedGemm
    from ficco.kernels.fused_tuning import tune_fused

    if not HOPPER:
        pytest.skip("the TMA path's tile")
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "0")  # the persistent choice: its heuristic
    chunks, b, *_ = _fused_case(gen, False)
    kernel = FusedGemm(chunks, b, sm_budget=132, timeout_s=5.0)
    assert kernel.config == replace(heuristic_config(700, 1000, 1096), split_tail=False)
    options = [GemmConfig(64, 128, 64, 8, 5, 4), GemmConfig(128, 128, 64, 8, 4, 8)]
    best, record = tune_fused(700, 1000, 1096, 3, sm_budget=132, device=DEV, configs=options)
    assert best in options and set(record["timings_ms"]) == {c.name for c in options}
    assert FusedGemm(chunks, b, sm_budget=132, timeout_s=5.0).config == best
