"""Relay lowerings of ag_gemm and gemm_rs (``+relay``, ``+birelay``): a ring in which every
step moves one block one hop (shapes on rank r, S = M/W rows; buffers of ``ficco.plan.dense``).

gemm_rs (a ring reduce-scatter). A chunk that goes forward visits rank r at step i with
block ``d = (r - i - 1) mod W``: the rank computes its partial of that block, adds the
running sum rank r - 1 pushed at step i - 1 (none at step 0), and pushes the sum into rank
r + 1's ``staging`` rows of the block; at step W - 1 the block is ``r`` itself, and the sum
is this rank's ``c_shard``. Each step's GEMM thus produces exactly the block the ring sends
next, and each arriving partial is reduced (one two-input add) while the next step's GEMM
runs: no rank waits on W - 1 blocks at the end. ``+epilogue``: the GEMM of step i > 0
accumulates onto the received sum in ``staging`` instead (the reduction rides in the GEMM's
epilogue: no separate pass), the GEMM waiting on the hop.

ag_gemm (a ring all-gather). At step 0 a rank computes on its own shard and pushes it to
rank r + 1's ``a_full``; at step i it receives shard ``(r - i) mod W`` from rank r - 1,
computes on it, and forwards it to rank r + 1 (not at the last step).

``+birelay`` sends even chunks forward (to r + 1) and odd chunks backward (to r - 1, blocks
``(r + i + 1) mod W``), so both directions of every link carry half the bytes.

Hops are one-sided pushes (``ce``: a copy-engine copy, ``sm``: a Triton kernel storing into
the neighbour) that signal their receiver; the transfer of step i's chunk j has the tag of
(i, j) and is received at step i + 1.
"""

from __future__ import annotations

import dataclasses
import functools

from ficco.plan.build import (
    Builder,
    gemm_op,
    region,
    transfer_pair,
)
from ficco.plan.ops import (
    PUSH,
    BufferSpec,
    LocalCopyOp,
    Plan,
    ReduceOp,
    Region,
    Stream,
)
from ficco.plan.tags import transfer_tag
from ficco.problem import Problem
from ficco.space import Compute, Order, Schedule, Split
from ficco.space.geometry import cut


def direction(schedule: Schedule, chunk: int) -> int:
    """+1 where ``chunk`` goes to rank r + 1, -1 where it goes to rank r - 1 (birelay's odd
    chunks)."""
    return -1 if schedule.order is Order.BIRELAY and chunk % 2 else 1


def relay_block(rank: int, world: int, step: int, way: int) -> int:
    """gemm_rs: the block rank ``rank`` computes at ``step`` for a chunk going ``way``."""
    return (rank - way * (step + 1)) % world


def relay_shard(rank: int, world: int, step: int, way: int) -> int:
    """ag_gemm: the shard rank ``rank`` computes on at ``step`` for a chunk going ``way``."""
    return (rank - way * step) % world


def _rect(row0: int, piece: tuple[int, int], rows: int, cols: int, split_cols: bool):
    """``(rows, cols)`` of chunk ``piece`` of the ``rows x cols`` block at row ``row0``."""
    if split_cols:
        return (row0, row0 + rows), piece
    return (row0 + piece[0], row0 + piece[1]), (0, cols)


def plan_gemm_rs_relay(p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]) -> Plan:
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    split_n = s.split is Split.N
    epilogue = s.compute is Compute.EPILOGUE
    pieces = cut(N if split_n else S, s)
    rect = functools.partial(_rect, rows=S, cols=N, split_cols=split_n)
    b_of = [Region("b", (0, K), rect(0, piece)[1] if split_n else (0, N)) for piece in pieces]
    bld = Builder()
    for i in range(w):
        for j, piece in enumerate(pieces):
            way = direction(s, j)
            d = relay_block(rank, w, i, way)
            nxt, prev = (rank + way) % w, (rank - way) % w
            rows, cols = rect(d * S, piece)
            a = region("a", rows, (0, K))
            staged = region("staging", rows, cols)
            recv = None
            if i > 0:  # the running sum of block d, pushed by prev at step i - 1
                sent_from = region("staging" if epilogue and i > 1 else "partial", rows, cols)
                _, recv_op = transfer_pair(
                    transfer_tag(i - 1, j), PUSH, send=(prev, staged, staged),
                    recv=(prev, staged, sent_from),
                )  # fmt: skip
                recv = bld.add(recv_op, Stream.COMM, (), (prev, j))
            if epilogue and i > 0:
                out = staged  # the GEMM adds this rank's partial onto the received sum
                done = bld.add(gemm_op(a, b_of[j], out, True), Stream.COMPUTE, [recv], (d, j))
                if i == w - 1:
                    copy = LocalCopyOp(out, region("c_shard", *rect(0, piece)))
                    bld.add(copy, Stream.COMPUTE, [done], (d, j))
            else:
                out = region("partial", rows, cols)
                done = bld.add(gemm_op(a, b_of[j], out), Stream.COMPUTE, (), (d, j))
                if i > 0:
                    total = out if i < w - 1 else region("c_shard", *rect(0, piece))
                    op = ReduceOp((out, staged), total)
                    done = bld.add(op, Stream.COMPUTE, [done, recv], (d, j))
            if i < w - 1:
                send_op, _ = transfer_pair(
                    transfer_tag(i, j), PUSH, send=(nxt, out, staged), recv=(nxt, staged, out)
                )
                bld.add(send_op, Stream.COMM, [done], (nxt, j))
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c_shard")


def plan_ag_gemm_relay(p: Problem, s: Schedule, rank: int, buffers: tuple[BufferSpec, ...]) -> Plan:
    # the previous rank pushes each shard into this rank's a_full: peer-visible here alone
    # (the other ag_gemm plans keep it private, so no symmetric memory is spent on it)
    buffers = tuple(
        dataclasses.replace(b, peer_visible=True) if b.name == "a_full" else b for b in buffers
    )
    w, S, K, N = p.world, p.m_shard, p.k, p.n
    split_k = s.split is Split.K
    pieces = cut(K if split_k else S, s)
    rect = functools.partial(_rect, rows=S, cols=K, split_cols=split_k)
    whole_b = Region("b", (0, K), (0, N))
    bld = Builder()
    last_gemm: dict[int, int] = {}  # shard -> its latest GEMM (split-k chunks accumulate)
    for i in range(w):
        for j, piece in enumerate(pieces):
            way = direction(s, j)
            src = relay_shard(rank, w, i, way)
            nxt, prev = (rank + way) % w, (rank - way) % w
            rows, cols = rect(src * S, piece)
            landed = region("a_full", rows, cols)
            if i == 0:  # the local shard: read in place, pushed as it is
                here, ready = region("a_shard", *rect(0, piece)), None
            else:
                sent_from = region("a_full" if i > 1 else "a_shard", *(
                    (rows, cols) if i > 1 else rect(0, piece)
                ))  # fmt: skip
                _, recv_op = transfer_pair(
                    transfer_tag(i - 1, j), PUSH, send=(prev, landed, landed),
                    recv=(prev, landed, sent_from),
                )  # fmt: skip
                here, ready = landed, bld.add(recv_op, Stream.COMM, (), (prev, j))
            if i < w - 1:
                send_op, _ = transfer_pair(
                    transfer_tag(i, j), PUSH, send=(nxt, here, landed), recv=(nxt, landed, here)
                )
                bld.add(send_op, Stream.COMM, [ready], (nxt, j))
            accumulate = split_k and src in last_gemm
            b = Region("b", cols, (0, N)) if split_k else whole_b
            out = region("c", (src * S, (src + 1) * S) if split_k else rows, (0, N))
            deps = [ready, last_gemm.get(src) if accumulate else None]
            last_gemm[src] = bld.add(
                gemm_op(here, b, out, accumulate), Stream.COMPUTE, deps, (src, j)
            )
    return Plan(p, s, rank, buffers, tuple(bld.tasks), "c")
