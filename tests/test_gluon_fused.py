"""Which fused FP8 launches run on the Gluon kernel (`ficco.kernels.gluon_fused`), and where
their chunks lie: decided on the host, so checked here on CPU tensors (the kernel itself runs
in tests/gpu/test_gluon_fused_gpu.py)."""

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from ficco.kernels import gluon_fused  # noqa: E402
from ficco.kernels.fused_views import FusedChunkViews  # noqa: E402
from ficco.kernels.gluon_configs import FP8_CONFIGS  # noqa: E402
from ficco.kernels.scaled import random_operands  # noqa: E402
from ficco.kernels.scaled_fused import fused_scales  # noqa: E402

HALVES = next(c for c in FP8_CONFIGS if c.shared_tile and c.consumers == 2)
THIRDS = next(c for c in FP8_CONFIGS if c.consumers == 3)
K, N = 256, 384


def _case(rows=256, order=(2, 3, 0, 1), gap=0, per_tensor=False, wait=True):
    """Chunks of ``rows`` rows gathered in one buffer (chunk i at slot order[i], ``gap`` rows
    between slots) and their outputs likewise; per-row / per-column scales."""
    chunks = len(order)
    pitch = rows + gap
    a, b, sa, sb, _ = random_operands(chunks * pitch, N, K, torch.float8_e4m3fn, "cpu", seed=3)
    out = torch.zeros((chunks * pitch, N), dtype=torch.bfloat16)
    flags = torch.ones(chunks, dtype=torch.int32)
    if per_tensor:
        sa, sb = sa.amax().reshape(1, 1), sb.amax().reshape(1, 1)
    views = []
    for i, slot in enumerate(order):
        lo = slot * pitch
        views.append(
            FusedChunkViews(
                a[lo : lo + rows], out[lo : lo + rows], wait=flags[i : i + 1] if wait else None,
                a_scale=sa if per_tensor else sa[lo : lo + rows],
            )
        )  # fmt: skip
    return views, b, fused_scales(views, b, sb, False)


def test_chunks_in_arrival_order_are_placed_by_their_rows_in_the_buffers():
    views, b, scales = _case(rows=256, order=(2, 3, 0, 1), gap=64)
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=THIRDS)
    assert why == ""
    assert launch.config == THIRDS and launch.chunk_rows == 256
    assert launch.a_rows == (640, 960, 0, 320)  # slot * (256 + 64)
    assert launch.c_rows == (640, 960, 0, 320)
    assert len(launch.a_spans) == 1 and launch.a_span_of == (0, 0, 0, 0)
    assert launch.a_spans[0].shape[0] == launch.c_span.shape[0] == 4 * 320 - 64


def _all_gather_case(rows=256, peers=1, gap=0):
    """As an all-gather's fused launch: the local shard first, read in place from its own
    buffer without a wait, then ``peers`` chunks gathered in another buffer (``gap`` rows
    before them), waiting; outputs in one buffer."""
    total = (peers + 1) * rows + gap
    a, b, sa, sb, _ = random_operands(total, N, K, torch.float8_e4m3fn, "cpu", seed=5)
    local, local_scale = a[:rows].clone(), sa[:rows].clone()
    out = torch.zeros(((peers + 1) * rows, N), dtype=torch.bfloat16)
    flags = torch.ones(peers, dtype=torch.int32)
    views = [FusedChunkViews(local, out[:rows], a_scale=local_scale)] + [
        FusedChunkViews(
            a[gap + p * rows : gap + (p + 1) * rows], out[p * rows : (p + 1) * rows],
            wait=flags[p - 1 : p], a_scale=sa[gap + p * rows : gap + (p + 1) * rows],
        )
        for p in range(1, peers + 1)
    ]  # fmt: skip
    return views, b, fused_scales(views, b, sb, False)


def test_an_all_gathers_local_shard_is_read_in_place_beside_the_gathered_rows():
    views, b, scales = _all_gather_case(peers=2, gap=64)
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=THIRDS)
    assert why == ""
    assert len(launch.a_spans) == 2 and launch.a_span_of == (0, 1, 1)
    assert launch.a_spans[0].data_ptr() == views[0].a.data_ptr()
    assert launch.a_rows == (0, 0, 256)  # rows in their own buffer's span
    assert launch.c_rows == (0, 256, 512)


def test_chunks_in_three_a_buffers_are_refused_naming_the_rule():
    views, b, _ = _all_gather_case(peers=1)
    third = views[1].a.clone()
    views = [
        *views,
        FusedChunkViews(third, torch.zeros_like(views[1].out), a_scale=views[1].a_scale),
    ]
    launch, why = gluon_fused.plan(
        views, b, fused_scales(views, b, torch.ones(1, N), False), 132, pick=THIRDS
    )
    assert launch is None and "not in one or two buffers" in why


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (dict(per_tensor=True), "per-tensor scales"),
        (dict(rows=96, order=(0, 1)), "do not divide a chunk's 96 rows"),
        (dict(rows=128, order=(0, 1), gap=32), "64-row boundaries"),
    ],
)
def test_a_launch_the_kernel_does_not_take_is_refused_naming_why(change, says):
    views, b, scales = _case(**change)
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=HALVES)
    assert launch is None and says in why


def test_refusals_name_the_operand_or_chunk():
    views, b, scales = _case()
    assert gluon_fused.refusal(views, b, None, False) == "not FP8 operands"
    assert "reset_waits" in gluon_fused.refusal(views, b, scales, True)
    row_major_b = b.contiguous()
    assert "column-major" in gluon_fused.refusal(views, row_major_b, scales, False)
    unequal = [views[0], FusedChunkViews(views[1].a[:128], views[1].out[:128], a_scale=None)]
    assert "row counts differ" in gluon_fused.refusal(unequal, b, scales, False)
    fp32_out = [FusedChunkViews(v.a, v.out.float(), a_scale=v.a_scale) for v in views]
    assert "bf16" in gluon_fused.refusal(fp32_out, b, scales, False)
    signals = [FusedChunkViews(v.a, v.out, signal=v.wait, a_scale=v.a_scale) for v in views]
    assert "signals" in gluon_fused.refusal(signals, b, scales, False)
    empty = [FusedChunkViews(v.a[:0], v.out[:0], a_scale=v.a_scale[:0]) for v in views]
    assert gluon_fused.refusal(empty, b, scales, False) == "the chunks have no rows"


def test_without_a_pick_the_shipped_picks_decide_and_cpu_has_none():
    views, b, scales = _case()
    launch, why = gluon_fused.plan(views, b, scales, 132)
    assert launch is None and "no shipped Gluon pick" in why


@pytest.mark.parametrize(
    ("picked", "rows", "expected"),
    [
        ({4: THIRDS, 1: HALVES}, 384, THIRDS),  # the whole launch's pick: 64-row blocks
        ({4: HALVES, 1: THIRDS}, 192, THIRDS),  # 128-row tiles would straddle 192-row chunks
        ({4: HALVES}, 256, HALVES),
        ({1: HALVES}, 256, HALVES),  # a chunk's pick alone
    ],
)
def test_the_whole_launchs_pick_comes_first_where_its_blocks_divide_a_chunk(
    monkeypatch, picked, rows, expected
):
    import sys

    matmul = sys.modules["ficco.kernels.matmul"]  # the module (the package exports the function)
    picked = {chunks * rows: cfg for chunks, cfg in picked.items()}  # keyed by M
    monkeypatch.setattr(matmul, "shipped_gluon_pick", lambda m, *_: picked.get(m))
    views, b, scales = _case(rows=rows)
    launch, why = gluon_fused.plan(views, b, scales, 132)
    assert why == "" and launch.config == expected


def test_a_pick_whose_blocks_straddle_two_chunks_is_refused(monkeypatch):
    import sys

    matmul = sys.modules["ficco.kernels.matmul"]
    monkeypatch.setattr(matmul, "shipped_gluon_pick", lambda *_: HALVES)
    views, b, scales = _case(rows=192)
    launch, why = gluon_fused.plan(views, b, scales, 132)
    assert launch is None and "(128 rows) do not divide a chunk's 192 rows" in why


def test_the_fused_gemm_keeps_cpu_launches_on_its_triton_kernel():
    from ficco.kernels.fused import FusedGemm

    views, b, _ = _case(rows=64, order=(1, 0))
    sb = torch.ones((1, N))
    gemm = FusedGemm(views, b, sm_budget=4, timeout_s=5.0, b_scale=sb)
    assert gemm.gluon is None


def test_a_gluon_tile_the_launch_cannot_take_is_refused_naming_why():
    from ficco.kernels.fused import FusedGemm

    views, b, _ = _case(rows=64, order=(1, 0))
    sb = torch.ones((1, N))
    with pytest.raises(ValueError, match=f"config {HALVES.name} refused: not on a GPU"):
        FusedGemm(views, b, sm_budget=4, timeout_s=5.0, b_scale=sb, config=HALVES)


def test_the_chunk_multiplier_divides_exactly_within_its_bound():
    """(n * m) >> 32 == n // d for every n with n * d < 2^32: the worst n below each multiple
    of d is the one just under it (largest fraction, largest overshoot), so those and the
    multiples themselves settle every n."""
    import numpy as np

    for d in [*range(64, 4097, 64), 6144, 8192, 12288, 16384, 24576, 65536, 1 << 20]:
        m = gluon_fused.chunk_multiplier(d, 2)
        assert 0 < m < 1 << 31  # a 32-bit kernel argument
        bound = ((1 << 32) - 1) // d  # the largest n the plan lets through
        q = np.arange(1, bound // d + 1, dtype=np.int64)
        n = np.concatenate([q * d - 1, q * d, np.array([0, bound], dtype=np.int64)])
        n = n[n <= bound]
        np.testing.assert_array_equal((n * m) >> 32, n // d)
    assert gluon_fused.chunk_multiplier(100, 1) == 0  # one chunk: every row in chunk 0
    with pytest.raises(ValueError, match="chunk_rows 0 and chunks 2 must be at least 1"):
        gluon_fused.chunk_multiplier(0, 2)


def test_a_launch_past_the_multipliers_bound_is_refused_naming_it():
    views, b, scales = _case(rows=49152, order=(0, 1))  # (98304 + 192) * 49152 > 2^32
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=THIRDS)
    assert launch is None and "reach 2^32" in why and "2 chunks of 49152 rows" in why
    views, b, scales = _case(rows=43008, order=(0, 1))  # (86016 + 192) * 43008 < 2^32
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=THIRDS)
    assert why == "" and launch.chunk_rows == 43008


@pytest.mark.parametrize("world", [2, 4])
def test_the_all_gather_fused_plans_own_fp8_chunks_are_taken(world):
    """The chunks of `plan_ag_gemm_fused`'s FP8 launch as the executor views them (the local
    shard in a_shard, the peers' rows in a_full, each buffer's scales its own): the Gluon
    plan takes them, the local shard first and unwaited (refused while A had to be one
    buffer)."""
    from ficco.execute.buffers import view
    from ficco.execute.scaled import allocate_scaled, operand
    from ficco.plan import FusedGemmOp, build_plan
    from ficco.problem import Problem
    from ficco.space import Schedule

    problem = Problem(
        pattern="ag_gemm", m=1536 * world, n=N, k=K, world=world, dtype="fp8_e4m3",
        a_scale="row", b_scale="column",
    )  # fmt: skip
    plan = build_plan(problem, Schedule.parse("finer-c2-m/ce/triton+fused"), rank=1)
    # the buffers as a backend allocates them (every schedule's: the default plan's)
    tensors = allocate_scaled(build_plan(problem, Schedule(), rank=1), seed=0)
    (op,) = [t.op for t in plan.tasks if isinstance(t.op, FusedGemmOp)]
    flag = torch.ones(1, dtype=torch.int32)
    views = [
        FusedChunkViews(
            view(tensors, c.a), view(tensors, c.out), None if c.wait is None else flag,
            a_scale=operand(tensors, c.a, "a")[1],
        )
        for c in op.chunks
    ]  # fmt: skip
    b, b_scale = operand(tensors, op.b, "b")
    peers = 2 * (world - 1)  # two pieces a shard
    assert [v.wait is None for v in views] == [True, True] + [False] * peers
    scales = fused_scales(views, b, b_scale, False)
    launch, why = gluon_fused.plan(views, b, scales, 132, pick=THIRDS)
    assert why == ""
    assert len(launch.a_spans) == 2 and launch.a_span_of == (0, 0) + (1,) * peers
