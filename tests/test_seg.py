"""The ``seg`` transport: an all-to-all step's transfers as one segment-copy kernel launch.

Its space (string form, legality), its lowering (the same bytes as ``ce``, grouped one
group per step), its CPU execution over gloo on 2 and 3 ranks with uniform and skewed
routing (verified, and faults caught), and the CUDA primitives' group op run on CPU tensors
under Triton's interpreter (peer buffers stood in for by other ranks' CPU tensors)."""

import dataclasses
import os
from collections import Counter

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ficco.execute import Verdict, run_problem  # noqa: E402
from ficco.execute.buffers import allocate, view  # noqa: E402
from ficco.plan import (  # noqa: E402
    GemmOp,
    LocalCopyOp,
    Plan,
    TransferGroupOp,
    TransferOp,
    build_plan,
)
from ficco.plan.tags import push_signal_points
from ficco.problem import Problem  # noqa: E402
from ficco.routing import with_skewed_routing  # noqa: E402
from ficco.space import (  # noqa: E402
    Gemm,
    Schedule,
    SpaceOptions,
    Transport,
    check_legal,
    enumerate_schedules,
    is_legal,
    violations,
)


def a2a(pattern: str, world: int, skewed: bool = False, **kw) -> Problem:
    kw = {"m": 96, "n": 80, "k": 72, "dtype": "fp32", **kw}
    p = Problem(pattern=pattern, world=world, experts=2 * world, **kw)
    return with_skewed_routing(p, top_k=2, alpha=1.2, seed=3) if skewed else p


def seg_schedules(p: Problem, chunk_counts=(2, 4)) -> list[Schedule]:
    opts = SpaceOptions(
        chunk_counts=chunk_counts, gemms=(Gemm.CUBLAS,), transports=(Transport.SEG,)
    )
    return list(enumerate_schedules(p, opts))


# --- the space ------------------------------------------------------------------------------


def test_seg_names_round_trip_and_old_names_still_parse():
    for text in (
        "serial/seg/cublas",
        "finer-c4-m/seg/triton+all_peers+sm16+hi",
        "finer-c2-m/seg/cublas+merged",
        "shard/ce/cublas",
        "finer-c8-k/nccl/triton+merged+all_peers+sm16",
        "finer-c4-m/symm2/cublas+hi",
    ):
        assert str(Schedule.parse(text)) == text
    assert Schedule.parse("shard/seg/cublas").transport is Transport.SEG
    assert Transport.SEG.traits.one_sided and Transport.CE.traits.one_sided
    assert not Transport.NCCL.traits.one_sided


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_seg_is_for_the_all_to_alls_only(pattern):
    p = Problem(pattern=pattern, m=96, n=80, k=72, world=2)
    broken = dict(violations(p, Schedule.parse("shard/seg/cublas")))
    assert "serves a2a_gemm, gemm_a2a, emb_a2a only" in broken["transport_serves_pattern"]
    assert not any(s.transport is Transport.SEG for s in enumerate_schedules(p))


def test_seg_needs_rows_of_whole_16_byte_vectors():
    # dispatch moves rows of x [*, K]; combine rows of y [*, N]
    bad_k = a2a("a2a_gemm", 2, k=70)  # 280-byte fp32 rows
    broken = dict(violations(bad_k, Schedule.parse("serial/seg/cublas")))
    assert "k=70" in broken["transport_needs_aligned_ranges"]
    assert is_legal(a2a("gemm_a2a", 2, k=70), Schedule.parse("serial/seg/cublas"))
    bad_n = a2a("gemm_a2a", 2, n=36, dtype="fp16")  # 72-byte rows
    assert (
        "n=36"
        in dict(violations(bad_n, Schedule.parse("shard/seg/cublas")))[
            "transport_needs_aligned_ranges"
        ]
    )


def test_an_sm_reserve_applies_beside_seg_as_beside_nccl():
    p = a2a("a2a_gemm", 3)
    assert is_legal(p, Schedule.parse("finer-c2-m/seg/triton+all_peers+sm16"))
    with pytest.raises(ValueError, match="sm_reserve_needs_sm_comm"):
        check_legal(p, Schedule.parse("serial/seg/triton+sm16"))  # nothing to overlap
    with pytest.raises(ValueError, match="sm_reserve_needs_sm_comm"):
        check_legal(p, Schedule.parse("shard/ce/triton+sm16"))  # the copy engine takes no SMs


def test_every_ce_schedule_of_an_all_to_all_has_a_seg_twin():
    for pattern in ("a2a_gemm", "gemm_a2a"):
        p = a2a(pattern, 3)
        found = set(enumerate_schedules(p))
        ce = {s for s in found if s.transport is Transport.CE}
        seg = {s for s in found if s.transport is Transport.SEG}
        assert {dataclasses.replace(s, transport=Transport.SEG) for s in ce} <= seg
        # the extra seg schedules are the SM reserves the copy engine has no use for
        assert all(
            s.sm_reserve
            for s in seg - {dataclasses.replace(s, transport=Transport.SEG) for s in ce}
        )


# --- the lowering ---------------------------------------------------------------------------


def _moves(plan: Plan) -> tuple[Counter, Counter]:
    transfers = Counter(plan.transfers())
    copies = Counter(
        c
        for t in plan.tasks
        for c in (t.op.copies if isinstance(t.op, TransferGroupOp) else (t.op,))
        if isinstance(c, LocalCopyOp)
    )
    return transfers, copies


@pytest.mark.parametrize("pattern", ["a2a_gemm", "gemm_a2a"])
@pytest.mark.parametrize(("world", "skewed"), [(2, False), (3, False), (3, True), (4, True)])
def test_seg_moves_exactly_what_ce_moves(pattern, world, skewed):
    p = a2a(pattern, world, skewed)
    for s in enumerate_schedules(p, SpaceOptions(transports=(Transport.CE,))):
        twin = dataclasses.replace(s, transport=Transport.SEG)
        for rank in range(world):
            assert _moves(build_plan(p, twin, rank)) == _moves(build_plan(p, s, rank)), (s, rank)


def _groups(plan: Plan) -> list:
    return [t for t in plan.tasks if isinstance(t.op, TransferGroupOp)]


def test_one_group_per_step():
    w = 3
    # serial: every peer's block and the local block in one launch
    for pattern in ("a2a_gemm", "gemm_a2a"):
        (group,) = _groups(build_plan(a2a(pattern, w), Schedule.parse("serial/seg/cublas"), 0))
        assert len(group.op.transfers) == w - 1 and len(group.op.copies) == 1
    # all_peers: one chunk index from every peer per launch
    plan = build_plan(a2a("a2a_gemm", w), Schedule.parse("finer-c4-m/seg/cublas+all_peers"), 1)
    groups = _groups(plan)
    assert len(groups) == 4
    for c, g in enumerate(groups):
        assert sorted(t.peer for t in g.op.transfers) == [0, 2]
        assert {t.tag % 4096 for t in g.op.transfers} == {c}
    # the ring: one peer's chunk per launch
    plan = build_plan(a2a("a2a_gemm", w), Schedule.parse("finer-c4-m/seg/cublas"), 1)
    assert [len(g.op.transfers) for g in _groups(plan)] == [1] * 8


def _overlaps(a, b) -> bool:
    return (
        a.buffer == b.buffer
        and a.rows[0] < b.rows[1]
        and b.rows[0] < a.rows[1]
        and a.cols[0] < b.cols[1]
        and b.cols[0] < a.cols[1]
    )


@pytest.mark.parametrize(
    "text",
    [
        "finer-c2-m/seg/cublas+all_peers",
        "finer-c4-m/seg/cublas+merged+all_peers",
        "serial/seg/cublas",
    ],
)
def test_a_combine_group_waits_for_every_gemm_that_writes_what_it_pushes(text):
    p = a2a("gemm_a2a", 4, skewed=True)
    for rank in range(4):
        plan = build_plan(p, Schedule.parse(text), rank)
        for task in _groups(plan):
            sources = [t.local for t in task.op.transfers] + [c.src for c in task.op.copies]
            writers = {
                t.id
                for t in plan.tasks
                if isinstance(t.op, GemmOp) and any(_overlaps(t.op.out, r) for r in sources)
            }
            assert writers and writers <= set(task.deps), (text, rank, task)


def test_a_dispatch_gemm_waits_for_the_group_that_brings_its_rows():
    p = a2a("a2a_gemm", 3, skewed=True)
    plan = build_plan(p, Schedule.parse("finer-c2-m/seg/cublas+all_peers"), 0)
    for task in plan.tasks:
        if isinstance(task.op, GemmOp) and task.op.a.buffer == "x_recv":
            bringers = {
                g.id
                for g in _groups(plan)
                if any(_overlaps(t.local, task.op.a) for t in g.op.transfers)
            }
            assert bringers and bringers <= set(task.deps)


def test_a_group_is_all_pulls_or_all_pushes():
    pull = TransferOp(1, "recv", *(view_region("x"),) * 2, 0, "receiver")
    push = TransferOp(1, "send", *(view_region("y"),) * 2, 1, "sender")
    with pytest.raises(ValueError, match="all be pulls"):
        TransferGroupOp((pull, push))
    with pytest.raises(ValueError, match="at least one"):
        TransferGroupOp(())


def view_region(buffer: str):
    from ficco.plan import Region

    return Region(buffer, (0, 2), (0, 4))


# --- CPU execution (gloo) -------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["a2a_gemm", "gemm_a2a"])
@pytest.mark.parametrize(("world", "skewed"), [(2, False), (2, True), (3, False), (3, True)])
def test_seg_schedules_verify_on_gloo(pattern, world, skewed):
    p = a2a(pattern, world, skewed)
    schedules = seg_schedules(p)
    assert any(s.granularity.value == "serial" for s in schedules)
    if world >= 3:
        assert any(s.order.value == "all_peers" for s in schedules)
    results = run_problem(p, schedules, backend="cpu")
    assert [r.schedule for r in results] == [str(s) for s in schedules]
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def drop_group_copies(plan: Plan) -> Plan:
    """Forget the local block of every group (as a lowering that lost it would)."""
    tasks = []
    for t in plan.tasks:
        if isinstance(t.op, TransferGroupOp) and t.op.copies and t.op.transfers:
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, copies=()))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


def _shift(op: TransferOp) -> TransferOp:
    """One row off, both halves alike (sizes still pair)."""
    lo, hi = op.local.rows
    rlo, rhi = op.remote.rows
    if op.direction == "recv":
        local, remote = (lo, hi - 1), (rlo + 1, rhi)
    else:
        local, remote = (lo + 1, hi), (rlo, rhi - 1)
    return dataclasses.replace(
        op,
        local=dataclasses.replace(op.local, rows=local),
        remote=dataclasses.replace(op.remote, rows=remote),
    )


def shift_group_members(plan: Plan) -> Plan:
    tasks = []
    for t in plan.tasks:
        op = t.op
        if isinstance(op, TransferGroupOp):
            op = dataclasses.replace(op, transfers=tuple(_shift(m) for m in op.transfers))
        elif isinstance(op, TransferOp):
            op = _shift(op)
        tasks.append(dataclasses.replace(t, op=op))
    return dataclasses.replace(plan, tasks=tuple(tasks))


@pytest.mark.parametrize(
    ("pattern", "world", "schedule", "hook"),
    [
        ("a2a_gemm", 2, "serial/seg/cublas", drop_group_copies),
        ("gemm_a2a", 2, "serial/seg/cublas", drop_group_copies),
        ("a2a_gemm", 3, "finer-c2-m/seg/cublas+all_peers", shift_group_members),
        ("gemm_a2a", 3, "finer-c2-m/seg/cublas+all_peers", shift_group_members),
    ],
)
def test_the_verifier_catches_a_broken_group(pattern, world, schedule, hook):
    (result,) = run_problem(
        a2a(pattern, world), [Schedule.parse(schedule)], backend="cpu", plan_hook=hook
    )
    assert result.verdict is Verdict.INCORRECT


# --- the CUDA primitives' group op, on CPU tensors under the interpreter ---------------------


class _Handle:
    def __init__(self) -> None:
        self.signals: list[tuple[int, int]] = []

    def put_signal(self, peer: int, channel: int) -> None:
        self.signals.append((peer, channel))


class _Ctx:
    device = "cpu"


def _segment_prims(p: Problem, schedule: Schedule, rank: int):
    pytest.importorskip("triton")
    from ficco.execute.segment import SegmentPrimitives

    plans = [build_plan(p, schedule, r) for r in range(p.world)]
    tensors = [allocate(plans[r], seed=r + 1) for r in range(p.world)]

    class Prims(SegmentPrimitives):
        def __init__(self) -> None:
            self.plan, self.ctx = plans[rank], _Ctx()
            self.handles = {spec.name: _Handle() for spec in self.plan.buffers}
            self.bufs = type("Bufs", (), {"handles": self.handles})()
            tags = sorted({t.tag for t in self.plan.transfers()})
            self.channel_of = {tag: i for i, tag in enumerate(tags)}
            self.signalled, _ = push_signal_points(self.plan)

        def view(self, region):
            return view(tensors[rank], region)

        def peer_view(self, name, peer, region):
            return view(tensors[peer], region)

    return Prims(), tensors


@pytest.mark.parametrize("pattern", ["a2a_gemm", "gemm_a2a"])
@pytest.mark.parametrize("text", ["serial/seg/triton", "finer-c2-m/seg/triton+all_peers+sm16"])
def test_the_cuda_group_op_copies_every_segment_and_signals_each_peer_and_tag_once(pattern, text):
    p = a2a(pattern, 3, skewed=True)
    rank = 1
    prims, tensors = _segment_prims(p, Schedule.parse(text), rank)
    gen = torch.Generator().manual_seed(7)
    for t in tensors:
        if "y_local" in t:  # the combine's source, which the GEMMs would have written
            t["y_local"].copy_(torch.randn(t["y_local"].shape, generator=gen))
        for name in ("x_recv", "y"):  # the destinations: poisoned, so an uncopied row shows
            if name in t:
                t[name].fill_(float("nan"))
    prims.prepare_segments()
    groups = _groups(prims.plan)
    assert groups
    for task in groups:
        prims.transfer_group(task.op, task.id)
    pushes = []
    for task in groups:
        kernel = prims._segment_kernel(task.op)
        programs = kernel.grid[0] * kernel.grid[1]
        if "+sm16" in text:  # one program per reserved SM, at least one per segment
            assert programs <= max(16 + kernel.grid[0], kernel.grid[0])
        for m in task.op.transfers:
            here = view(tensors[rank], m.local)
            there = view(tensors[m.peer], m.remote)
            assert torch.equal(here, there), (text, m)
            if m.direction == "send":
                pushes.append((m.peer, prims.channel_of[m.tag]))
        for c in task.op.copies:
            assert torch.equal(view(tensors[rank], c.src), view(tensors[rank], c.dst))
    signals = [s for h in prims.handles.values() for s in h.signals]
    assert sorted(signals) == sorted(set(pushes))
    assert bool(pushes) == (pattern == "gemm_a2a")


# --- the benchmark that shows where each transport wins --------------------------------------


def _bench_moe():
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    return importlib.import_module("bench_moe")


def test_bench_moe_times_the_seg_schedules_beside_ce_and_nccl():
    bench = _bench_moe()
    for pattern in ("a2a_gemm", "gemm_a2a"):
        p = Problem(pattern=pattern, m=4096, n=1024, k=512, world=2, experts=8)
        found = bench.candidates(p)
        assert {s.transport.value for s in found} == {"ce", "nccl", "seg"}
        ce = {s for s in found if s.transport is Transport.CE}
        seg = {s for s in found if s.transport is Transport.SEG}
        # cuBLAS and no SM reserve: every ce schedule has its seg twin and no more
        assert seg == {dataclasses.replace(s, transport=Transport.SEG) for s in ce}


def test_bench_moe_says_where_each_transport_wins():
    bench = _bench_moe()

    def row(pattern, times):
        candidates = {
            name: {"kind": "schedule", "verdict": "ok", "median_ms": ms}
            for name, ms in times.items()
        }
        candidates["serial_eager"] = {"kind": "baseline", "verdict": "ok", "median_ms": 0.1}
        candidates["shard/seg/cublas+hi"] = {
            "kind": "schedule",
            "verdict": "incorrect",
            "median_ms": 0.01,
        }
        return {"problem": {"pattern": pattern}, "candidates": candidates}

    rows = [
        row(
            "a2a_gemm", {"serial/nccl/cublas": 4.0, "shard/ce/cublas": 2.0, "shard/seg/cublas": 1.0}
        ),
        row(
            "a2a_gemm",
            {"serial/nccl/cublas": 4.0, "shard/ce/cublas": 2.0, "serial/seg/cublas": 4.0},
        ),
    ]
    where = bench.by_transport(rows)["a2a_gemm"]
    assert {t: (e["problems"], e["wins"]) for t, e in where.items()} == {
        "nccl": (2, 0),
        "ce": (2, 1),
        "seg": (2, 1),  # the incorrect (and faster) seg schedule never counts
    }
    assert where["seg"]["best_vs_best"] == pytest.approx(2**0.5)  # 1.0 and 2.0
    assert where["ce"]["best_vs_best"] == pytest.approx(2**0.5)
    assert where["nccl"]["best_vs_best"] == pytest.approx(8**0.5)
