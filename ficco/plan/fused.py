"""Lowering of ``+fused`` schedules of the dense patterns: one persistent GEMM per rank.

ag_gemm: the transfers stay tasks on the comm stream (one pull per peer chunk, each followed
by a :class:`SignalOp` that sets that chunk's flag once the copy has landed). The fused GEMM
depends on nothing: its local-shard chunks come first and read ``a_shard`` in place; every
peer chunk's tiles wait inside the kernel on the chunk's flag. Chunks, and so tiles, are
taken in the order the copies are issued (local first, then the ring or all-peers order).

gemm_rs: the fused GEMM's epilogue stores each tile of a peer's row block straight into
that peer's ``staging`` (zero-copy, symmetric memory) and the chunk's last tile sets the
owner's flag for ``(source rank, chunk)``; the local block goes to ``partial`` and flags
itself the same way. The owner reduces each chunk as soon as the flags of all W sources are
set (a :class:`WaitFlagsOp`, then the reduction), beside the rest of its own GEMM.

gemm_ar (direct all-reduce, row chunks of the whole M): a one-shot all-reduce done by the
producer. Every rank's fused GEMM computes each tile of chunk j once and stores it into its
own ``staging`` row block ``rank`` and, zero-copy, into the same block of every peer's
``staging`` (a :class:`FusedChunk` with one :class:`FusedCopy` per peer); the chunk's last tile
sets every destination's flag for ``(rank, j)``. Each rank waits for the W sources' flags of
chunk j and reduces the W staged partials in rank order into its rows of ``c``, so every rank
holds the same bits, beside the rest of its GEMM. Staging is ``[W*M, N]`` per rank, the
buffer every gemm_ar schedule already allocates. ``+rs_ag`` schedules lower through gemm_rs's
fused plan (``ficco.plan.allreduce``).

Flag slots: ``flag_slot(source, chunk, chunks)`` on the rank that waits, so no two sources
ever write one slot.
"""

from __future__ import annotations

from collections.abc import Callable

from ficco.defaults import FLAG_SLOTS
from ficco.plan.build import (
    Builder,
    peer_steps,
    visit_order,
)
from ficco.plan.ops import (
    PULL,
    BufferSpec,
    Direction,
    FusedChunk,
    FusedCopy,
    FusedGemmOp,
    Plan,
    ReduceOp,
    Region,
    SignalOp,
    Stream,
    TransferOp,
    WaitFlagsOp,
    flag_slot,
)
from ficco.plan.tags import transfer_tag
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.space.geometry import cut


def _check_slots(p: Problem, chunks: int) -> None:
    if p.world * chunks > FLAG_SLOTS:
        raise ValueError(
            f"chunks: a fused plan needs world x chunks = {p.world * chunks} flag slots, "
            f"more than the {FLAG_SLOTS} of ficco.defaults.FLAG_SLOTS"
        )


def plan_ag_gemm_fused(p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]) -> Plan:
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    pieces = cut(S, s)
    n = len(pieces)
    _check_slots(p, n)
    steps = peer_steps(rank, w, False)
    bld = Builder()
    chunks: list[FusedChunk] = []
    for i, j in visit_order(s, w, n, local_last=False):
        src, dst = steps[i]
        lo, hi = pieces[j]
        out = Region("c", (src * S + lo, src * S + hi), (0, N))
        if src == rank:  # the local shard: read in place, no flag
            chunks.append(FusedChunk(Region("a_shard", (lo, hi), (0, K)), out, rank))
            continue
        slot = flag_slot(src, j, n)
        gathered = Region("a_full", (src * S + lo, src * S + hi), (0, K))
        recv = bld.add(
            TransferOp(
                src,
                Direction.RECV,
                gathered,
                Region("a_shard", (lo, hi), (0, K)),
                transfer_tag(i, j),
                PULL,
            ),
            Stream.COMM,
            chunk=(src, j),
        )
        bld.add(
            TransferOp(
                dst,
                Direction.SEND,
                Region("a_shard", (lo, hi), (0, K)),
                Region("a_full", (rank * S + lo, rank * S + hi), (0, K)),
                transfer_tag(i, j),
                PULL,
            ),
            Stream.COMM,
            chunk=(dst, j),
        )
        bld.add(SignalOp(slot), Stream.COMM, [recv], chunk=(src, j))
        chunks.append(FusedChunk(gathered, out, rank, wait=slot))
    # after the comm tasks in program order: every send is posted before anything waits
    bld.add(
        FusedGemmOp(Region("b", (0, K), (0, N)), tuple(chunks)), Stream.COMPUTE, chunk=(rank, -1)
    )
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c")


def plan_gemm_rs_fused(p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]) -> Plan:
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    pieces = cut(S, s)
    n = len(pieces)
    _check_slots(p, n)
    steps = peer_steps(rank, w, True)  # peers' blocks first, the local block last
    bld = Builder()
    chunks: list[FusedChunk] = []
    for i, j in visit_order(s, w, n, local_last=True):
        _, dst = steps[i]
        lo, hi = pieces[j]
        a = Region("a", (dst * S + lo, dst * S + hi), (0, K))
        # the owner's staging row block `rank` holds this rank's partial of the owner's rows
        name = "partial" if dst == rank else "staging"
        out = Region(name, (rank * S + lo, rank * S + hi), (0, N))
        chunks.append(FusedChunk(a, out, dst, signal=(dst, flag_slot(rank, j, n))))

    def inputs(lo: int, hi: int) -> tuple[Region, ...]:
        own = Region("partial", (rank * S + lo, rank * S + hi), (0, N))
        staged = tuple(
            Region("staging", (src * S + lo, src * S + hi), (0, N))
            for src in range(w)
            if src != rank
        )
        return (own, *staged)

    _gemm_then_reduce(bld, p, rank, chunks, pieces, inputs, "c_shard")
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c_shard")


def _gemm_then_reduce(
    bld: Builder,
    p: Problem,
    rank: int,
    chunks: list[FusedChunk],
    pieces: list[tuple[int, int]],
    inputs: Callable[[int, int], tuple[Region, ...]],
    out: str,
) -> None:
    """The fused GEMM over ``chunks``, then per row piece: wait for the flags of all W sources
    of that piece, and reduce ``inputs(lo, hi)`` into rows [lo, hi) of ``out``."""
    n = len(pieces)
    b = Region("b", (0, p.k), (0, p.n))
    bld.add(FusedGemmOp(b, tuple(chunks)), Stream.COMPUTE, chunk=(rank, -1))
    for j, (lo, hi) in enumerate(pieces):
        landed = bld.add(
            WaitFlagsOp(tuple(flag_slot(src, j, n) for src in range(p.world))),
            Stream.COMM,
            chunk=(rank, j),
        )
        bld.add(
            ReduceOp(inputs(lo, hi), Region(out, (lo, hi), (0, p.n))),
            Stream.COMPUTE,
            [landed],
            chunk=(rank, j),
        )


def plan_gemm_ar_fused(p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]) -> Plan:
    w, M, K, N = p.world, p.m, p.k, p.n
    pieces = cut(M, s)  # a direct all-reduce cuts the whole M
    n = len(pieces)
    _check_slots(p, n)
    peers = [(rank + i) % w for i in range(1, w)]  # each source starts at a different peer

    def staged(src: int, lo: int, hi: int) -> Region:
        return Region("staging", (src * M + lo, src * M + hi), (0, N))

    bld = Builder()
    chunks: list[FusedChunk] = []
    for j, (lo, hi) in enumerate(pieces):
        slot = flag_slot(rank, j, n)
        mine = staged(rank, lo, hi)  # this rank's row block on every rank: same offsets
        copies = tuple(FusedCopy(mine, dst, (dst, slot)) for dst in peers)
        a = Region("a", (lo, hi), (0, K))
        chunks.append(FusedChunk(a, mine, rank, signal=(rank, slot), copies=copies))
    # reduced in rank order on every rank: the same sum, bit for bit, everywhere
    _gemm_then_reduce(
        bld,
        p,
        rank,
        chunks,
        pieces,
        lambda lo, hi: tuple(staged(src, lo, hi) for src in range(w)),
        "c",
    )
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c")
