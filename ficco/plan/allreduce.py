"""Lowering of gemm_ar, GEMM then all-reduce (shapes on rank r, S = M/W rows):

=========  ==========================  ==============================================
inputs     a [M, K], b [K, N]          (K: this rank's slice of the reduced dimension)
workspace  partial [M, N]              this rank's a @ b
           staging [W*M, N]            row block p: source rank p's partial (peer-visible)
output     c [M, N]                    the sum of every rank's partial (peer-visible)
=========  ==========================  ==============================================

Two ways to build the all-reduce:

- **direct** (serial, ``finer``): the GEMM of chunk j, then chunk j's all-reduce, which
  overlaps the GEMM of chunk j+1. On ``nccl`` the all-reduce is the collective itself over
  the chunk's rectangle; on ``ce``/``nccl_ce`` (one-shot) the partial chunk is pushed to every
  peer's staging block and each rank reduces the W partials in rank order, so every rank
  holds the same bits. On ``symm1``/``symm2`` (PyTorch symmetric memory's one-shot and
  two-shot kernels) the chunk's GEMM writes a peer-visible buffer at the same offset on
  every rank (``staging`` row block 0, or ``c`` itself) and one collective of kind
  ``one_shot_all_reduce`` (into ``c``) or ``two_shot_all_reduce`` (in place) reduces it
  (the transport's ``all_reduce_kind``, :func:`all_reduce_source`; the kernels synchronize
  the ranks themselves).
  ``+fused`` (``finer``, ``ce``): one persistent GEMM whose epilogue stores each tile into
  every rank's staging block and flags it there; each rank reduces chunk j once the W
  sources' flags are set (``ficco.plan.fused``).
- **rs_ag** (``shard``/``finer`` + ``rs_ag``): gemm_rs's lowering of the same schedule (the
  reduce-scatter overlapped with the GEMM, its reductions writing this rank's rows of ``c``),
  then every reduced chunk pushed to every peer's ``c`` (the all-gather), each as soon as its
  reduction is done. With ``+fused`` the reduce-scatter is gemm_rs's fused one.

With the add_rms_norm epilogue (``ficco.patterns.epilogues``) each rank also holds
``residual [M, N]`` and ``norm_weight [1, N]`` (replicated: the same on every rank), ``c``
becomes a workspace and the output is ``y [2, M, N]`` (``y[0]`` the normed rows, ``y[1]``
the new residual). The plan above is lowered as it is without the epilogue, then
:func:`with_norm` adds one :class:`NormOp` per
task that writes whole rows of ``c`` (a chunk's all-reduce or reduction, a received block of
the all-gather), right behind it on its stream, so chunk j's norm overlaps chunk j+1's GEMM;
where chunks cut the columns (``split n``) no row is whole before the last chunk, so one
norm over every row follows them all. A ``lamport1`` / ``lamport2`` chunk all-reduce of whole
rows becomes the norm itself, its kernel's fused epilogue (one launch, the sum never
stored), for rows of at most ``MAX_FUSED_NORM_COLUMNS``. The add_rms_norm_fp8 epilogue
lowers the same, its norms reading ``norm_scale [1, 1]`` (fp32, constant) and writing the
output's two parts, ``normed [M, N]`` (fp8_e4m3) and ``new_residual [M, N]``, in place of
``y``'s.

Every schedule of a problem uses the same buffers (the executors allocate them once).
"""

from __future__ import annotations

import dataclasses

from ficco.patterns.epilogues import (
    FP8_OUTPUTS,
    MAX_FUSED_NORM_COLUMNS,
    NORM_EPS,
    NORM_SCALE,
    has_fp8_norm,
    has_norm,
)
from ficco.plan.build import (
    Builder,
    exchange,
    peer_steps,
)
from ficco.plan.dense import plan_gemm_rs
from ficco.plan.fused import plan_gemm_ar_fused
from ficco.plan.ops import (
    PUSH,
    BufferSpec,
    CollectiveOp,
    Direction,
    GemmOp,
    NormOp,
    Op,
    Plan,
    ReduceOp,
    Region,
    Stream,
    Task,
    TransferOp,
)
from ficco.plan.tags import transfer_tag
from ficco.problem import Pattern, Problem
from ficco.space import AllReduce, Compute, Granularity, Schedule, Split
from ficco.space.geometry import cut


def ar_buffers(p: Problem, rank: int = 0) -> tuple[BufferSpec, ...]:
    """Every rank's buffers (the same on every rank)."""
    w, M, K, N = p.world, p.m, p.k, p.n
    norm = has_norm(p)
    out = (
        BufferSpec("a", (M, K), "input"),
        BufferSpec("b", (K, N), "input"),
        BufferSpec("partial", (M, N), "workspace"),
        BufferSpec("staging", (w * M, N), "workspace", peer_visible=True),
        BufferSpec("c", (M, N), "workspace" if norm else "output", peer_visible=True),
    )
    if not norm:
        return out
    replicated = (
        BufferSpec("residual", (M, N), "replicated"),
        BufferSpec("norm_weight", (1, N), "replicated"),
    )
    if not has_fp8_norm(p):
        return (*out, *replicated, BufferSpec("y", (2, M, N), "output"))
    normed, new_residual = FP8_OUTPUTS
    return (
        *out,
        *replicated,
        BufferSpec(NORM_SCALE, (1, 1), "constant", dtype="fp32"),
        BufferSpec(normed, (M, N), "output", dtype="fp8_e4m3", scale=NORM_SCALE),
        BufferSpec(new_residual, (M, N), "output"),
    )


def plan_gemm_ar(p: Problem, s: Schedule, rank: int) -> Plan:
    if s.all_reduce is AllReduce.RS_AG:
        plan = _plan_rs_ag(p, s, rank)
    elif s.compute is Compute.FUSED:
        plan = plan_gemm_ar_fused(p, s, rank, ar_buffers(p))
    else:
        plan = _plan_direct(p, s, rank)
    return with_norm(plan) if has_norm(p) else plan


def _writes_c(op: Op) -> Region | None:
    """The region of ``c`` a task of a gemm_ar plan leaves final, or None."""
    if isinstance(op, CollectiveOp) and op.dst == "c":
        return Region("c", op.rows, op.cols)
    if isinstance(op, ReduceOp) and op.out.buffer == "c":
        return op.out
    if isinstance(op, TransferOp) and op.direction is Direction.RECV and op.local.buffer == "c":
        return op.local
    return None


def _norm(p: Problem, summed: Region, all_reduce=None) -> NormOp:
    """The epilogue over ``summed``'s rows (all N columns)."""
    rows, cols = summed.rows, (0, p.n)
    if has_fp8_norm(p):
        normed, new_residual = (Region(name, rows, cols) for name in FP8_OUTPUTS)
        scale = Region(NORM_SCALE, (0, 1), (0, 1))
    else:
        normed, new_residual = (Region("y", rows, cols, index=i) for i in (0, 1))
        scale = None
    return NormOp(
        summed=summed,
        residual=Region("residual", rows, cols),
        weight=Region("norm_weight", (0, 1), cols),
        normed=normed,
        new_residual=new_residual,
        eps=NORM_EPS,
        all_reduce=all_reduce,
        scale=scale,
    )


def with_norm(plan: Plan) -> Plan:
    """``plan`` with the add_rms_norm epilogue, its output ``y`` (add_rms_norm_fp8: the parts
    ``normed``, ``new_residual``; the module docstring)."""
    p = plan.problem
    writers = {t.id: region for t in plan.tasks if (region := _writes_c(t.op)) is not None}
    spans = sorted(r.rows for r in writers.values())
    # every final write of c covers whole rows, each row once: norm behind each of them
    per_writer = all(r.cols == (0, p.n) for r in writers.values()) and all(
        a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)
    )
    fuse = per_writer and p.n <= MAX_FUSED_NORM_COLUMNS
    bld = Builder()
    new_id: dict[int, int] = {}
    for task in plan.tasks:
        op, deps = task.op, [new_id[d] for d in task.deps]
        if fuse and isinstance(op, CollectiveOp) and op.kind.fuses_add_rms_norm:
            summed = Region(op.src, op.rows, op.cols)  # this rank's partial: reduced in-kernel
            new_id[task.id] = bld.add(_norm(p, summed, op.kind), task.stream, deps, task.chunk)
            continue
        new_id[task.id] = bld.add(op, task.stream, deps, task.chunk)
        if per_writer and task.id in writers:
            bld.add(_norm(p, writers[task.id]), task.stream, [new_id[task.id]], task.chunk)
    if not per_writer:  # column chunks: every row is whole once the last one is written
        last = [new_id[i] for i in writers]
        bld.add(_norm(p, Region("c", (0, p.m), (0, p.n))), Stream.COMPUTE, last)
    output = FP8_OUTPUTS if has_fp8_norm(p) else "y"
    return dataclasses.replace(plan, tasks=tuple(bld.tasks), output=output)


def all_reduce_source(s: Schedule) -> str:
    """The buffer a direct chunk's GEMM writes and its all-reduce reads: the output ``c``
    for an in-place kernel (two-shot: each rank reduces 1/W of the chunk and stores it into
    every rank's ``c``); peer-visible ``staging`` row block 0 for a symmetric-memory kernel
    that reads every rank at the same offset (one-shot); else ``partial`` (NCCL's, which
    the executor copies into ``c`` and reduces there; pushed partials reduced by the ranks)."""
    t = s.transport.traits
    if t.all_reduce_in_place:
        return "c"
    return "staging" if t.all_reduce_kind is not None and t.symmetric_memory else "partial"


def _plan_direct(p: Problem, s: Schedule, rank: int) -> Plan:
    w, M, K, N = p.world, p.m, p.k, p.n
    bld = Builder()
    split_n = s.split is Split.N and s.granularity is Granularity.FINER
    pieces = cut(N if split_n else M, s)
    # NCCL's all-reduce, or a symmetric-memory kernel, is one collective per chunk; copy
    # engines and NCCL's zero-CTA copies cannot reduce, so they push the partials and the
    # ranks reduce them (the space refuses serial nccl_ce)
    kind, written = s.transport.traits.all_reduce_kind, all_reduce_source(s)
    peers = peer_steps(rank, w, True)[:-1]  # (receive from, send to), step by step
    for j, piece in enumerate(pieces):
        rows, cols = ((0, M), piece) if split_n else (piece, (0, N))
        g = bld.add(
            GemmOp(
                Region("a", rows, (0, K)), Region("b", (0, K), cols), Region(written, rows, cols)
            ),
            Stream.COMPUTE,
            chunk=(rank, j),
        )
        if kind is not None:
            bld.add(
                CollectiveOp(kind, written, "c", rows=rows, cols=cols),
                Stream.COMM,
                [g],
                chunk=(rank, j),
            )
            continue

        def staged(src: int, rows=rows, cols=cols) -> Region:
            return Region("staging", (src * M + rows[0], src * M + rows[1]), cols)

        mine = Region("partial", rows, cols)
        recvs = [
            exchange(
                bld,
                transfer_tag(i, j),
                PUSH,
                send=(dst, mine, staged(rank)),
                recv=(src, staged(src), mine),
                send_deps=[g],
                chunk=j,
            )
            for i, (src, dst) in enumerate(peers)
        ]
        # in rank order on every rank: the same sum, bit for bit, everywhere
        inputs = tuple(mine if src == rank else staged(src) for src in range(w))
        bld.add(
            ReduceOp(inputs, Region("c", rows, cols)),
            Stream.COMPUTE,
            [g, *recvs],
            chunk=(rank, j),
        )
    return Plan(p, s, rank, ar_buffers(p), tuple(bld.tasks), "c")


def _plan_rs_ag(p: Problem, s: Schedule, rank: int) -> Plan:
    """gemm_rs's plan for the same schedule, its reductions retargeted from ``c_shard`` to
    this rank's rows of ``c``, then the all-gather of each reduced chunk."""
    w, S = p.world, p.m_shard
    # gemm_rs's problem of the same sizes (gemm_ar's own fields, its epilogue, left behind)
    as_rs = dataclasses.replace(p, pattern=Pattern.GEMM_RS, pattern_fields=())
    rs = plan_gemm_rs(as_rs, dataclasses.replace(s, all_reduce=AllReduce.DIRECT), rank)
    own = rank * S  # c_shard row 0 is c row rank * S
    bld = Builder(list(_retarget_c_shard(rs.tasks, own)))
    reductions = [t for t in bld.tasks if isinstance(t.op, ReduceOp)]
    peers = peer_steps(rank, w, True)[:-1]
    for j, task in enumerate(reductions):
        rows, cols = task.op.out.rows, task.op.out.cols  # rows of c, inside this rank's shard
        for i, (src, dst) in enumerate(peers):
            reduced = Region("c", rows, cols)
            theirs = Region("c", (rows[0] - own + src * S, rows[1] - own + src * S), cols)
            exchange(
                bld,
                transfer_tag(w + i, j),  # after the reduce-scatter's steps: distinct tags
                PUSH,
                send=(dst, reduced, reduced),
                recv=(src, theirs, theirs),
                send_deps=[task.id],
                chunk=j,
            )
    return Plan(p, s, rank, ar_buffers(p), tuple(bld.tasks), "c")


def _retarget_c_shard(tasks: tuple[Task, ...], row0: int) -> list[Task]:
    """The reductions into ``c_shard [S, N]`` written into ``c`` rows ``row0 .. row0 + S``."""
    out = []
    for task in tasks:
        op = task.op
        if isinstance(op, ReduceOp) and op.out.buffer == "c_shard":
            rows = (row0 + op.out.rows[0], row0 + op.out.rows[1])
            op = ReduceOp(op.inputs, Region("c", rows, op.out.cols))
        elif isinstance(op, CollectiveOp):  # pragma: no cover - rs_ag is never serial
            raise ValueError("rs_ag lowers only overlapped schedules")
        out.append(dataclasses.replace(task, op=op))
    return out
