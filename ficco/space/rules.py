"""Legality rules: one named predicate per constraint.

Each rule takes ``(problem, schedule)`` and returns ``None`` when the schedule obeys it, or a
sentence saying why not. Enumeration, parsing checks and the sweep's pruning all call
``violations``, so there is one definition of "legal".

Chunk sizes that don't divide evenly are handled exactly: chunks differ by at most one row
(``m`` splits) or one alignment quantum (``n``/``k`` splits); the rule ``chunks_fit_extent``
excludes cuts that would leave a chunk empty.
"""

from __future__ import annotations

from collections.abc import Callable

from ficco.defaults import SM_COUNT
from ficco.patterns import patterns_where, spec_of
from ficco.problem import Problem
from ficco.space.geometry import cut, quantum, split_extent
from ficco.space.schedule import (
    AllReduce,
    Compute,
    Gemm,
    Granularity,
    Order,
    Priority,
    Schedule,
    Split,
    Transport,
)

Rule = Callable[[Problem, Schedule], "str | None"]


def granularity_fixes_chunks(p: Problem, s: Schedule) -> str | None:
    if s.granularity is Granularity.FINER:
        if s.chunks < 2:
            return "finer granularity cuts each shard into chunks >= 2 (use 'shard' for 1)"
    elif s.chunks != 1 or s.split is not Split.M:
        return f"{s.granularity.value} granularity has one chunk per shard and no split"
    return None


def split_applies_to_pattern(p: Problem, s: Schedule) -> str | None:
    # ag_gemm's collective moves A, so N cannot cut it; gemm_rs's and gemm_ar's move C, so K
    # cannot; the all-to-alls move whole token rows (each spec's ``splits``)
    allowed = spec_of(p.pattern).splits
    if s.split not in allowed:
        names = ", ".join(x.value for x in allowed)
        return (
            f"{p.pattern} can only split {names}: split {s.split.value} does not cut its collective"
        )
    return None


def chunks_fit_extent(p: Problem, s: Schedule) -> str | None:
    extent, step = split_extent(p, s.split, s), quantum(s.split)
    if s.chunks * step > extent:
        return (
            f"{s.chunks} chunks of at least {step} along {s.split.value} need an extent of "
            f"{s.chunks * step}, the shard has {extent}"
        )
    return None


def copy_engine_needs_contiguous_chunks(p: Problem, s: Schedule) -> str | None:
    # A strided slice makes copy_ launch an SM kernel, which defeats the copy engine.
    if s.transport in (Transport.CE, Transport.NCCL_CE) and s.split is not Split.M:
        return f"{s.transport.value} moves contiguous row chunks only; split {s.split.value} is strided"
    return None


def copy_engine_cannot_reduce(p: Problem, s: Schedule) -> str | None:
    # NCCL's zero-CTA collectives have no reductions; ficco's own CE plans reduce locally.
    collective = spec_of(p.pattern).collective
    if (
        s.transport is Transport.NCCL_CE
        and collective.reduces
        and s.granularity is Granularity.SERIAL
    ):
        return f"nccl_ce has no {collective.value} (copy engines do not reduce)"
    return None


#: dtypes torch's symmetric-memory all-reduce kernels dispatch (``AT_DISPATCH_FLOAT_AND_BFLOAT16``
#: in ``CUDASymmetricMemoryOps.cu``): no fp16
SYMM_DTYPES = ("fp32", "bf16")
#: the kernels' smallest vector: a range's offset and size in bytes are multiples of this
#: (``get_and_verify_alignment``: max(4, element size))
SYMM_ALIGNMENT_BYTES = 4


def symm_kernels_need_all_reduce(p: Problem, s: Schedule) -> str | None:
    if s.transport.is_symm_all_reduce and not spec_of(p.pattern).all_reduce:
        return (
            f"{s.transport.value} is PyTorch symmetric memory's all-reduce kernel; {p.pattern} "
            "has no all-reduce (use ce, nccl or nccl_ce)"
        )
    return None


def symm_kernels_reduce_whole_chunks(p: Problem, s: Schedule) -> str | None:
    # rs_ag builds its all-reduce from gemm_rs's transfers and reductions; a symmetric-memory
    # kernel is a whole all-reduce of its chunk (two-shot is itself a reduce-scatter then an
    # all-gather, inside one kernel)
    if s.transport.is_symm_all_reduce and s.all_reduce is AllReduce.RS_AG:
        return (
            f"{s.transport.value} all-reduces each chunk whole in one kernel; rs_ag builds its "
            "all-reduce from transfers (use ce, nccl or nccl_ce with rs_ag)"
        )
    return None


def symm_kernels_need_contiguous_chunks(p: Problem, s: Schedule) -> str | None:
    # the kernels take one contiguous range of a symmetric buffer (the same offset on every
    # rank); a column chunk of the row-major [M, N] output is strided
    if s.transport.is_symm_all_reduce and s.split is not Split.M:
        return (
            f"{s.transport.value} reduces a contiguous range of the symmetric buffer; split "
            f"{s.split.value} chunks are strided (use row chunks, -m)"
        )
    return None


def symm_kernels_need_fp32_or_bf16(p: Problem, s: Schedule) -> str | None:
    if s.transport.is_symm_all_reduce and p.dtype not in SYMM_DTYPES:
        return (
            f"torch's symmetric-memory all-reduce kernels run {' and '.join(SYMM_DTYPES)} only, "
            f"not dtype {p.dtype}"
        )
    return None


def symm_kernels_need_aligned_chunks(p: Problem, s: Schedule) -> str | None:
    # a row chunk [r0, r1) of the [M, N] buffer starts r0 * N elements in and holds
    # (r1 - r0) * N: with an odd N in bf16 an odd row count breaks the kernels' 4-byte vectors
    if not s.transport.is_symm_all_reduce or s.split is not Split.M:
        return None
    row_bytes = p.n * p.dtype_bytes
    for r0, r1 in cut(p.m, s):
        if (r0 * row_bytes) % SYMM_ALIGNMENT_BYTES or (
            (r1 - r0) * row_bytes
        ) % SYMM_ALIGNMENT_BYTES:
            return (
                f"{s.transport.value} needs every chunk's offset and size to be multiples of "
                f"{SYMM_ALIGNMENT_BYTES} bytes; rows {r0}..{r1} of n={p.n} {p.dtype} are not"
            )
    return None


def rs_ag_needs_all_reduce(p: Problem, s: Schedule) -> str | None:
    if s.all_reduce is AllReduce.RS_AG and not spec_of(p.pattern).all_reduce:
        return f"rs_ag builds an all-reduce; {p.pattern} has none"
    return None


def rs_ag_needs_overlap(p: Problem, s: Schedule) -> str | None:
    # Split only to overlap the reduce-scatter with the GEMM; a serial all-reduce is one
    # collective (NCCL's ring is itself a reduce-scatter then an all-gather).
    if s.all_reduce is AllReduce.RS_AG and not s.overlapped:
        return (
            "rs_ag overlaps the reduce-scatter with the GEMM; serial all-reduces in one collective"
        )
    return None


def rs_ag_needs_even_shards(p: Problem, s: Schedule) -> str | None:
    if s.all_reduce is AllReduce.RS_AG and p.m % p.world:
        return (
            f"rs_ag reduce-scatters M/W rows to each rank, so m={p.m} must be divisible by "
            f"world={p.world}"
        )
    return None


def _direct_all_reduce(p: Problem, s: Schedule) -> bool:
    return spec_of(p.pattern).all_reduce and s.all_reduce is AllReduce.DIRECT


def direct_all_reduce_has_no_shards(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.granularity is Granularity.SHARD:
        return "a direct all-reduce has no per-peer shards: use finer chunks, or shard with rs_ag"
    return None


def direct_all_reduce_has_no_peer_order(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.order is Order.ALL_PEERS:
        return "a direct all-reduce sends each chunk to every peer at once: no ring to reorder"
    return None


def direct_all_reduce_has_no_merge(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.compute is Compute.MERGED:
        return "a direct all-reduce has no per-peer shard to merge chunks into (one GEMM is serial)"
    return None


def order_needs_two_peers(p: Problem, s: Schedule) -> str | None:
    if s.order is Order.ALL_PEERS and (p.world < 3 or not s.overlapped):
        return "all_peers differs from the ring only in overlapped schedules with W >= 3"
    return None


def merged_needs_finer(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.MERGED and s.granularity is not Granularity.FINER:
        return (
            "merged compute regroups finer chunks; serial and shard already have one GEMM per shard"
        )
    return None


def fused_needs_dense_pattern(p: Problem, s: Schedule) -> str | None:
    # Patterns with a fused schedule (their spec's ``fused``): ag_gemm (tiles wait on arrival
    # flags), gemm_rs (the epilogue stores tiles into the owner's buffer) and gemm_ar (the
    # epilogue stores each tile into every rank's staging: a one-shot all-reduce by the
    # producer; or, with rs_ag, gemm_rs's fused reduce-scatter). The all-to-alls' blocks have
    # no fixed place per tile yet.
    if s.compute is Compute.FUSED and not spec_of(p.pattern).fused:
        names = ", ".join(map(str, patterns_where(lambda spec: spec.fused)))
        return f"fused compute exists for {names} only, not {p.pattern}"
    return None


def fused_needs_overlap(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.FUSED and not s.overlapped:
        return "fused compute waits on per-chunk flags; a serial schedule has nothing to wait on"
    return None


def fused_needs_triton(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.FUSED and s.gemm is not Gemm.TRITON:
        return "fused compute is ficco's persistent Triton GEMM (cuBLAS cannot wait on flags)"
    return None


def fused_needs_row_chunks(p: Problem, s: Schedule) -> str | None:
    # A tile covers rows of one chunk only when chunks are row ranges; a k or n cut would make
    # every tile wait on every chunk of its shard (merged compute, with spinning SMs).
    if s.compute is Compute.FUSED and s.split is not Split.M:
        return f"fused compute waits per row chunk; split {s.split.value} is not a row cut"
    return None


def fused_needs_symmetric_memory(p: Problem, s: Schedule) -> str | None:
    # Flags live in symmetric memory and are set by the copy engine's stream (or the peer's
    # stores); an SM-based transport beside a GEMM that spins on its SMs could starve. For
    # gemm_ar the fused GEMM's stores are the all-reduce's transport: symm1/symm2 would be a
    # second one.
    if s.compute is Compute.FUSED and s.transport is not Transport.CE:
        return (
            f"fused compute needs the ce transport (flags in symmetric memory set after "
            f"copy-engine copies or the peer's stores), not {s.transport.value}"
        )
    return None


# --- seg: one segment-copy kernel per step (the all-to-all patterns) ------------------------

#: the segment-copy kernel moves 16-byte vectors (``ficco.kernels.segment_copy.ALIGN_BYTES``):
#: every segment's offset and length must be multiples of it
SEG_ALIGNMENT_BYTES = 16


def seg_needs_all_to_all(p: Problem, s: Schedule) -> str | None:
    # ag_gemm / gemm_rs steps move one contiguous chunk of one peer, and the serial
    # collectives are one copy per peer behind a reduction or a gather: nothing to batch
    # that ce does not already issue as one copy; gemm_ar reduces (the spec's
    # ``batched_blocks``: steps that move several row blocks at once, one per peer)
    if s.transport is Transport.SEG and not spec_of(p.pattern).batched_blocks:
        return (
            f"seg batches a step's per-peer blocks of an all-to-all into one kernel; "
            f"{p.pattern} has no all-to-all (use ce)"
        )
    return None


def seg_needs_aligned_rows(p: Problem, s: Schedule) -> str | None:
    # a segment is whole rows of x [*, K] (dispatch) or y [*, N] (combine) in a buffer whose
    # base is aligned: rows of a multiple of 16 bytes keep every segment aligned
    spec = spec_of(p.pattern)
    if s.transport is not Transport.SEG or not spec.batched_blocks:
        return None
    width, name = spec.moved_cols(p), spec.moved_dim
    if (width * p.dtype_bytes) % SEG_ALIGNMENT_BYTES:
        return (
            f"seg copies {SEG_ALIGNMENT_BYTES}-byte vectors: a row of {name}={width} "
            f"{p.dtype} elements is {width * p.dtype_bytes} bytes, not a multiple of "
            f"{SEG_ALIGNMENT_BYTES}"
        )
    return None


#: transports that communicate on SMs, beside which an SM reserve can leave the GEMM room
SM_COMM_TRANSPORTS = (Transport.NCCL, Transport.SEG)


def sm_reserve_needs_triton(p: Problem, s: Schedule) -> str | None:
    if s.sm_reserve and s.gemm is not Gemm.TRITON:
        return "an SM reserve needs the Triton GEMM (cuBLAS takes no SM budget)"
    return None


def sm_reserve_needs_sm_comm(p: Problem, s: Schedule) -> str | None:
    # A fused GEMM holds the SMs it is given for its whole run (spinning where a chunk has not
    # arrived); the SMs it leaves run the owner's reductions (gemm_rs) beside it.
    if s.compute is Compute.FUSED:
        return None
    # symm1/symm2 run on SMs too, but torch's ops take no SM budget (their grids, at most 24
    # blocks, are fixed inside the op, CUDASymmetricMemoryOps.cu), so they are left out of
    # the reserve like the copy engines until a measurement shows a GEMM-side reserve pays
    if s.sm_reserve and (s.transport not in SM_COMM_TRANSPORTS or not s.overlapped):
        return (
            "an SM reserve only helps SM-based communication (nccl, seg) or a fused GEMM "
            "running beside other work"
        )
    return None


def sm_reserve_leaves_sms(p: Problem, s: Schedule) -> str | None:
    # A reserve is refused, never clamped: +sm99999 is a typo, not "all SMs but one".
    if s.sm_reserve >= SM_COUNT:
        return (
            f"an SM reserve of {s.sm_reserve} leaves the GEMM no SM: the GPUs ficco targets "
            f"have {SM_COUNT} SMs (ficco.defaults.SM_COUNT), so the reserve must be below that"
        )
    return None


def priority_needs_overlap(p: Problem, s: Schedule) -> str | None:
    if s.comm_priority is Priority.HIGH and not s.overlapped:
        return "stream priority only matters when communication overlaps compute"
    return None


RULES: tuple[Rule, ...] = (
    granularity_fixes_chunks,
    split_applies_to_pattern,
    chunks_fit_extent,
    copy_engine_needs_contiguous_chunks,
    copy_engine_cannot_reduce,
    symm_kernels_need_all_reduce,
    symm_kernels_reduce_whole_chunks,
    symm_kernels_need_contiguous_chunks,
    symm_kernels_need_fp32_or_bf16,
    symm_kernels_need_aligned_chunks,
    rs_ag_needs_all_reduce,
    rs_ag_needs_overlap,
    rs_ag_needs_even_shards,
    direct_all_reduce_has_no_shards,
    direct_all_reduce_has_no_peer_order,
    direct_all_reduce_has_no_merge,
    order_needs_two_peers,
    merged_needs_finer,
    fused_needs_dense_pattern,
    fused_needs_overlap,
    fused_needs_triton,
    fused_needs_row_chunks,
    fused_needs_symmetric_memory,
    seg_needs_all_to_all,
    seg_needs_aligned_rows,
    sm_reserve_needs_triton,
    sm_reserve_needs_sm_comm,
    sm_reserve_leaves_sms,
    priority_needs_overlap,
)


def violations(problem: Problem, schedule: Schedule) -> list[tuple[str, str]]:
    """``[(rule name, reason), ...]`` for every rule the schedule breaks (empty: legal)."""
    out = []
    for rule in RULES:
        reason = rule(problem, schedule)
        if reason is not None:
            out.append((rule.__name__, reason))
    return out


def is_legal(problem: Problem, schedule: Schedule) -> bool:
    return not violations(problem, schedule)


def check_legal(problem: Problem, schedule: Schedule) -> Schedule:
    """Return the schedule, or raise ValueError naming every broken rule."""
    broken = violations(problem, schedule)
    if broken:
        reasons = "; ".join(f"{name}: {why}" for name, why in broken)
        raise ValueError(f"schedule {schedule} is illegal for {problem.key}: {reasons}")
    return schedule
