"""Lowering of the all-to-all patterns, a2a_gemm and gemm_a2a (shapes on rank r):

=========  ==========================  ==============================================
pattern    inputs                      workspace / output
=========  ==========================  ==============================================
a2a_gemm   x [T_r, K], b [E/W, K, N]   x_recv [R_r, K], y [R_r, N]
gemm_a2a   x [R_r, K], b [E/W, K, N]   y_local [R_r, N], y [T_r, N]
=========  ==========================  ==============================================

``T_r`` rows of rank r are sorted by destination expert; ``R_r`` received rows are ordered
(source rank, local expert) -- the order ``all_to_all_single`` produces. A *block* is what
one rank sends another; finer schedules cut blocks into chunks of rows.

One-sided transports pull (dispatch) or push (combine) each block or chunk. ``ce`` makes each
one its own transfer task; ``seg`` makes each *step* one :class:`TransferGroupOp` (one
segment-copy kernel on GPUs): serial schedules move every peer's block and the local block in
one group, ``+all_peers`` a chunk index from every peer, the ring one peer's chunk. The
peers' passive halves stay plain transfer tasks, and both transports move the same bytes.
"""

from __future__ import annotations

from ficco.patterns.spec import Collective
from ficco.plan.build import (
    Builder,
    peer_steps,
    uses_collective,
    visit_order,
)
from ficco.plan.ops import (
    PULL,
    PUSH,
    BufferSpec,
    CollectiveOp,
    Direction,
    GemmOp,
    LocalCopyOp,
    Plan,
    Region,
    Stream,
    TransferGroupOp,
    TransferOp,
)
from ficco.plan.tags import transfer_tag
from ficco.problem import Problem
from ficco.space import Compute, Granularity, Order, Schedule
from ficco.space.geometry import cut


def _a2a_layout(p: Problem, rank: int):
    """Row offsets. ``send_off[d][j]``: first row of x (sorted by expert) for rank d's j-th
    expert; ``recv_off[s][j]``: first row of the received block from s for local expert j."""
    w, between = p.world, p.tokens_between()
    send_off = _first_rows([between[rank][d] for d in range(w)])
    recv_off = _first_rows([between[s][rank] for s in range(w)])
    return between, send_off, recv_off


def _first_rows(blocks: list) -> list[list[int]]:
    """The first row of each expert's segment of each block, for ``blocks`` (per peer, the
    rows per local expert) laid out one after the other."""
    firsts, row = [], 0
    for per_expert in blocks:
        offs = []
        for n in per_expert:
            offs.append(row)
            row += n
        firsts.append(offs)
    return firsts


def add_serial_all_to_all(
    bld: Builder,
    p: Problem,
    s: Schedule,
    rank: int,
    moved: tuple[str, str, int],
    combine: bool,
    deps: tuple[int, ...] | list[int],
) -> list[int]:
    """Add the serial schedule's all-to-all of whole blocks, after ``deps``: ``moved = (source
    buffer, destination buffer, columns)``. Dispatch (``combine`` False) sends each rank its
    experts' tokens, from the sender's expert-sorted rows to the receiver's (source rank,
    local expert) rows; combine returns them, the other way. Through the collective, or as
    one-sided transfers by :func:`add_serial_moves`: dispatch pulls, combine pushes. Returns
    the ids of what the next tasks wait on."""
    w, (src_buf, dst_buf, cols) = p.world, moved
    between = p.tokens_between()

    def rows(frm: int, to: int) -> int:
        """Rows of rank ``frm``'s block for rank ``to`` (combine: ``to``'s tokens that
        ``frm``'s experts computed)."""
        return sum(between[to][frm]) if combine else sum(between[frm][to])

    if uses_collective(s):
        send_rows = tuple(rows(rank, to) for to in range(w))
        recv_rows = tuple(rows(frm, rank) for frm in range(w))
        op = CollectiveOp(Collective.ALL_TO_ALL, src_buf, dst_buf, send_rows, recv_rows)
        return [bld.add(op, Stream.COMM, deps)]

    layouts = [_a2a_layout(p, r) for r in range(w)]
    send_off, recv_off = [lay[1] for lay in layouts], [lay[2] for lay in layouts]
    # a dispatched block leaves its sender's send offsets for its receiver's receive offsets;
    # combine returns it, from the receive offsets to the send offsets
    leaves, lands = (recv_off, send_off) if combine else (send_off, recv_off)

    def block(frm: int, to: int) -> tuple[Region, Region] | None:
        """Rank ``frm``'s block for rank ``to``: its rows in ``frm``'s source buffer and in
        ``to``'s destination buffer (None when empty)."""
        n = rows(frm, to)
        if not n:
            return None
        lo, at = leaves[frm][to][0], lands[to][frm][0]
        return Region(src_buf, (lo, lo + n), (0, cols)), Region(dst_buf, (at, at + n), (0, cols))

    initiator = PUSH if combine else PULL
    # per ring step (acting, passive): the transfer this rank moves (the local block: a copy)
    # and the peer-initiated half it only posts
    moves: list[tuple[TransferOp | LocalCopyOp | None, TransferOp | None]] = []
    for step, (src, dst) in enumerate(peer_steps(rank, w, combine)):
        tag = transfer_tag(step, 0)
        if src == rank:  # the local step (then dst == rank too)
            local = block(rank, rank)
            moves.append((None if local is None else LocalCopyOp(*local), None))
            continue
        recv = send = None
        if incoming := block(src, rank):  # lands here: (there, here)
            recv = TransferOp(src, Direction.RECV, incoming[1], incoming[0], tag, initiator)
        if outgoing := block(rank, dst):
            send = TransferOp(dst, Direction.SEND, *outgoing, tag, initiator)
        moves.append((send, recv) if combine else (recv, send))
    return add_serial_moves(bld, s, moves, deps)


def _block_pieces(sizes: list[int], schedule: Schedule) -> list[list[tuple[int, int, int]]]:
    """A peer block made of per-expert segments ``sizes`` (rows), cut into chunks of rows.
    Returns per chunk the list of (expert j, first row within block, last row) segments."""
    total = sum(sizes)
    pieces = cut(total, schedule)
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    out = []
    for lo, hi in pieces:
        segs = []
        for j, (st, sz) in enumerate(zip(starts, sizes, strict=False)):
            a, b = max(lo, st), min(hi, st + sz)
            if b > a:
                segs.append((j, a, b))
        out.append(segs)
    return out


def issue_steps(
    s: Schedule, order: list[tuple[int, int]], local: int
) -> list[list[tuple[int, int]]]:
    """The (step, chunk) pairs of ``order`` cut into what one operation moves. ``seg`` with
    ``all_peers`` moves a chunk index from every peer at once (consecutive in that order);
    every other overlapped schedule moves one (peer, chunk) per operation, as does the local
    step ``local``."""
    batch_peers = s.transport.traits.batches_segments and s.order is Order.ALL_PEERS
    out: list[list[tuple[int, int]]] = []
    last = None
    for i, c in order:
        key = ("chunk", c) if batch_peers and i != local else ("one", i, c)
        if out and key == last and key[0] == "chunk":
            out[-1].append((i, c))
        else:
            out.append([(i, c)])
        last = key
    return out


def group_chunk(pieces: list[tuple[int, int]]) -> tuple[int, int] | None:
    """A transfer group's ``Task.chunk``: its (peer, chunk) when it holds one, else None."""
    return pieces[0] if len(set(pieces)) == 1 else None


def add_serial_moves(
    bld: Builder,
    s: Schedule,
    moves: list[tuple[TransferOp | LocalCopyOp | None, TransferOp | None]],
    deps: tuple[int, ...] | list[int],
) -> list[int]:
    """Add a serial one-sided all-to-all: per ring step ``(acting, passive)``, the transfer
    this rank moves (or its local copy) and the peer-initiated half it only posts. ``ce``:
    one task each, in step order; ``seg``: every acting transfer and local copy in one
    :class:`TransferGroupOp`, then the passive halves. ``deps``: what the moves wait on.
    Returns the ids of the acting tasks (what the GEMMs, or the output, wait on)."""
    acting = [a for a, _ in moves if a is not None]
    if s.transport.traits.batches_segments:
        ids = []
        if acting:
            group = TransferGroupOp(
                tuple(a for a in acting if isinstance(a, TransferOp)),
                tuple(a for a in acting if isinstance(a, LocalCopyOp)),
            )
            ids.append(bld.add(group, Stream.COMM, deps))
        for _, passive in moves:
            if passive is not None:
                bld.add(passive, Stream.COMM)
        return ids
    ids = []
    for act, passive in moves:
        if act is not None:
            ids.append(bld.add(act, Stream.COMM, deps))
        if passive is not None:
            bld.add(passive, Stream.COMM)
    return ids


def _rows(p: Problem, rank: int) -> tuple[int, int]:
    """(tokens ``rank`` sends, tokens it receives), its own included."""
    between, w = p.tokens_between(), p.world
    return (
        sum(sum(between[rank][d]) for d in range(w)),
        sum(sum(between[src][rank]) for src in range(w)),
    )


def a2a_gemm_buffers(p: Problem, rank: int) -> tuple[BufferSpec, ...]:
    t_rows, r_rows = _rows(p, rank)
    K, N, epr = p.k, p.n, p.experts_per_rank
    return (
        BufferSpec("x", (t_rows, K), "input", peer_visible=True),
        BufferSpec("b", (epr, K, N), "input"),
        BufferSpec("x_recv", (r_rows, K), "workspace"),
        BufferSpec("y", (r_rows, N), "output"),
    )


def gemm_a2a_buffers(p: Problem, rank: int) -> tuple[BufferSpec, ...]:
    t_rows, r_rows = _rows(p, rank)
    K, N, epr = p.k, p.n, p.experts_per_rank
    return (
        BufferSpec("x", (r_rows, K), "input"),
        BufferSpec("b", (epr, K, N), "input"),
        BufferSpec("y_local", (r_rows, N), "workspace"),
        BufferSpec("y", (t_rows, N), "output", peer_visible=True),
    )


def plan_a2a_gemm(p: Problem, s: Schedule, rank: int) -> Plan:
    w, K, N, epr = p.world, p.k, p.n, p.experts_per_rank
    between, send_off, recv_off = _a2a_layout(p, rank)
    buffers = a2a_gemm_buffers(p, rank)
    bld = Builder()

    def gemm(a_buf, a_row0, out_row0, j, lo, hi, deps, chunk):
        return bld.add(
            GemmOp(
                Region(a_buf, (a_row0 + lo, a_row0 + hi), (0, K)),
                Region("b", (0, K), (0, N), index=j),
                Region("y", (out_row0 + lo, out_row0 + hi), (0, N)),
            ),
            Stream.COMPUTE,
            deps,
            chunk,
        )

    if s.granularity is Granularity.SERIAL:
        deps = add_serial_all_to_all(bld, p, s, rank, ("x", "x_recv", K), combine=False, deps=())
        for src in range(w):
            for j in range(epr):
                lo = recv_off[src][j]
                n_rows = between[src][rank][j]
                if n_rows:
                    gemm("x_recv", 0, 0, j, lo, lo + n_rows, deps, None)
        return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")

    steps = peer_steps(rank, w, False)
    recv_chunks = [_block_pieces(list(between[src][rank]), s) for src, _ in steps]
    send_chunks = [_block_pieces(list(between[rank][dst]), s) for _, dst in steps]
    n_pieces = max([len(c) for c in recv_chunks + send_chunks] + [1])
    order = visit_order(s, w, n_pieces, local_last=False)
    arrived: dict[tuple[int, int], int | None] = {}
    for step in issue_steps(s, order, local=0):
        pulls: list[tuple[tuple[int, int], TransferOp]] = []  # ((i, c), the pull)
        sends: list[tuple[int, TransferOp]] = []  # (c, the pull's passive half)
        for i, c in step:
            src, dst = steps[i]
            if src == rank:
                arrived[(i, c)] = None
                continue
            src_send_off = _a2a_layout(p, src)[1][rank]
            if c < len(recv_chunks[i]):
                segs = recv_chunks[i][c]
                lo, hi = segs[0][1], segs[-1][2]  # a chunk's segments are contiguous rows
                base_local, base_remote = recv_off[src][0], src_send_off[0]
                pulls.append(
                    (
                        (i, c),
                        TransferOp(
                            src,
                            Direction.RECV,
                            Region("x_recv", (base_local + lo, base_local + hi), (0, K)),
                            Region("x", (base_remote + lo, base_remote + hi), (0, K)),
                            transfer_tag(i, c),
                            PULL,
                        ),
                    )
                )
            if c < len(send_chunks[i]):
                segs = send_chunks[i][c]
                lo, hi = segs[0][1], segs[-1][2]
                dst_recv_off = _a2a_layout(p, dst)[2][rank]
                sends.append(
                    (
                        c,
                        TransferOp(
                            dst,
                            Direction.SEND,
                            Region("x", (send_off[dst][0] + lo, send_off[dst][0] + hi), (0, K)),
                            Region("x_recv", (dst_recv_off[0] + lo, dst_recv_off[0] + hi), (0, K)),
                            transfer_tag(i, c),
                            PULL,
                        ),
                    )
                )
        if s.transport.traits.batches_segments and pulls:
            group = bld.add(
                TransferGroupOp(tuple(op for _, op in pulls)),
                Stream.COMM,
                chunk=group_chunk([(op.peer, key[1]) for key, op in pulls]),
            )
            arrived.update((key, group) for key, _ in pulls)
        else:  # one transfer per task (a step of one (peer, chunk): pull, then its send)
            for key, op in pulls:
                arrived[key] = bld.add(op, Stream.COMM, chunk=(op.peer, key[1]))
        for c, op in sends:
            bld.add(op, Stream.COMM, chunk=(op.peer, c))
    for i in range(w):
        src, _ = steps[i]
        a_buf, a_base = ("x", send_off[rank][0]) if src == rank else ("x_recv", recv_off[src][0])
        out_base = recv_off[src][0]
        cs = [c for (ii, c) in order if ii == i and c < len(recv_chunks[i])]
        if s.compute is Compute.MERGED:
            deps = [arrived[(i, c)] for c in cs]
            for j, lo, hi in _block_pieces(list(between[src][rank]), Schedule())[0] if cs else []:
                gemm(a_buf, a_base, out_base, j, lo, hi, deps, (src, -1))
            continue
        for c in cs:
            for j, lo, hi in recv_chunks[i][c]:
                gemm(a_buf, a_base, out_base, j, lo, hi, [arrived[(i, c)]], (src, c))
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")


def plan_gemm_a2a(p: Problem, s: Schedule, rank: int) -> Plan:
    w, K, N = p.world, p.k, p.n
    between, send_off, recv_off = _a2a_layout(p, rank)
    buffers = gemm_a2a_buffers(p, rank)
    bld = Builder()
    initiator = PUSH
    # Block for source s (rows recv_off[s][0]..) goes back to s, landing at s's send_off[rank].

    def gemm_rows(block_src, lo, hi, segs_src, deps=(), chunk=None):
        base = recv_off[block_src][0]
        ids = []
        for j, a, b in segs_src:
            a, b = max(a, lo), min(b, hi)
            if b > a:
                ids.append(
                    bld.add(
                        GemmOp(
                            Region("x", (base + a, base + b), (0, K)),
                            Region("b", (0, K), (0, N), index=j),
                            Region("y_local", (base + a, base + b), (0, N)),
                        ),
                        Stream.COMPUTE,
                        deps,
                        chunk,
                    )
                )
        return ids

    if s.granularity is Granularity.SERIAL:
        g = []
        for src in range(w):
            segs = (
                _block_pieces(list(between[src][rank]), Schedule())[0]
                if sum(between[src][rank])
                else []
            )
            g += gemm_rows(src, 0, sum(between[src][rank]), segs)
        add_serial_all_to_all(bld, p, s, rank, ("y_local", "y", N), combine=True, deps=g)
        return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")

    steps = peer_steps(rank, w, True)
    send_chunks = [
        _block_pieces(list(between[dst][rank]), s) for _, dst in steps
    ]  # blocks I compute
    recv_chunks = [_block_pieces(list(between[rank][src]), s) for src, _ in steps]
    n_pieces = max([len(c) for c in recv_chunks + send_chunks] + [1])
    order = visit_order(s, w, n_pieces, local_last=True)
    merged: dict[int, list[int]] = {}
    for step in issue_steps(s, order, local=w - 1):
        pushes: list[tuple[int, TransferOp, list[int]]] = []  # (c, the push, its GEMMs)
        received: list[tuple[int, TransferOp]] = []  # (c, a push this rank waits for)
        for i, c in step:
            src, dst = steps[i]
            if c < len(send_chunks[i]):
                segs = send_chunks[i][c]
                lo, hi = segs[0][1], segs[-1][2]
                if s.compute is Compute.MERGED:
                    if dst not in merged:
                        whole = _block_pieces(list(between[dst][rank]), Schedule())[0]
                        merged[dst] = gemm_rows(
                            dst, 0, sum(between[dst][rank]), whole, chunk=(dst, -1)
                        )
                    deps = merged[dst]
                else:
                    deps = gemm_rows(dst, lo, hi, segs, chunk=(dst, c))
                base = recv_off[dst][0]
                dst_off = _a2a_layout(p, dst)[1][rank][0]
                local = Region("y_local", (base + lo, base + hi), (0, N))
                remote = Region("y", (dst_off + lo, dst_off + hi), (0, N))
                if dst == rank:
                    bld.add(LocalCopyOp(local, remote), Stream.COMPUTE, deps, chunk=(dst, c))
                else:
                    push = TransferOp(
                        dst, Direction.SEND, local, remote, transfer_tag(i, c), initiator
                    )
                    pushes.append((c, push, deps))
            if src != rank and c < len(recv_chunks[i]):
                segs = recv_chunks[i][c]
                lo, hi = segs[0][1], segs[-1][2]
                src_base = _a2a_layout(p, src)[2][rank][0]
                recv = TransferOp(
                    src,
                    Direction.RECV,
                    Region("y", (send_off[src][0] + lo, send_off[src][0] + hi), (0, N)),
                    Region("y_local", (src_base + lo, src_base + hi), (0, N)),
                    transfer_tag(i, c),
                    initiator,
                )
                received.append((c, recv))
        if s.transport.traits.batches_segments and pushes:
            bld.add(
                TransferGroupOp(tuple(op for _, op, _ in pushes)),
                Stream.COMM,
                [d for _, _, deps in pushes for d in deps],
                chunk=group_chunk([(op.peer, c) for c, op, _ in pushes]),
            )
        else:  # one push per task (a step of one (peer, chunk): push, then the receive)
            for c, op, deps in pushes:
                bld.add(op, Stream.COMM, deps, chunk=(op.peer, c))
        for c, op in received:
            bld.add(op, Stream.COMM, chunk=(op.peer, c))
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "y")
