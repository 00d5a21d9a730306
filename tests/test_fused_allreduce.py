"""gemm_ar's fused schedules: the producer's epilogue all-reduces (one-shot, zero-copy).

Every rank's fused GEMM stores each tile of chunk j once per rank (its own staging block and
the same block of every peer's staging) and flags (source, j) on every rank; each rank
reduces chunk j once the W sources' flags are set. ``+rs_ag`` fuses gemm_rs's reduce-scatter.
"""

import dataclasses
import time

import pytest
import torch

from ficco.execute import Verdict, run_problem
from ficco.execute.options import RunOptions
from ficco.plan import FusedGemmOp, Plan, ReduceOp, WaitFlagsOp, build_plan, flag_slot
from ficco.problem import Problem
from ficco.space import AllReduce, Compute, Schedule, enumerate_schedules, violations
from ficco.space.geometry import geometry

AR3 = Problem(pattern="gemm_ar", m=96, n=80, k=72, world=3, dtype="fp32")


def _fused(problem):
    return [s for s in enumerate_schedules(problem) if s.compute is Compute.FUSED]


# --- the space -------------------------------------------------------------------------------


def test_gemm_ar_fused_schedules_are_the_gemm_rs_conditions():
    fused = _fused(AR3)
    direct = [s for s in fused if s.all_reduce is AllReduce.DIRECT]
    rs_ag = [s for s in fused if s.all_reduce is AllReduce.RS_AG]
    # direct: 4 finer counts x 3 reserves x 2 priorities (no shard, no peer order: one step)
    assert len(direct) == 4 * 3 * 2
    assert {s.granularity.value for s in direct} == {"finer"}
    # rs_ag: gemm_rs's fused schedules (shard + 4 finer counts x 3 x 2 x 2 orders at W = 3)
    rs = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=3, dtype="fp32")
    assert {str(s) for s in rs_ag} == {f"{s}+rs_ag" for s in _fused(rs)}
    assert len(rs_ag) == 5 * 3 * 2 * 2
    assert {(s.transport.value, s.gemm.value, s.split.value) for s in fused} == {
        ("ce", "triton", "m")
    }
    ragged = Problem(pattern="gemm_ar", m=95, n=80, k=72, world=3)  # no rs_ag: 95 % 3
    assert len(_fused(ragged)) == 24
    decode = Problem(pattern="gemm_ar", m=1, n=64, k=72, world=2)  # one row: no row chunks
    assert not _fused(decode)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("finer-c2-m/ce/cublas+fused", "fused_needs_triton"),
        ("serial/ce/triton+fused", "fused_needs_overlap"),
        ("finer-c2-n/nccl/triton+fused", "fused_needs_row_chunks"),
        ("finer-c2-m/nccl/triton+fused", "fused_needs_symmetric_memory"),
        ("finer-c2-m/symm1/triton+fused", "fused_needs_symmetric_memory"),
        ("shard/ce/triton+fused", "direct_all_reduce_has_no_shards"),
    ],
)
def test_each_rule_refusing_a_gemm_ar_fused_schedule_says_why(text, rule):
    broken = dict(violations(AR3, Schedule.parse(text)))
    assert rule in broken and broken[rule]


def test_the_cost_model_leaves_gemm_ar_fused_out():
    from ficco.model.predict import PREDICTED_SPACE

    assert _fused(AR3)
    assert not any(s.compute is Compute.FUSED for s in enumerate_schedules(AR3, PREDICTED_SPACE))


def test_gemm_ar_fused_geometry_is_one_launch_storing_every_chunk_to_every_peer():
    g = geometry(AR3, Schedule.parse("finer-c4-m/ce/triton+fused"))
    assert (g.gemm_launches, g.gemm_rows, g.steps) == (1, 96, 1)
    assert (g.transfers, g.transfer_rows, g.transfer_cols) == (2 * 4, 24, 80)


# --- the plans -------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_tile_is_computed_once_and_stored_and_flagged_on_every_rank(world):
    p = dataclasses.replace(AR3, world=world)
    s = Schedule.parse("finer-c4-m/ce/triton+fused")
    plans = [build_plan(p, s, r) for r in range(world)]
    n, M = 4, p.m
    signalled: dict[tuple[int, int], int] = {}
    for src, plan in enumerate(plans):
        (gemm,) = [t for t in plan.tasks if isinstance(t.op, FusedGemmOp)]
        assert gemm.deps == ()
        chunks = gemm.op.chunks
        # one chunk per row range: the rows of a cover M once (each tile computed once)
        rows = [c.a.rows for c in chunks]
        assert rows[0][0] == 0 and rows[-1][1] == M and len(chunks) == n
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:], strict=False))
        for j, c in enumerate(chunks):
            stores = c.stores
            assert sorted(d.out_rank for d in stores) == list(range(world))
            assert stores[0].out_rank == src  # its own block first, then the peers
            for d in stores:  # source src's block, at the chunk's rows, on every rank
                assert d.out.buffer == "staging"
                assert d.out.rows == (src * M + c.a.rows[0], src * M + c.a.rows[1])
                assert d.signal == (d.out_rank, flag_slot(src, j, n))
                signalled[d.signal] = signalled.get(d.signal, 0) + 1
        waits = [t for t in plan.tasks if isinstance(t.op, WaitFlagsOp)]
        assert [w.op.slots for w in waits] == [
            tuple(flag_slot(x, j, n) for x in range(world)) for j in range(n)
        ]
        reduces = [t for t in plan.tasks if isinstance(t.op, ReduceOp)]
        for j, (wait, red) in enumerate(zip(waits, reduces, strict=True)):
            assert red.deps == (wait.id,)
            lo, hi = chunks[j].a.rows
            assert red.op.out.buffer == "c" and red.op.out.rows == (lo, hi)
            # every rank sums the same staged partials in rank order: the same bits
            assert [r.rows for r in red.op.inputs] == [
                (x * M + lo, x * M + hi) for x in range(world)
            ]
    # every (rank, slot) is set by exactly one source, and every rank's waits are covered
    assert all(count == 1 for count in signalled.values())
    assert set(signalled) == {
        (r, flag_slot(x, j, n)) for r in range(world) for x in range(world) for j in range(n)
    }


def test_rs_ag_fused_is_gemm_rs_fused_then_the_all_gather():
    p = Problem(pattern="gemm_ar", m=96, n=80, k=72, world=3)
    plan = build_plan(p, Schedule.parse("finer-c2-m/ce/triton+fused+rs_ag"), 1)
    (gemm,) = [t.op for t in plan.tasks if isinstance(t.op, FusedGemmOp)]
    assert all(not c.copies for c in gemm.chunks)  # one destination each: the rows' owner
    reduces = [t for t in plan.tasks if isinstance(t.op, ReduceOp)]
    assert [r.op.out.rows for r in reduces] == [(32, 48), (48, 64)]  # rank 1's rows of c
    assert all(r.op.out.buffer == "c" for r in reduces)
    sends = [t for t in plan.tasks if getattr(t.op, "direction", None) == "send"]
    assert len(sends) == 2 * 2 and all(set(t.deps) <= {r.id for r in reduces} for t in sends)


# --- the kernel (interpreter) ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["tma", "ptr"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_kernel_stores_each_tile_to_every_destination_and_flags_each(dtype, tol, path):
    from ficco.kernels.fused import FusedChunkViews, FusedCopyViews, FusedGemm

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(40, 24, generator=gen).to(dtype)
    b = torch.randn(24, 32, generator=gen).to(dtype)
    dests = [torch.full((40, 32), float("nan"), dtype=dtype) for _ in range(3)]
    flags = torch.zeros(6, dtype=torch.int32)
    chunks = [
        FusedChunkViews(
            a[lo:hi],
            dests[0][lo:hi],
            signal=flags[j : j + 1],
            copies=tuple(
                FusedCopyViews(d[lo:hi], flags[2 * i + 2 + j : 2 * i + 3 + j])
                for i, d in enumerate(dests[1:])
            ),
        )
        for j, (lo, hi) in enumerate(((0, 16), (16, 40)))
    ]
    kernel = FusedGemm(chunks, b, sm_budget=3, timeout_s=20.0, path=path)
    assert kernel.path == path
    # tiles of the 40 rows once, not once per destination
    one_pass = -(-16 // kernel.config.block_m) + -(-24 // kernel.config.block_m)
    assert kernel.tiles == one_pass * -(-32 // kernel.config.block_n)
    kernel()
    expect = a.float() @ b.float()
    for d in dests:
        assert (d.float() - expect).abs().max().item() < tol * expect.abs().max().item()
    assert torch.equal(dests[0], dests[1]) and torch.equal(dests[0], dests[2])  # same bits
    assert flags.tolist() == [1] * 6
    kernel.raise_on_timeout("test")


def test_kernel_refuses_a_copy_of_another_shape():
    from ficco.kernels.fused import FusedChunkViews, FusedCopyViews, FusedGemm

    a, b = torch.randn(8, 8), torch.randn(8, 4)
    chunk = FusedChunkViews(a, torch.zeros(8, 4), copies=(FusedCopyViews(torch.zeros(7, 4)),))
    with pytest.raises(ValueError, match=r"out \(7, 4\); with b \(8, 4\) out must be \[8, 4\]"):
        FusedGemm([chunk], b, sm_budget=2, timeout_s=1.0)


# --- gloo runs (every rank a process) --------------------------------------------------------

DIRECT = ["finer-c2-m/ce/triton+fused", "finer-c4-m/ce/triton+fused+sm16+hi"]
RS_AG_W2 = ["shard/ce/triton+fused+rs_ag", "finer-c2-m/ce/triton+fused+rs_ag"]
RS_AG_W3 = ["finer-c2-m/ce/triton+fused+all_peers+sm32+rs_ag"]


@pytest.mark.parametrize(
    ("world", "dtype", "m", "texts"),
    [
        (2, "fp32", 96, DIRECT + RS_AG_W2),
        (2, "fp16", 96, DIRECT + RS_AG_W2[:1]),
        (3, "fp32", 95, DIRECT),  # M not divisible by W: ragged chunks, no rs_ag
        (3, "fp16", 96, DIRECT[:1] + RS_AG_W3),
        (3, "fp32", 96, RS_AG_W3),
    ],
)
def test_gemm_ar_fused_schedules_verify_over_gloo(world, dtype, m, texts):
    p = Problem(pattern="gemm_ar", m=m, n=80, k=72, world=world, dtype=dtype)
    results = run_problem(p, [Schedule.parse(t) for t in texts], backend="cpu")
    assert [r.schedule for r in results] == texts
    assert all(r.ok for r in results), [(r.schedule, r.verdict.value, r.detail) for r in results]


def _rewrite_first_chunk(plan: Plan, change) -> Plan:
    tasks = []
    for t in plan.tasks:
        if isinstance(t.op, FusedGemmOp):
            first, *rest = t.op.chunks
            copies = tuple(change(plan.rank, d) for d in first.copies)
            first = dataclasses.replace(first, copies=copies)
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, chunks=(first, *rest)))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


def silence_first_chunk_copies(plan: Plan) -> Plan:
    """The first chunk lands in every peer's staging, but no peer is told."""
    return _rewrite_first_chunk(plan, lambda rank, d: dataclasses.replace(d, signal=None))


def keep_first_chunk_copies_home(plan: Plan) -> Plan:
    """The first chunk's copies are stored on the producer itself, yet the peers are told."""
    return _rewrite_first_chunk(plan, lambda rank, d: dataclasses.replace(d, out_rank=rank))


def test_a_missing_peer_flag_is_a_timeout_verdict_not_a_hang():
    p = Problem(pattern="gemm_ar", m=32, n=16, k=16, world=2, dtype="fp32")
    start = time.monotonic()
    (result,) = run_problem(
        p,
        [Schedule.parse("finer-c2-m/ce/triton+fused")],
        options=RunOptions(timeout_s=8.0),  # flags give up after a quarter: 2 s
        backend="cpu",
        plan_hook=silence_first_chunk_copies,
    )
    assert result.verdict is Verdict.TIMEOUT, result
    assert "FlagTimeout" in result.detail and "reduction's flag wait" in result.detail
    assert "timed out after 2 s" in result.detail and "source rank" in result.detail
    assert time.monotonic() - start < 60  # the flag wait ended it, not the pool's limit


def test_a_copy_that_never_reaches_the_peer_is_incorrect():
    p = Problem(pattern="gemm_ar", m=32, n=16, k=16, world=2, dtype="fp32")
    (result,) = run_problem(
        p,
        [Schedule.parse("finer-c2-m/ce/triton+fused")],
        options=RunOptions(timeout_s=8.0),
        backend="cpu",
        plan_hook=keep_first_chunk_copies_home,
    )
    assert result.verdict is Verdict.INCORRECT, result


def test_the_kernel_compiles_for_sm90_with_every_flag_release():
    """The GPU code of the multi-destination epilogue (never run by the interpreter) lowers to
    a cubin for sm_90, with the system-scope release that sets a destination's flag."""
    from offline_sm90 import offline_compile

    atomics = offline_compile("compile_fused_sm90.py")["atomics"]
    for path in ("ptr", "tma"):
        assert "atom.global.sys.release.exch.b32" in atomics[path], atomics
        assert "atom.global.sys.acq_rel.add.u32" in atomics[path], atomics  # the tile count
