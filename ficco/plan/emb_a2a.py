"""Lowering of emb_a2a (``ficco.patterns.emb_a2a``), shapes on rank r:

=========================  ==========================================================
buffer                     shape and layout
=========================  ==========================================================
``weights`` input          ``[sum R_t, D]``: r's tables stacked
``indices`` index (int64)  ``[T_r * B * max bag]``: bags in order, the tail unused
``offsets`` index (int64)  ``[T_r * B + 1]``: bag ``t*B + b`` (local table t, sample b)
``pooled`` workspace       ``[T_r * B, D]``: per destination d (rank order) a block of
                           ``T_r * B_d`` rows, table-major (``t*B_d + i``)
``y`` output               ``[T * B_r, D]``: row ``t*B_r + i``, global table t; source
                           s's block at ``[t0_s * B_r, t1_s * B_r)``
=========================  ==========================================================

A *block* is what one rank sends another: its tables pooled for the receiver's samples,
``T_s * B_d`` rows, contiguous on both sides. A chunk is one or more *runs* of a block's rows
(:func:`chunk_runs`): split ``m`` cuts the block's rows (``ficco.space.geometry.cut``: up to
its table count table groups, beyond it batch cuts of a table), one run a chunk; split ``b``
cuts the receiver's samples, a chunk holding those samples of every table, a run per table
(``T_s`` strided runs; runs that touch merge). A chunk's runs pool as its segments and move as
transfers sharing the chunk's tag: ``seg`` batches them in one launch, ``ce`` issues a copy
per run, NCCL one batch.

``serial`` pools every bag into ``pooled`` (one :class:`PoolOp`), then one all-to-all: NCCL's
collective, or one-sided pushes (``ce``: a task per block; ``seg``: one group). Overlapped
schedules visit the blocks as gemm_a2a's scatter does (peers first, in the ring or
``all_peers`` order, the local block last): each chunk is pooled, then pushed while the next
chunk pools; the local block is pooled straight into ``y``. ``merged`` pools a whole block
once, then pushes its chunks. ``+fused`` is one :class:`PoolOp` whose peer chunks store the
pooled rows straight into the destination's ``y`` (zero-copy) and set its flag
``flag_slot(rank, chunk, P)`` (``P``: the most chunks of any block, the same on every rank);
the rank then waits for every chunk its peers send it.
"""

from __future__ import annotations

from ficco.defaults import FLAG_SLOTS
from ficco.patterns.emb_a2a import (
    block_rows,
    max_bag,
    sample_ranges,
    table_ranges,
    weight_rows,
)
from ficco.patterns.spec import Collective
from ficco.plan.alltoall import add_serial_moves, group_chunk, issue_steps
from ficco.plan.build import (
    Builder,
    peer_steps,
    uses_collective,
    visit_order,
)
from ficco.plan.ops import (
    PUSH,
    BufferSpec,
    CollectiveOp,
    Direction,
    LocalCopyOp,
    Plan,
    PoolChunk,
    PoolOp,
    PoolSegment,
    Region,
    Stream,
    TransferGroupOp,
    TransferOp,
    WaitFlagsOp,
    flag_slot,
)
from ficco.plan.tags import transfer_tag
from ficco.problem import Problem
from ficco.space import Compute, Granularity, Schedule, Split
from ficco.space.geometry import cut


def emb_buffers(p: Problem, rank: int) -> tuple[BufferSpec, ...]:
    t0, t1 = table_ranges(p)[rank]
    b0, b1 = sample_ranges(p)[rank]
    bags, D = (t1 - t0) * p.m, p.n
    assert p.tables is not None
    return (
        BufferSpec("weights", (weight_rows(p, rank), D), "input"),
        BufferSpec("indices", (bags * max_bag(p),), "index"),
        BufferSpec("offsets", (bags + 1,), "index"),
        BufferSpec("pooled", (bags, D), "workspace"),
        BufferSpec("y", (len(p.tables) * (b1 - b0), D), "output", peer_visible=True),
    )


class _Layout:
    """Where rank ``rank``'s blocks are: rows of ``pooled`` and of every rank's ``y``."""

    def __init__(self, p: Problem, rank: int) -> None:
        self.p, self.rank = p, rank
        self.tables, self.samples = table_ranges(p), sample_ranges(p)
        self.local_tables = self.tables[rank][1] - self.tables[rank][0]

    def count(self, r: int) -> int:
        return self.samples[r][1] - self.samples[r][0]

    def pooled_base(self, dst: int) -> int:
        """First ``pooled`` row of this rank's block for ``dst``."""
        return self.local_tables * self.samples[dst][0]

    def y_base(self, src: int, dst: int) -> int:
        """First row of ``src``'s block in ``dst``'s ``y``."""
        return self.tables[src][0] * self.count(dst)

    def segments(self, dst: int, lo: int, hi: int, out: str, base: int) -> tuple:
        """Rows ``[lo, hi)`` of this rank's block for ``dst`` as pool segments (one per table
        they touch) into ``out`` from row ``base``."""
        n, b0, B = self.count(dst), self.samples[dst][0], self.p.m
        segs = []
        for t in range(self.local_tables):
            a, b = max(lo, t * n), min(hi, (t + 1) * n)
            if b > a:
                first = t * B + b0 - t * n  # the bag of block row t*n is (t, b0)
                segs.append(
                    PoolSegment(
                        (first + a, first + b), Region(out, (base + a, base + b), (0, self.p.n))
                    )
                )
        return tuple(segs)

    def pool_into(self, dst: int, runs: Runs, signal=None, fused: bool = False) -> PoolChunk:
        """Block rows ``runs`` for ``dst``: into ``pooled`` (``y`` for the local block, and
        for every block when ``fused``: the store is the transfer)."""
        if dst == self.rank or fused:
            out, base, at = "y", self.y_base(self.rank, dst), dst
        else:
            out, base, at = "pooled", self.pooled_base(dst), self.rank
        segs = tuple(g for lo, hi in runs for g in self.segments(dst, lo, hi, out, base))
        return PoolChunk(segs, at, signal)

    def push(self, dst: int, lo: int, hi: int, tag: int) -> TransferOp:
        """Block rows ``[lo, hi)`` pushed from ``pooled`` into ``dst``'s ``y``."""
        D, base, there = self.p.n, self.pooled_base(dst), self.y_base(self.rank, dst)
        return TransferOp(
            dst,
            Direction.SEND,
            Region("pooled", (base + lo, base + hi), (0, D)),
            Region("y", (there + lo, there + hi), (0, D)),
            tag,
            PUSH,
        )

    def received(self, src: int, lo: int, hi: int, tag: int) -> TransferOp:
        """The passive half of ``src``'s push of its block rows ``[lo, hi)``."""
        D, here = self.p.n, self.y_base(src, self.rank)
        there = (self.tables[src][1] - self.tables[src][0]) * self.samples[self.rank][0]
        return TransferOp(
            src,
            Direction.RECV,
            Region("y", (here + lo, here + hi), (0, D)),
            Region("pooled", (there + lo, there + hi), (0, D)),
            tag,
            PUSH,
        )


Runs = tuple[tuple[int, int], ...]


def chunk_runs(p: Problem, s: Schedule, src: int, dst: int) -> list[Runs]:
    """The chunks of ``src``'s block for ``dst``, each as its runs of block rows ``[lo, hi)``
    in order: split ``m`` one run a chunk; split ``b`` the chunk's samples of every table of
    ``src`` (block rows ``t*B_d + i``), adjacent runs merged."""
    if s.split is not Split.B:
        return [((lo, hi),) for lo, hi in cut(block_rows(p, src, dst), s)]
    t0, t1 = table_ranges(p)[src]
    b0, b1 = sample_ranges(p)[dst]
    n, out = b1 - b0, []
    for lo, hi in cut(n, s):
        runs: list[tuple[int, int]] = []
        for t in range(t1 - t0):
            a, b = t * n + lo, t * n + hi
            if runs and runs[-1][1] == a:
                runs[-1] = (runs[-1][0], b)
            else:
                runs.append((a, b))
        out.append(tuple(runs))
    return out


def _pool(p: Problem, chunks) -> PoolOp:
    assert p.pooling is not None
    return PoolOp("weights", "indices", "offsets", p.pooling, tuple(chunks))


def plan_emb_a2a(p: Problem, s: Schedule, rank: int) -> Plan:
    if s.compute is Compute.FUSED:
        return _plan_fused(p, s, rank)
    w, lay = p.world, _Layout(p, rank)
    buffers, bld = emb_buffers(p, rank), Builder()
    if s.granularity is Granularity.SERIAL:
        chunks = [
            PoolChunk(
                lay.segments(d, 0, block_rows(p, rank, d), "pooled", lay.pooled_base(d)), rank
            )
            for d in range(w)
        ]
        pooled = bld.add(_pool(p, chunks), Stream.COMPUTE)
        if uses_collective(s):
            send_rows = tuple(block_rows(p, rank, d) for d in range(w))
            recv_rows = tuple(block_rows(p, src, rank) for src in range(w))
            bld.add(
                CollectiveOp(Collective.ALL_TO_ALL, "pooled", "y", send_rows, recv_rows),
                Stream.COMM,
                [pooled],
            )
        else:
            moves: list[tuple[TransferOp | LocalCopyOp | None, TransferOp | None]] = []
            for step, (src, dst) in enumerate(peer_steps(rank, w, True)):
                n_send, tag = block_rows(p, rank, dst), transfer_tag(step, 0)
                pushed: TransferOp | LocalCopyOp = lay.push(dst, 0, n_send, tag)
                if dst == rank:
                    pushed = LocalCopyOp(pushed.local, pushed.remote)
                received = (
                    None if src == rank else lay.received(src, 0, block_rows(p, src, rank), tag)
                )
                moves.append((pushed, received))
            add_serial_moves(bld, s, moves, [pooled])
        return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")

    steps = peer_steps(rank, w, True)  # peers' blocks first, the local block last
    send_chunks = [chunk_runs(p, s, rank, dst) for _, dst in steps]
    recv_chunks = [chunk_runs(p, s, src, rank) for src, _ in steps]
    n_pieces = max(len(c) for c in send_chunks + recv_chunks)
    order = visit_order(s, w, n_pieces, local_last=True)
    merged: dict[int, int] = {}
    for step in issue_steps(s, order, local=w - 1):
        pushes: list[tuple[int, TransferOp, int]] = []  # (chunk, the push, its pooling)
        received: list[tuple[int, TransferOp]] = []
        for i, c in step:
            src, dst = steps[i]
            if c < len(send_chunks[i]):
                runs = send_chunks[i][c]
                if s.compute is Compute.MERGED:
                    if dst not in merged:
                        whole = lay.pool_into(dst, ((0, block_rows(p, rank, dst)),))
                        merged[dst] = bld.add(_pool(p, [whole]), Stream.COMPUTE, chunk=(dst, -1))
                    pooled = merged[dst]
                else:
                    chunk = lay.pool_into(dst, runs)
                    pooled = bld.add(_pool(p, [chunk]), Stream.COMPUTE, chunk=(dst, c))
                if dst != rank:
                    for lo, hi in runs:  # a batch chunk: a transfer per run, one tag
                        pushes.append((c, lay.push(dst, lo, hi, transfer_tag(i, c)), pooled))
            if src != rank and c < len(recv_chunks[i]):
                for lo, hi in recv_chunks[i][c]:
                    received.append((c, lay.received(src, lo, hi, transfer_tag(i, c))))
        if s.transport.traits.batches_segments and pushes:
            bld.add(
                TransferGroupOp(tuple(op for _, op, _ in pushes)),
                Stream.COMM,
                [d for _, _, d in pushes],
                chunk=group_chunk([(op.peer, c) for c, op, _ in pushes]),
            )
        else:  # one push per task, then the receive of the same step
            for c, op, dep in pushes:
                bld.add(op, Stream.COMM, [dep], chunk=(op.peer, c))
        for c, op in received:
            bld.add(op, Stream.COMM, chunk=(op.peer, c))
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")


def fused_chunks_per_block(p: Problem, s: Schedule) -> int:
    """``P``: the most chunks of any block (every rank numbers its flag slots by it)."""
    w = p.world
    return max(len(chunk_runs(p, s, src, dst)) for src in range(w) for dst in range(w))


def _plan_fused(p: Problem, s: Schedule, rank: int) -> Plan:
    w, lay = p.world, _Layout(p, rank)
    n = fused_chunks_per_block(p, s)
    if w * n > FLAG_SLOTS:
        raise ValueError(
            f"chunks: a fused plan needs world x chunks = {w * n} flag slots, more than the "
            f"{FLAG_SLOTS} of ficco.defaults.FLAG_SLOTS"
        )
    steps = peer_steps(rank, w, True)
    send_chunks = [chunk_runs(p, s, rank, dst) for _, dst in steps]
    chunks = []
    for i, c in visit_order(s, w, max(len(x) for x in send_chunks), local_last=True):
        _, dst = steps[i]
        if c < len(send_chunks[i]):
            signal = None if dst == rank else (dst, flag_slot(rank, c, n))
            chunks.append(lay.pool_into(dst, send_chunks[i][c], signal, fused=True))
    bld = Builder()
    bld.add(_pool(p, chunks), Stream.COMPUTE, chunk=(rank, -1))
    waits = tuple(
        flag_slot(src, c, n)
        for src in range(w)
        if src != rank
        for c in range(len(chunk_runs(p, s, src, rank)))
    )
    bld.add(WaitFlagsOp(waits), Stream.COMM, chunk=(rank, -1))
    return Plan(p, s, rank, emb_buffers(p, rank), tuple(bld.tasks), "y")
