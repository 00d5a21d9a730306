"""One signal per (peer, tag) on pushed copies: a chunk of several pushes under one tag
(emb_a2a's batch chunks, a run per table) signals once, after its last push, and is awaited
once, at its first receive; symmetric memory's signal is a 0 -> 1 handshake, so a second
signal on a channel blocks until the first is consumed (two ranks whose pushes and receives
share a stream would wait on each other). Plans of one push per tag keep a signal each.
The ``seg`` transport's pushes (members of one group op per step) signal the same way."""

from collections import defaultdict

import pytest

from ficco.plan import TransferGroupOp, TransferOp, build_plan
from ficco.plan.tags import push_signal_points
from ficco.problem import Problem
from ficco.space import Transport, enumerate_schedules

PROBLEMS = (
    Problem(pattern="emb_a2a", m=10, n=8, k=3, world=3, tables=(50, 7, 300, 20, 9)),
    Problem(pattern="gemm_rs", m=30, n=40, k=24, world=3),
    Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3),
    Problem(
        pattern="gemm_a2a",
        m=60,
        n=40,
        k=24,
        world=3,
        experts=6,
        routing=((5, 0, 3, 2, 4, 6), (1, 9, 0, 4, 2, 4), (10, 2, 2, 2, 2, 2)),
    ),
)


def pushes(plan):
    """Per (peer, tag): this rank's pushes and its passive receives, in task order."""
    sent, received = defaultdict(list), defaultdict(list)
    for task in plan.tasks:
        # a seg step's pushes are one group op: its members push, in order
        ops = task.op.transfers if isinstance(task.op, TransferGroupOp) else (task.op,)
        for op in ops:
            if isinstance(op, TransferOp) and op.initiator == "sender":
                (sent if op.direction == "send" else received)[op.peer, op.tag].append(op)
    return sent, received


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.pattern.value)
def test_one_signal_per_peer_and_tag_after_its_last_push(problem):
    several = 0
    for schedule in enumerate_schedules(problem):
        if schedule.transport not in (Transport.CE, Transport.SEG):
            continue
        plans = [build_plan(problem, schedule, r) for r in range(problem.world)]
        ops = [pushes(plan) for plan in plans]
        for rank, plan in enumerate(plans):
            signalled, awaited = push_signal_points(plan)
            sent, received = ops[rank]
            assert signalled == {run[-1] for run in sent.values()}, (str(schedule), rank)
            assert awaited == {run[0] for run in received.values()}, (str(schedule), rank)
            several += sum(len(run) > 1 for run in sent.values())
            # each signal meets exactly one wait: the tags pushed to a peer are those it awaits
            for peer in range(problem.world):
                to_peer = {tag for (q, tag) in sent if q == peer}
                awaited_there = {tag for (q, tag) in ops[peer][1] if q == rank}
                assert to_peer == awaited_there, (str(schedule), rank, peer)
    # the batch chunks (and only emb_a2a's) push several runs under one tag
    assert (several > 0) == (problem.pattern.value == "emb_a2a"), several


def test_a_seg_group_signals_each_peer_and_tag_once():
    """``SegmentPrimitives.transfer_group`` (the seg transport on GPUs) signals only at the
    plan's signal points: on 2 GPUs a batch chunk's second signal on a channel hung the run
    (``finer-c2-b/seg``), while ranks sharing a GPU, whose signals do not block, passed."""
    from ficco.execute.segment import SegmentPrimitives
    from ficco.space import Schedule

    problem = PROBLEMS[0]

    class Handle:
        def __init__(self, signals, name):
            self.signals, self.name = signals, name

        def put_signal(self, peer, channel=0):
            self.signals[peer, channel] += 1

    class Prims(SegmentPrimitives):
        def __init__(self, plan):
            self.plan = plan
            self.signals = defaultdict(int)
            self.bufs = type("Bufs", (), {})()
            self.bufs.handles = defaultdict(lambda: Handle(self.signals, "peer buffer"))
            self.channel_of = {t.tag: t.tag for t in plan.transfers()}
            self.signalled, _ = push_signal_points(plan)

        def _segment_kernel(self, op):
            return lambda: None  # the copy itself is the GPU's: only the signals are checked

    several = 0
    for schedule in ("finer-c2-b/seg/triton", "finer-c3-b/seg/cublas+merged"):
        for rank in range(problem.world):
            plan = build_plan(problem, Schedule.parse(schedule), rank)
            prims = Prims(plan)
            sent, _ = pushes(plan)
            for task in plan.tasks:
                if isinstance(task.op, TransferGroupOp):
                    prims.transfer_group(task.op, task.id)
            assert dict(prims.signals) == {(peer, tag): 1 for (peer, tag) in sent}, schedule
            several += sum(len(run) > 1 for run in sent.values())
    assert several > 0  # the plans do push several runs under one tag
