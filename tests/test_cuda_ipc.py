"""The signal handshake of ranks that share a GPU (``ficco.execute.cuda_ipc``) without a GPU.

Stream memory operations are modelled on host tensors: each stream is a queue of waits
(``>=``, cyclic, as ``cuStreamWaitValue32``) and writes, and :meth:`Streams.drain` runs every
stream as far as its waits allow, as the GPU would. What a stream is left holding is what would
stall it for ever. Symmetric memory's handshake is the rule: a second signal on a channel waits
until the first is consumed, so two ranks that each signal twice before they wait block each
other (the hang emb_a2a's ``seg`` schedules met on two GPUs, which a pad write that never
waits could not show)."""

from collections import defaultdict

import pytest
import torch

from ficco.execute.cuda_ipc import (
    SIGNAL_CHANNELS,
    SIGNAL_RELEASE,
    IpcHandle,
    reaches,
    unmet,
)


class Streams:
    """Host stand-in for stream memory operations: ops queue on ``current`` until drained."""

    def __init__(self) -> None:
        self.queues: dict[str, list] = defaultdict(list)
        self.current = ""

    def wait(self, flag, value: int) -> None:
        self.queues[self.current].append(("wait", flag, value))

    def write(self, flag, value: int) -> None:
        self.queues[self.current].append(("write", flag, value))

    def drain(self) -> dict[str, int]:
        """Run every stream until none can move; returns the stalled ones' queue lengths."""
        moved = True
        while moved:
            moved = False
            for queue in self.queues.values():
                while queue:
                    kind, flag, value = queue[0]
                    if kind == "wait" and not reaches(read(flag), value):
                        break
                    if kind == "write":
                        flag.fill_(value)
                    queue.pop(0)
                    moved = True
        return {name: len(q) for name, q in self.queues.items() if q}


def read(flag) -> int:
    return int(flag.item()) & 0xFFFFFFFF


def ranks(world: int = 2):
    """Every rank's handle over shared host pads, issuing into one ``Streams``."""
    streams = Streams()
    pads = [torch.zeros(SIGNAL_CHANNELS * world, dtype=torch.int32) for _ in range(world)]
    buffers = [torch.zeros(4) for _ in range(world)]
    return streams, [IpcHandle(r, world, buffers, pads, memory=streams) for r in range(world)]


def on(streams: Streams, name: str) -> Streams:
    streams.current = name
    return streams


def test_the_cyclic_comparison_and_the_release_value():
    assert reaches(0, 0) and reaches(1, 1) and reaches(4, 3)
    assert not reaches(0, 1) and not reaches(2, 3)
    assert reaches(0, 0x80000001) and not reaches(1, 0x80000001)  # cyclic, as the driver's
    # the release satisfies every wait a run can issue (a million signals on one channel)
    assert all(reaches(SIGNAL_RELEASE, target) for target in (0, 1, 2, 7, 2_000_001))


def test_a_signal_then_its_wait_completes_and_counts():
    streams, (h0, h1) = ranks()
    on(streams, "rank0")
    h0.put_signal(1, channel=5)
    on(streams, "rank1")
    h1.wait_signal(0, channel=5)
    assert streams.drain() == {}
    assert read(h1.flag_of("wait", 0, 5)) == 2  # one landed, one consumed
    assert unmet(h0, read) == [] and unmet(h1, read) == []


def test_a_second_signal_waits_until_the_first_is_consumed():
    streams, (h0, h1) = ranks()
    on(streams, "rank0")
    h0.put_signal(1, channel=5)
    h0.put_signal(1, channel=5)
    assert streams.drain() == {"rank0": 2}  # the second signal's wait and write stay queued
    assert unmet(h0, read) == [
        "signals to rank 1 on channel 5: 2 put, 1 landed, 0 consumed (a signal waits until "
        "its predecessor is consumed)"
    ]
    on(streams, "rank1")
    h1.wait_signal(0, channel=5)  # consumes the first: the second lands
    assert streams.drain() == {}
    assert read(h0.flag_of("put", 1, 5)) == 3
    h1.wait_signal(0, channel=5)
    assert streams.drain() == {} and unmet(h0, read) == [] and unmet(h1, read) == []


def test_ranks_that_each_signal_twice_before_they_wait_hang_naming_the_channel():
    """The seg schedules' old per-transfer signals: each rank pushes two runs under one tag
    to the other and signals after each, then waits for the peer's, all on one stream."""
    streams, handles = ranks()
    for rank, h in enumerate(handles):
        on(streams, f"rank{rank}")
        h.put_signal(1 - rank, channel=3)
        h.put_signal(1 - rank, channel=3)
        h.wait_signal(1 - rank, channel=3)
    assert streams.drain() == {"rank0": 4, "rank1": 4}
    for rank, h in enumerate(handles):
        peer = 1 - rank
        assert unmet(h, read) == [
            f"signals to rank {peer} on channel 3: 2 put, 1 landed, 0 consumed (a signal "
            "waits until its predecessor is consumed)",
            f"signals from rank {peer} on channel 3: 1 awaited, 1 arrived",
        ]


def test_one_signal_per_channel_never_blocks_either_rank():
    streams, handles = ranks(3)
    for rank, h in enumerate(handles):
        on(streams, f"rank{rank}")
        for peer in range(3):
            if peer != rank:
                for channel in (0, 1, 2):
                    h.put_signal(peer, channel)
        for peer in range(3):
            if peer != rank:
                for channel in (0, 1, 2):
                    h.wait_signal(peer, channel)
    assert streams.drain() == {}
    assert all(unmet(h, read) == [] for h in handles)


def test_a_signal_never_sent_is_named_and_the_release_frees_every_stalled_stream():
    streams, (h0, h1) = ranks()
    on(streams, "rank1")
    h1.wait_signal(0, channel=7)
    on(streams, "rank0")
    h0.put_signal(1, channel=2)
    h0.put_signal(1, channel=2)
    assert streams.drain() == {"rank0": 2, "rank1": 2}
    assert unmet(h1, read) == ["signals from rank 0 on channel 7: 1 awaited, 0 arrived"]
    # what settle does past its deadline: every slot the run used set to the release value
    on(streams, "release")
    for h in (h0, h1):
        for kind, peer, channel, _ in h.used_slots():
            h.flag_of(kind, peer, channel).fill_(SIGNAL_RELEASE)
    assert streams.drain() == {}


def test_a_run_counts_from_zero_on_cleared_pads():
    streams, (h0, h1) = ranks()
    for _ in range(3):  # three runs: each clears its pads and restarts its counts
        for h in (h0, h1):
            h.clear()
            h.restart()
        on(streams, "rank0")
        h0.put_signal(1, channel=1)
        on(streams, "rank1")
        h1.wait_signal(0, channel=1)
        assert streams.drain() == {}
        assert read(h1.flag_of("wait", 0, 1)) == 2


def test_a_channel_outside_the_pad_is_refused_naming_it():
    _, (h0, _h1) = ranks()
    with pytest.raises(ValueError, match=r"channel: must be in \[0, 1024\), got 1024"):
        h0.put_signal(1, channel=SIGNAL_CHANNELS)


def test_the_shared_backend_waits_for_a_run_through_the_bounded_settle(monkeypatch):
    """``CudaSharedBackend.synchronize`` (after every verification run) and ``recover`` go
    through ``settle`` with the problem's handles, the side streams and a bound under the
    pool's no-progress limit, so a hung handshake is an error, not a stalled rank."""
    import types

    from ficco.execute import cuda_shared

    calls = []
    monkeypatch.setattr(cuda_shared, "settle", lambda *args: calls.append(args))
    ctx = types.SimpleNamespace(
        rank=1,
        world=2,
        timeout_s=30.0,
        nccl_ce_error=None,
        comm={"normal": "comm", "high": "comm-hi"},
        signal={"normal": "sig", "high": "sig-hi"},
        fence=types.SimpleNamespace(before=None),
    )
    backend = cuda_shared.CudaSharedBackend(ctx)
    _, (_h0, h1) = ranks()
    backend._handles = {"y": h1}
    backend.synchronize()
    handles, timeout_s, rank, streams, _host = calls[-1]
    assert handles == [("y", h1)] and rank == 1
    assert timeout_s == 15.0  # half the ranks' 30 s: the error comes before the pool's kill
    assert streams == ["comm", "comm-hi", "sig", "sig-hi"]
    h1.pads[1].fill_(3)
    backend.recover()
    assert len(calls) == 2 and h1.pads[1].eq(0).all()  # settled, then the pad cleared


def issue_signals(problem, schedule, every_push: bool):
    """Every rank's signal ops of one run of ``schedule``, in plan order, into one
    ``Streams``: pushes signal on the rank's comm stream, passive receives wait on its signal
    stream (as ``CudaPrimitives`` issues them). ``every_push``: each pushed transfer signals,
    as ``seg`` did before ``push_signal_points`` (the hang on two GPUs), instead of once per
    (peer, tag). Returns the streams and every (rank, buffer) handle."""
    from ficco.plan import TransferGroupOp, TransferOp, build_plan
    from ficco.plan.tags import push_signal_points, signal_channel

    world, streams, handles = problem.world, Streams(), {}

    def handle(rank: int, name: str) -> IpcHandle:
        if (rank, name) not in handles:
            pads = [torch.zeros(SIGNAL_CHANNELS * world, dtype=torch.int32) for _ in range(world)]
            for r in range(world):  # every rank's handle of a buffer shares its pads
                handles[r, name] = IpcHandle(r, world, [None] * world, pads, memory=streams)
        return handles[rank, name]

    for rank in range(world):
        plan = build_plan(problem, schedule, rank)
        signalled, awaited = push_signal_points(plan)
        for task in plan.tasks:
            ops = task.op.transfers if isinstance(task.op, TransferGroupOp) else (task.op,)
            for op in ops:
                if not isinstance(op, TransferOp) or op.initiator != "sender":
                    continue
                channel = signal_channel(op.tag, schedule.chunks)
                if op.direction == "send" and (every_push or op in signalled):
                    on(streams, f"rank{rank}/comm")
                    handle(rank, op.remote.buffer).put_signal(op.peer, channel)
                elif op.direction == "recv" and op in awaited:
                    on(streams, f"rank{rank}/signal")
                    handle(rank, op.local.buffer).wait_signal(op.peer, channel)
    return streams, handles


def test_seg_batch_chunks_signalling_every_push_hang_in_the_lane_naming_the_channel():
    """emb_a2a's finer-c2-b/seg on two GPUs: a batch chunk pushes a run per table under one
    tag. Signalled once per (peer, tag) every signal meets its wait; signalled per push, as
    before the fix, the chunk's later signals wait for consumptions that never come, so the
    lane's run stalls, and what it names is the channel."""
    from ficco.problem import Problem
    from ficco.space import Schedule

    problem = Problem(
        pattern="emb_a2a", m=1001, n=128, k=8, world=2,
        tables=(50000, 30, 20000, 700, 9), bags=(1, 8, 3, 5, 2),
    )  # fmt: skip
    schedule = Schedule.parse("finer-c2-b/seg/triton+sm32+hi")
    streams, handles = issue_signals(problem, schedule, every_push=False)
    assert streams.drain() == {}
    assert all(unmet(h, read) == [] for h in handles.values())
    streams, handles = issue_signals(problem, schedule, every_push=True)
    # rank 0 pushes three runs per tag: its third signal on channel 0 waits for a second
    # consumption that never comes, its channel 1 signals queue behind it on the comm stream,
    # and rank 1's wait on channel 1 stalls too (rank 1 pushes two runs: its second signal
    # lands once rank 0 consumed the first)
    assert set(streams.drain()) == {"rank0/comm", "rank1/signal"}
    assert unmet(handles[0, "y"], read)[0].startswith(
        "signals to rank 1 on channel 0: 3 put, 2 landed, 1 consumed"
    )
    assert unmet(handles[1, "y"], read) == [
        "signals from rank 0 on channel 1: 1 awaited, 0 arrived"
    ]
