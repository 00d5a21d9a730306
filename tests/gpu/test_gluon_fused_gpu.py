"""The fused GEMM's FP8 launches on the warp-specialized Gluon kernel (`ficco.kernels.
gluon_fused`) on one sm_90 GPU: every FP8 tile over chunks in arrival order, rows that land
during the launch, a flag that never does, and `FusedGemm` taking the kernel where the card's
picks name the shape."""

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the Gluon kernel needs an sm_90 GPU (wgmma, setmaxnreg)",
)

# one bf16 rounding of the output plus accumulation order: relative Frobenius error
LIMIT = 1e-2
K, N = 1024, 768
SENTINEL = 7.0


def _configs():
    from ficco.kernels.gluon_configs import FP8_CONFIGS

    return [c for c in FP8_CONFIGS if not (c.swap_ab or c.tail_n)]


def _case(rows, order=(2, 3, 0, 1), gap=64, seed=0):
    """Chunks of ``rows`` rows in one gathered buffer (chunk i at slot order[i], ``gap``
    rows between slots) and outputs likewise, the gaps filled with SENTINEL."""
    from ficco.kernels.fused_views import FusedChunkViews
    from ficco.kernels.scaled import random_operands

    pitch = rows + gap
    total = len(order) * pitch
    a, b, sa, sb, ref = random_operands(total, N, K, torch.float8_e4m3fn, "cuda", seed=seed)
    out = torch.full((total, N), SENTINEL, device="cuda", dtype=torch.bfloat16)
    flags = torch.ones(len(order), dtype=torch.int32, device="cuda")
    views = [
        FusedChunkViews(
            a[s * pitch : s * pitch + rows], out[s * pitch : s * pitch + rows],
            wait=flags[i : i + 1], name=f"chunk {i}", a_scale=sa[s * pitch : s * pitch + rows],
        )
        for i, s in enumerate(order)
    ]  # fmt: skip
    gaps = torch.ones(total, dtype=torch.bool, device="cuda")
    for s in range(len(order)):
        gaps[s * pitch : s * pitch + rows] = False
    return views, b, sb, out, ref, flags, gaps


def _rel(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


def _launch(views, b, sb, cfg, sm_budget=132, timeout_s=10.0, fast=False):
    from ficco.kernels.fused import FusedGemm

    gemm = FusedGemm(
        views, b, sm_budget=sm_budget, timeout_s=timeout_s, b_scale=sb, fast_accum=fast,
        config=cfg,
    )  # fmt: skip
    assert gemm.gluon is not None and gemm.gluon.config == cfg
    return gemm


@pytest.mark.parametrize("blocks", [2, 3], ids=lambda p: f"blocks{p}")
@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: c.name)
def test_every_fp8_tile_computes_chunks_in_arrival_order_and_stores_only_their_rows(cfg, blocks):
    from ficco.kernels.gluon_fused import _block_rows

    # chunks of 2 or 3 of the tile's row blocks, back to back in the launch (192-row tiles
    # over 128-row chunks hold rows of two; the last tile reaches past the launch's rows),
    # a store block's gap between them in the buffers
    views, b, sb, out, ref, _, gaps = _case(blocks * _block_rows(cfg), gap=cfg.rows_per_consumer)
    gemm = _launch(views, b, sb, cfg)
    gemm()
    torch.cuda.synchronize()
    gemm.raise_on_timeout("test")
    inside = ~gaps
    assert _rel(out[inside], ref[inside]) <= LIMIT
    # a tile reaching past its chunk (256 rows in 192-row tiles) stores none of those rows
    assert (out[gaps] == SENTINEL).all()


def test_fast_accumulation_too():
    cfg = next(c for c in _configs() if c.consumers == 3)
    views, b, sb, out, ref, _, gaps = _case(256)
    _launch(views, b, sb, cfg, fast=True)()
    torch.cuda.synchronize()
    assert _rel(out[~gaps], ref[~gaps]) <= LIMIT


@pytest.mark.parametrize("consumers", [2, 3])
def test_a_chunk_is_read_only_after_its_flag(consumers):
    cfg = next(c for c in _configs() if c.shared_tile and c.consumers == consumers)
    views, b, sb, out, ref, flags, gaps = _case(384, order=(2, 0, 3, 1))
    _run_while_rows_land(views, flags, lambda: _launch(views, b, sb, cfg, sm_budget=120))
    assert _rel(out[~gaps], ref[~gaps]) <= LIMIT


def _run_while_rows_land(views, flags, make_gemm, sleep_cycles=2_000_000):
    """Chunks 1.. not there yet (e4m3 NaN rows, flags 0): their fused GEMM (``make_gemm()``,
    120 programs: the side stream's copies and flag writes find SMs meanwhile) launched
    while a side stream lands each after ``sleep_cycles`` and sets its flag. The GEMM."""
    arriving = [v.a.clone() for v in views[1:]]
    for v in views[1:]:
        v.a.view(torch.uint8).fill_(0x7F)
    flags[1:].zero_()
    gemm = make_gemm()
    gemm.compile()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i, v in enumerate(views[1:]):
            torch.cuda._sleep(sleep_cycles)
            v.a.copy_(arriving[i])
            flags[i + 1 : i + 2].fill_(1)
    gemm()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    gemm.raise_on_timeout("test")
    return gemm


@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: c.name)
def test_an_all_gathers_local_shard_is_read_in_place_while_its_peers_rows_land(cfg):
    """As an all-gather's fused launch: the local shard first, from its own buffer, no wait;
    two peers' chunks gathered in another buffer, landing during the launch (the kernel's
    second A buffer)."""
    from ficco.kernels.fused_views import FusedChunkViews
    from ficco.kernels.gluon_fused import _block_rows

    views, b, sb, out, ref, flags, gaps = _case(
        2 * _block_rows(cfg), order=(1, 0, 2), gap=cfg.rows_per_consumer
    )
    local = views[0].a.clone()  # in its own buffer, read in place
    views[0] = FusedChunkViews(local, views[0].out, a_scale=views[0].a_scale.clone())
    gemm = _run_while_rows_land(
        views, flags, lambda: _launch(views, b, sb, cfg, sm_budget=120), 1_000_000
    )
    assert len(gemm.gluon.launch.a_spans) == 2
    assert _rel(out[~gaps], ref[~gaps]) <= LIMIT
    assert (out[gaps] == SENTINEL).all()


def test_a_flag_never_set_times_out_naming_its_chunk():
    from ficco.kernels.flags import FlagTimeout

    cfg = next(c for c in _configs() if c.shared_tile and c.consumers == 2)
    views, b, sb, out, ref, flags, gaps = _case(256, order=(0, 1))
    flags[1:].zero_()
    gemm = _launch(views, b, sb, cfg, sm_budget=120, timeout_s=0.5)
    gemm()
    torch.cuda.synchronize()
    assert flags[1].item() == -1  # given up
    with pytest.raises(FlagTimeout, match="chunk 1"):
        gemm.raise_on_timeout("test")
    first = slice(0, 256)
    assert _rel(out[first], ref[first]) <= LIMIT  # the chunk that arrived


def test_the_fused_gemm_takes_the_gluon_kernel_where_the_cards_picks_name_the_shape():
    from ficco.kernels import persistent
    from ficco.kernels.fused import FusedChunkViews, FusedGemm
    from ficco.kernels.gluon_configs import picks_enabled, shipped_picks
    from ficco.kernels.scaled import random_operands
    from ficco.kernels.tuning import TuningKey

    if not picks_enabled():
        pytest.skip("FICCO_GEMM_GLUON=0")
    budget = persistent.default_sm_budget(torch.device("cuda"))
    picks = shipped_picks()
    # the smallest fp8 shape picked for this card and budget, in two row chunks of its rows
    shapes = sorted(
        (m * n * k, m, n, k)
        for m in (256, 512, 1024, 2048)
        for n, k in ((3072, 4096), (4096, 4096), (14336, 4096), (4096, 14336))
        if str(TuningKey.for_problem(m, n, k, torch.float8_e4m3fn, budget, "cuda")) in picks
    )
    if not shapes:
        pytest.skip("no fp8 pick of these shapes for this card")
    _, m, n, k = shapes[0]
    a, b, sa, sb, ref = random_operands(2 * m, n, k, torch.float8_e4m3fn, "cuda", seed=1)
    out = torch.full((2 * m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    flags = torch.ones(2, dtype=torch.int32, device="cuda")
    views = [
        FusedChunkViews(
            a[lo : lo + m], out[lo : lo + m], wait=flags[i : i + 1], a_scale=sa[lo : lo + m]
        )  # fmt: skip
        for i, lo in enumerate((m, 0))
    ]
    gemm = FusedGemm(views, b, sm_budget=budget, timeout_s=10.0, b_scale=sb)
    assert gemm.gluon is not None
    before = persistent.LAUNCH_COUNTS["fused_gluon"]
    gemm()
    torch.cuda.synchronize()
    assert persistent.LAUNCH_COUNTS["fused_gluon"] == before + 1
    assert _rel(out, ref) <= LIMIT
    # per-tensor scales: the Triton kernel (the picks were measured per row / column)
    one = sa.amax().reshape(1, 1)
    per_tensor = [FusedChunkViews(v.a, v.out, wait=v.wait, a_scale=one) for v in views]
    triton_launch = FusedGemm(
        per_tensor, b, sm_budget=budget, timeout_s=10.0, b_scale=sb.amax().reshape(1, 1)
    )
    assert triton_launch.gluon is None
