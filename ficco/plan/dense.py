"""Lowering of the dense patterns, ag_gemm and gemm_rs (shapes on rank r, S = M/W rows):

=========  ==========================  ==============================================
pattern    inputs                      workspace / output
=========  ==========================  ==============================================
ag_gemm    a_shard [S, K], b [K, N]    a_full [M, K] (gathered), c [M, N]
gemm_rs    a [M, K], b [K, N]          partial [M, N], staging [W*S, N], c_shard [S, N]
=========  ==========================  ==============================================

``staging`` row block ``p`` receives source rank p's partial of this rank's rows. Gathers go
local shard first (it needs no transfer); scatters compute the local block last. ``+fused``
schedules are lowered by ``ficco.plan.fused``, ``+relay`` / ``+birelay`` ones by ``ficco.plan.relay``,
on the same buffers.
"""

from __future__ import annotations

import functools

from ficco.plan.build import (
    Builder,
    exchange,
    gemm_op,
    peer_steps,
    post_pair,
    region,
    transfer_pair,
    uses_collective,
    visit_order,
)
from ficco.plan.fused import plan_ag_gemm_fused, plan_gemm_rs_fused
from ficco.plan.ops import (
    PULL,
    PUSH,
    BufferSpec,
    CollectiveOp,
    GemmOp,
    LocalCopyOp,
    Plan,
    ReduceOp,
    Region,
    Stream,
)
from ficco.plan.relay import plan_ag_gemm_relay, plan_gemm_rs_relay
from ficco.plan.tags import transfer_tag
from ficco.problem import Problem
from ficco.space import RELAYS, Compute, Granularity, Schedule, Split
from ficco.space.geometry import cut


def ag_gemm_buffers(p: Problem, rank: int = 0) -> tuple[BufferSpec, ...]:
    """Every rank's buffers (the same on every rank)."""
    S, K, N = p.m_shard, p.k, p.n
    return (
        BufferSpec("a_shard", (S, K), "input", peer_visible=True),
        BufferSpec("b", (K, N), "input"),
        # peer-visible only in relay plans (ficco.plan.relay), which push shards into it
        BufferSpec("a_full", (p.m, K), "workspace", peer_visible=False),
        BufferSpec("c", (p.m, N), "output"),
    )


def gemm_rs_buffers(p: Problem, rank: int = 0) -> tuple[BufferSpec, ...]:
    """Every rank's buffers (the same on every rank)."""
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    return (
        BufferSpec("a", (p.m, K), "input"),
        BufferSpec("b", (K, N), "input"),
        BufferSpec("partial", (p.m, N), "workspace", peer_visible=False),
        BufferSpec("staging", (w * S, N), "workspace", peer_visible=True),
        BufferSpec("c_shard", (S, N), "output"),
    )


def plan_ag_gemm(p: Problem, s: Schedule, rank: int) -> Plan:
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    buffers = ag_gemm_buffers(p)
    if s.compute is Compute.FUSED:
        return plan_ag_gemm_fused(p, s, rank, buffers)
    if s.order in RELAYS:
        return plan_ag_gemm_relay(p, s, rank, buffers)
    bld = Builder()
    whole_b = Region("b", (0, K), (0, N))

    if s.granularity is Granularity.SERIAL:
        if uses_collective(s):
            gathered = [bld.add(CollectiveOp("all_gather", "a_shard", "a_full"), Stream.COMM)]
        else:
            gathered = [
                bld.add(
                    LocalCopyOp(
                        Region("a_shard", (0, S), (0, K)),
                        Region("a_full", (rank * S, (rank + 1) * S), (0, K)),
                    ),
                    Stream.COMM,
                )
            ]
            mine = Region("a_shard", (0, S), (0, K))
            for step, (src, dst) in enumerate(peer_steps(rank, w, False)[1:], start=1):
                gathered.append(
                    exchange(
                        bld,
                        transfer_tag(step, 0),
                        PULL,
                        send=(dst, mine, Region("a_full", (rank * S, (rank + 1) * S), (0, K))),
                        recv=(src, Region("a_full", (src * S, (src + 1) * S), (0, K)), mine),
                    )
                )
        bld.add(
            GemmOp(Region("a_full", (0, p.m), (0, K)), whole_b, Region("c", (0, p.m), (0, N))),
            Stream.COMPUTE,
            gathered,
        )
        return Plan(p, s, rank, buffers, tuple(bld.tasks), "c")

    return _ag_gemm_overlapped(p, s, rank, buffers)


def _ag_gemm_overlapped(
    p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]
) -> Plan:
    """The overlapped (shard or finer) plan of ``s``."""
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    whole_b = Region("b", (0, K), (0, N))
    split_k = s.split is Split.K
    merged = s.compute is Compute.MERGED
    pieces = cut(K if split_k else S, s)
    last = len(pieces) - 1
    steps = peer_steps(rank, w, False)

    rect = functools.partial(_chunk_rect, rows=S, cols=K, split_cols=split_k)

    # per chunk, the regions every step shares: the chunk of every rank's a_shard, and where
    # this rank's chunk lands in a peer's a_full (built once: a plan at W = 64 has thousands)
    shard_chunk = [Region("a_shard", *rect(0, piece)) for piece in pieces]
    mine_there = [Region("a_full", rect(rank * S, piece)[0], rect(0, piece)[1]) for piece in pieces]
    b_of = [Region("b", rect(0, piece)[1], (0, N)) if split_k else whole_b for piece in pieces]
    bld = Builder()
    order = visit_order(s, w, len(pieces), local_last=False)
    arrived: dict[tuple[int, int], int | None] = {}
    # Comm first in program order so sends are posted before any wait (no deadlock on
    # two-sided transports); the executors run the two streams concurrently anyway. The
    # send half is a no-op on one-sided pulls (ce) but keeps both halves visible to every
    # executor.
    for i, j in order:
        src, dst = steps[i]
        if src == rank:
            arrived[(i, j)] = None  # local shard: read in place, no wait
            continue
        rows, cols = rect(src * S, pieces[j])
        pair = transfer_pair(
            transfer_tag(i, j),
            PULL,
            send=(dst, shard_chunk[j], mine_there[j]),
            recv=(src, region("a_full", rows, cols), shard_chunk[j]),
        )
        arrived[(i, j)] = post_pair(bld, pair[0], pair[1], (), j)

    last_gemm: dict[int, int] = {}  # split-k chunks of one shard accumulate in order
    for i, j in order:
        src, _ = steps[i]
        base_buf, base_row = ("a_shard", 0) if src == rank else ("a_full", src * S)
        if merged:
            if j == last:  # the shard's last chunk: one GEMM over the whole shard
                op = GemmOp(
                    Region(base_buf, (base_row, base_row + S), (0, K)),
                    whole_b,
                    Region("c", (src * S, (src + 1) * S), (0, N)),
                )
                deps = [arrived[(i, jj)] for jj in range(len(pieces))]
                bld.add(op, Stream.COMPUTE, deps, chunk=(src, -1))
            continue
        accumulate = split_k and j > 0
        rows, cols = rect(base_row, pieces[j])
        out_rows, _ = rect(src * S, pieces[j])
        op = gemm_op(
            region(base_buf, rows, cols), b_of[j], region("c", out_rows, (0, N)), accumulate
        )
        tid = bld.add(
            op,
            Stream.COMPUTE,
            [arrived[(i, j)], last_gemm.get(src) if accumulate else None],
            chunk=(src, j),
        )
        last_gemm[src] = tid
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c")


def plan_gemm_rs(p: Problem, s: Schedule, rank: int) -> Plan:
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    buffers = gemm_rs_buffers(p)
    if s.compute is Compute.FUSED:
        return plan_gemm_rs_fused(p, s, rank, buffers)
    if s.order in RELAYS:
        return plan_gemm_rs_relay(p, s, rank, buffers)
    bld = Builder()
    whole_b = Region("b", (0, K), (0, N))

    if s.granularity is Granularity.SERIAL:
        g = bld.add(
            GemmOp(Region("a", (0, p.m), (0, K)), whole_b, Region("partial", (0, p.m), (0, N))),
            Stream.COMPUTE,
        )
        if uses_collective(s):
            bld.add(CollectiveOp("reduce_scatter", "partial", "c_shard"), Stream.COMM, [g])
        else:
            recvs = []
            for step, (src, dst) in enumerate(peer_steps(rank, w, True)[:-1]):
                recvs.append(
                    exchange(
                        bld,
                        transfer_tag(step, 0),
                        PUSH,
                        send=(
                            dst,
                            Region("partial", (dst * S, (dst + 1) * S), (0, N)),
                            Region("staging", (rank * S, (rank + 1) * S), (0, N)),
                        ),
                        recv=(
                            src,
                            Region("staging", (src * S, (src + 1) * S), (0, N)),
                            Region("partial", (rank * S, (rank + 1) * S), (0, N)),
                        ),
                        send_deps=[g],
                    )
                )
            _add_reduce(
                bld,
                rank,
                w,
                S,
                (0, S),
                (0, N),
                g,
                {src: r for src, r in zip(_sources(rank, w), recvs, strict=False)},
            )
        return Plan(p, s, rank, buffers, tuple(bld.tasks), "c_shard")

    return _gemm_rs_overlapped(p, s, rank, buffers)


def _gemm_rs_overlapped(
    p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]
) -> Plan:
    """The overlapped (shard or finer) plan of ``s``."""
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    whole_b = Region("b", (0, K), (0, N))
    split_n = s.split is Split.N
    merged = s.compute is Compute.MERGED
    pieces = cut(N if split_n else S, s)
    steps = peer_steps(rank, w, True)  # peers first, local block last

    rect = functools.partial(_chunk_rect, rows=S, cols=N, split_cols=split_n)

    # per chunk, the regions every step shares (built once: a plan at W = 64 has thousands):
    # this rank's rows in a peer's staging and in its own partial, and the chunk of b
    staged_mine = [Region("staging", *rect(rank * S, piece)) for piece in pieces]
    partial_mine = [Region("partial", *rect(rank * S, piece)) for piece in pieces]
    b_of = [Region("b", (0, K), rect(0, piece)[1] if split_n else (0, N)) for piece in pieces]
    bld = Builder()
    local_gemm: dict[int, int] = {}
    recv_of: dict[tuple[int, int], int] = {}
    merged_gemm: dict[int, int] = {}
    for i, j in visit_order(s, w, len(pieces), local_last=True):
        src, dst = steps[i]  # this step: compute + send dst's block, receive src's block
        out_rows, cols = rect(dst * S, pieces[j])
        out = region("partial", out_rows, cols)
        if merged:
            if dst not in merged_gemm:  # the shard's one GEMM, at its first chunk
                op = GemmOp(
                    Region("a", (dst * S, (dst + 1) * S), (0, K)),
                    whole_b,
                    Region("partial", (dst * S, (dst + 1) * S), (0, N)),
                )
                merged_gemm[dst] = bld.add(op, Stream.COMPUTE, chunk=(dst, -1))
            g = merged_gemm[dst]
        else:
            gemm = gemm_op(region("a", out_rows, (0, K)), b_of[j], out)
            g = bld.add(gemm, Stream.COMPUTE, chunk=(dst, j))
        if dst == rank:
            local_gemm[j] = g
            continue
        src_rows, _ = rect(src * S, pieces[j])
        pair = transfer_pair(
            transfer_tag(i, j),
            PUSH,
            send=(dst, out, staged_mine[j]),
            recv=(src, region("staging", src_rows, cols), partial_mine[j]),
        )
        recv_of[(src, j)] = post_pair(bld, pair[0], pair[1], (g,), j)
    for j, piece in enumerate(pieces):
        recvs = {src: recv_of[(src, j)] for src in _sources(rank, w)}
        rows, cols = rect(0, piece)
        op = _reduce_op(rank, S, rows, cols, recvs)
        bld.add(op, Stream.COMPUTE, [local_gemm[j], *recvs.values()], chunk=(rank, j))
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c_shard")


def _chunk_rect(
    row0: int, piece: tuple[int, int], rows: int, cols: int, split_cols: bool
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(rows, cols)`` of chunk ``piece`` of the ``rows x cols`` block at row ``row0``: a
    range of its columns where the schedule splits them (ag_gemm: K, gemm_rs: N), else of its
    rows."""
    if split_cols:
        return (row0, row0 + rows), piece
    return (row0 + piece[0], row0 + piece[1]), (0, cols)


def _sources(rank: int, world: int) -> list[int]:
    return [src for src, _ in peer_steps(rank, world, True)[:-1]]


def _reduce_op(rank, S, rows, cols, sources) -> ReduceOp:
    """c_shard[rows, cols] = own partial + every source's staged partial (in rank order)."""
    own = Region("partial", (rank * S + rows[0], rank * S + rows[1]), cols)
    staged = tuple(
        region("staging", (src * S + rows[0], src * S + rows[1]), cols) for src in sorted(sources)
    )
    return ReduceOp((own, *staged), Region("c_shard", rows, cols))


def _add_reduce(bld, rank, w, S, rows, cols, local_dep, recv_deps: dict[int, int], chunk=None):
    """c_shard[rows, cols] = own partial + every peer's staged partial."""
    bld.add(
        _reduce_op(rank, S, rows, cols, recv_deps),
        Stream.COMPUTE,
        [local_dep, *recv_deps.values()],
        chunk=chunk,
    )
