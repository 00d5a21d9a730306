"""Building plans: values made in bulk, and what every lowering shares (the task builder,
a ring step's transfer pair, the peer orders).

Split from the plan vocabulary (``ficco.plan.ops``): the lowerings build with these; the
executors, the cost model and the tests read plans through the vocabulary alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from ficco.plan.ops import (
    PULL,
    PUSH,
    Direction,
    GemmOp,
    Initiator,
    Op,
    Region,
    Stream,
    Task,
    TransferOp,
)
from ficco.space import Granularity, Order, Schedule

# --- values made in bulk --------------------------------------------------------------------
# A plan at W = 64 holds tens of thousands of regions, GEMMs, transfers and tasks. A frozen
# dataclass's generated __init__ sets each field through object.__setattr__; these set the
# slots directly, making the same values (equal, hashing and printing alike) in about 60% of
# the time. Each takes every field, in declaration order (checked here, at import).


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple:
    declared = tuple(f.name for f in dataclasses.fields(cls))
    if declared != names or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: its fast constructor is out of date with its fields")
    return tuple(cls.__dict__[name].__set__ for name in names)


_new = object.__new__
_region_buffer, _region_rows, _region_cols, _region_index = _slot_setters(
    Region, ("buffer", "rows", "cols", "index")
)
_gemm_a, _gemm_b, _gemm_out, _gemm_accumulate = _slot_setters(
    GemmOp, ("a", "b", "out", "accumulate")
)
_xfer_peer, _xfer_direction, _xfer_local, _xfer_remote, _xfer_tag, _xfer_initiator = _slot_setters(
    TransferOp, ("peer", "direction", "local", "remote", "tag", "initiator")
)
_task_id, _task_op, _task_stream, _task_deps, _task_chunk = _slot_setters(
    Task, ("id", "op", "stream", "deps", "chunk")
)


def region(buffer: str, rows: tuple[int, int], cols: tuple[int, int]) -> Region:
    """``Region(buffer, rows, cols)`` (2-D), made in bulk."""
    obj = _new(Region)
    _region_buffer(obj, buffer)
    _region_rows(obj, rows)
    _region_cols(obj, cols)
    _region_index(obj, None)
    return obj


def gemm_op(a: Region, b: Region, out: Region, accumulate: bool = False) -> GemmOp:
    """``GemmOp(a, b, out, accumulate)``, made in bulk."""
    obj = _new(GemmOp)
    _gemm_a(obj, a)
    _gemm_b(obj, b)
    _gemm_out(obj, out)
    _gemm_accumulate(obj, accumulate)
    return obj


def _transfer_op(
    peer: int,
    direction: Direction,
    local: Region,
    remote: Region,
    tag: int,
    initiator: Initiator,
) -> TransferOp:
    obj = _new(TransferOp)
    _xfer_peer(obj, peer)
    _xfer_direction(obj, direction)
    _xfer_local(obj, local)
    _xfer_remote(obj, remote)
    _xfer_tag(obj, tag)
    _xfer_initiator(obj, initiator)
    return obj


def _task(tid: int, op: Op, stream: Stream, deps: tuple[int, ...], chunk) -> Task:
    obj = _new(Task)
    _task_id(obj, tid)
    _task_op(obj, op)
    _task_stream(obj, stream)
    _task_deps(obj, deps)
    _task_chunk(obj, chunk)
    return obj


# --- what the lowerings share ---------------------------------------------------------------


@dataclass
class Builder:
    tasks: list[Task] = field(default_factory=list)

    def add(self, op: Op, stream: Stream, deps=(), chunk=None) -> int:
        tasks = self.tasks
        tid = len(tasks)
        # most tasks have no dependency or one: skip the set and the sort for them
        if not deps:
            deps = ()
        elif type(deps) in (list, tuple) and len(deps) == 1:
            deps = () if deps[0] is None else (deps[0],)
        else:
            deps = tuple(sorted({d for d in deps if d is not None}))
        task = _new(Task)  # _task, inlined: the commonest call of a plan's build
        _task_id(task, tid)
        _task_op(task, op)
        _task_stream(task, stream)
        _task_deps(task, deps)
        _task_chunk(task, chunk)
        tasks.append(task)
        return tid


def transfer_pair(
    tag: int,
    initiator: Initiator,
    send: tuple[int, Region, Region],
    recv: tuple[int, Region, Region],
) -> tuple[TransferOp, TransferOp]:
    """The (send, receive) ops of one ring step of one chunk (see :func:`exchange`)."""
    if initiator not in (PUSH, PULL):
        raise ValueError(f"initiator: {PUSH!r} (push) or {PULL!r} (pull), got {initiator!r}")
    to, send_here, send_there = send
    frm, recv_here, recv_there = recv
    return (
        _transfer_op(to, Direction.SEND, send_here, send_there, tag, initiator),
        _transfer_op(frm, Direction.RECV, recv_here, recv_there, tag, initiator),
    )


def post_pair(
    bld: Builder,
    send_op: TransferOp,
    recv_op: TransferOp,
    send_deps: Iterable[int | None] = (),
    chunk: int | None = None,
) -> int:
    """Both halves of a :func:`transfer_pair` as tasks, in the order :func:`exchange` gives
    them; returns the receive's id."""
    send_chunk = None if chunk is None else (send_op.peer, chunk)
    recv_chunk = None if chunk is None else (recv_op.peer, chunk)
    tasks = bld.tasks
    if send_op.initiator == PUSH:
        bld.add(send_op, Stream.COMM, send_deps, send_chunk)
        received = len(tasks)
        tasks.append(_task(received, recv_op, Stream.COMM, (), recv_chunk))  # no dependency
        return received
    received = len(tasks)
    tasks.append(_task(received, recv_op, Stream.COMM, (), recv_chunk))
    bld.add(send_op, Stream.COMM, send_deps, send_chunk)
    return received


def exchange(
    bld: Builder,
    tag: int,
    initiator: Initiator,
    send: tuple[int, Region, Region],
    recv: tuple[int, Region, Region],
    send_deps: Iterable[int | None] = (),
    chunk: int | None = None,
) -> int:
    """One ring step of one chunk: both halves of its two transfers, the loop every lowering
    shares. ``send = (to, here, there)``: this rank's ``here`` lands in ``there`` on rank
    ``to``, after ``send_deps``; ``recv = (frm, here, there)``: ``there`` on rank ``frm``
    lands in this rank's ``here``. Pushes list the send first (it follows the GEMM that made
    its data), pulls the receive. ``chunk``: the chunk index the tasks are tagged with
    (``(peer, chunk)``), or None for untagged whole-shard steps. Returns the receive's id."""
    return post_pair(bld, *transfer_pair(tag, initiator, send, recv), send_deps, chunk)


def peer_steps(rank: int, world: int, local_last: bool) -> list[tuple[int, int]]:
    """Ring rotation: [(recv_from, send_to)] per step; step 0 is the local shard unless
    ``local_last`` (scatters compute the local block last: it needs no transfer)."""
    steps = [((rank + i) % world, (rank - i) % world) for i in range(world)]
    if local_last:
        steps = [((rank - i) % world, (rank + i) % world) for i in range(1, world)] + [(rank, rank)]
    return steps


def visit_order(
    schedule: Schedule, world: int, n_pieces: int, local_last: bool
) -> list[tuple[int, int]]:
    """(step, chunk) pairs in issue order. The ring goes peer by peer; all_peers goes chunk by
    chunk across peers. The local step (first for gathers, last for scatters) stays whole."""
    local = world - 1 if local_last else 0
    if schedule.order is Order.ALL_PEERS:
        peers = [(i, j) for j in range(n_pieces) for i in range(world) if i != local]
    else:
        peers = [(i, j) for i in range(world) if i != local for j in range(n_pieces)]
    mine = [(local, j) for j in range(n_pieces)]
    return peers + mine if local_last else mine + peers


def uses_collective(schedule: Schedule) -> bool:
    """Serial schedules over two-sided transports (nccl, nccl_ce, the symmetric-memory
    kernels) run the collective itself, not transfers."""
    return schedule.granularity is Granularity.SERIAL and not schedule.transport.traits.one_sided
