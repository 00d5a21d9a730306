"""Legality rules: one named predicate per constraint.

Each rule takes ``(problem, schedule)`` and returns ``None`` when the schedule obeys it, or a
sentence saying why not. Enumeration, parsing checks and the sweep's pruning all call
``violations``, so there is one definition of "legal". A rule is one function decorated
with ``@rule(reads)``, in the place it is reported: ``RULES``, ``PREFIX_RULES`` and
``point_legal``'s order are derived from the decorations (``reads``: :class:`Reads`).

Chunk sizes that don't divide evenly are handled exactly: chunks differ by at most one row
(``m`` and ``b`` splits) or one alignment quantum (``n``/``k`` splits); the rule ``chunks_fit_extent``
excludes cuts that would leave a chunk empty.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable

from ficco.defaults import SM_COUNT
from ficco.patterns import Pattern, patterns_where, spec_of
from ficco.patterns.spec import Collective
from ficco.problem import DTYPE_BYTES, SCALED_GEMM_ALIGN, Problem
from ficco.space.geometry import cut, quantum, split_extent
from ficco.space.schedule import (
    RELAYS,
    AllReduce,
    Compute,
    Gemm,
    Granularity,
    Order,
    Priority,
    Schedule,
    Split,
)
from ficco.space.transports import Transport, names, transports_where

Rule = Callable[[Problem, Schedule], "str | None"]


class Reads(enum.Enum):
    """What a rule reads, which says where the enumerator may check it."""

    PREFIX = "prefix"
    """Only a schedule's granularity, chunks, split and transport (and the problem): the
    enumerator checks it once per such prefix of the axis product, not at each of the ~10,000
    points (these rules reject about four in five). A rule that reads another axis does not
    belong here (tests/test_space.py compares against the full product)."""
    AXES = "axes"
    """Only the schedule's own axes (and the problem's W): cheap, checked first."""
    ANY = "any"
    """Anything (the problem's sizes and dtype, the pattern's spec)."""


#: every rule and what it reads, in the order of definition (``rule`` adds to it)
_REGISTERED: dict[Rule, Reads] = {}


def rule(reads: Reads = Reads.ANY) -> Callable[[Rule], Rule]:
    """Register the decorated function as a legality rule that reads ``reads``; a second
    rule of the same name is refused (``violations`` names rules by their function)."""

    def register(fn: Rule) -> Rule:
        if any(r.__name__ == fn.__name__ for r in _REGISTERED):
            raise ValueError(f"rule: {fn.__name__} is registered twice")
        _REGISTERED[fn] = reads
        return fn

    return register


@rule(Reads.PREFIX)
def granularity_fixes_chunks(p: Problem, s: Schedule) -> str | None:
    if s.granularity is Granularity.FINER:
        if s.chunks < 2:
            return "finer granularity cuts each shard into chunks >= 2 (use 'shard' for 1)"
    elif s.chunks != 1 or s.split is not Split.M:
        return f"{s.granularity.value} granularity has one chunk per shard and no split"
    return None


@rule(Reads.PREFIX)
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


@rule()
def chunks_fit_extent(p: Problem, s: Schedule) -> str | None:
    extent, step = split_extent(p, s.split, s), quantum(s.split)
    if s.chunks * step > extent:
        return (
            f"{s.chunks} chunks of at least {step} along {s.split.value} need an extent of "
            f"{s.chunks * step}, the shard has {extent}"
        )
    return None


# --- what the transport can do (its traits, ficco.space.transports) ------------------------


@rule(Reads.PREFIX)
def transport_serves_pattern(p: Problem, s: Schedule) -> str | None:
    return _unserved(s.transport, p.pattern)


@functools.cache
def _unserved(transport: Transport, pattern: Pattern) -> str | None:
    # cached: it reads only the registries, and the enumerator asks it at every point of the
    # axis product (its sentence lists the patterns and the transports: most of the cost)
    t, spec = transport.traits, spec_of(pattern)
    if not t.serves(spec):
        alternatives = names(transports_where(lambda x: x.serves(spec)))
        return (
            f"{transport.value} ({t.summary}) serves {', '.join(map(str, t.patterns))} only, "
            f"not {pattern} (use {alternatives})"
        )
    return None


@rule()
def transport_moves_dtype(p: Problem, s: Schedule) -> str | None:
    # what the collective moves: A's dtype for a gather or dispatch, the output's (bf16
    # partials for fp8) for a reduction or combine
    t, moved = s.transport.traits, spec_of(p.pattern).moved_dtype(p)
    if t.dtypes is not None and moved not in t.dtypes:
        return (
            f"{s.transport.value} ({t.summary}) runs {' and '.join(t.dtypes)} only, not the "
            f"{moved} that {p.pattern} moves for dtype {p.dtype}"
        )
    return None


@rule()
def transport_needs_contiguous_chunks(p: Problem, s: Schedule) -> str | None:
    # A strided slice makes copy_ launch an SM kernel, which defeats the copy engine; the
    # symmetric-memory kernels take one contiguous range of the buffer (the same offset on
    # every rank).
    # A batch chunk (emb_a2a) is one contiguous run of rows per table, each copied whole.
    t = s.transport.traits
    if t.contiguous_only and s.split not in (Split.M, Split.B):
        return (
            f"{s.transport.value} ({t.summary}) moves contiguous row chunks only; split "
            f"{s.split.value} chunks are strided (use row chunks, -m)"
        )
    return None


@rule()
def transport_needs_aligned_ranges(p: Problem, s: Schedule) -> str | None:
    t = s.transport.traits
    align, spec = t.alignment_bytes, spec_of(p.pattern)
    if align == 1 or not t.serves(spec) or s.split not in (Split.M, Split.B):
        return None  # strided chunks and other patterns are refused by the rules above
    # a range is whole rows of the matrix the collective moves (A or x [*, K]; C or y [*, N])
    width, name, moved = spec.moved_cols(p), spec.moved_dim, spec.moved_dtype(p)
    row_bytes = width * DTYPE_BYTES[moved]
    if row_bytes % align == 0:
        return None
    if spec.batched_blocks:
        # a block's segments start at whatever row the routing (or table layout) puts them
        return (
            f"{s.transport.value} moves {align}-byte vectors: a row of {name}={width} "
            f"{moved} elements is {row_bytes} bytes, not a multiple of {align}"
        )
    for r0, r1 in cut(split_extent(p, s.split, s), s):
        if (r0 * row_bytes) % align or ((r1 - r0) * row_bytes) % align:
            return (
                f"{s.transport.value} needs every chunk's offset and size to be multiples of "
                f"{align} bytes; rows {r0}..{r1} of {name}={width} {moved} are not"
            )
    return None


@rule()
def transport_reduces(p: Problem, s: Schedule) -> str | None:
    # ficco's own one-sided plans reduce what they push; a serial schedule's own collective
    # must reduce by itself
    t, collective = s.transport.traits, spec_of(p.pattern).collective
    if not t.reduces and collective.reduces and s.granularity is Granularity.SERIAL:
        return f"{s.transport.value} has no {collective.label} ({t.summary}: they do not reduce)"
    return None


@rule()
def rs_ag_needs_transfers(p: Problem, s: Schedule) -> str | None:
    # rs_ag builds its all-reduce from gemm_rs's transfers and reductions; a symmetric-memory
    # kernel is a whole all-reduce of its chunk (two-shot is itself a reduce-scatter then an
    # all-gather, inside one kernel)
    t = s.transport.traits
    if s.all_reduce is AllReduce.RS_AG and not t.moves_transfers:
        spec = spec_of(p.pattern)
        movers = transports_where(lambda x: x.moves_transfers and x.serves(spec))
        return (
            f"{s.transport.value} ({t.summary}) all-reduces each chunk whole; rs_ag builds "
            f"its all-reduce from transfers (use {names(movers)} with rs_ag)"
        )
    return None


@rule()
def rs_ag_needs_all_reduce(p: Problem, s: Schedule) -> str | None:
    if s.all_reduce is AllReduce.RS_AG and not spec_of(p.pattern).all_reduce:
        return f"rs_ag builds an all-reduce; {p.pattern} has none"
    return None


@rule(Reads.AXES)
def rs_ag_needs_overlap(p: Problem, s: Schedule) -> str | None:
    # Split only to overlap the reduce-scatter with the GEMM; a serial all-reduce is one
    # collective (NCCL's ring is itself a reduce-scatter then an all-gather).
    if s.all_reduce is AllReduce.RS_AG and not s.overlapped:
        return (
            "rs_ag overlaps the reduce-scatter with the GEMM; serial all-reduces in one collective"
        )
    return None


@rule()
def rs_ag_needs_even_shards(p: Problem, s: Schedule) -> str | None:
    if s.all_reduce is AllReduce.RS_AG and p.m % p.world:
        return (
            f"rs_ag reduce-scatters M/W rows to each rank, so m={p.m} must be divisible by "
            f"world={p.world}"
        )
    return None


def _direct_all_reduce(p: Problem, s: Schedule) -> bool:
    return spec_of(p.pattern).all_reduce and s.all_reduce is AllReduce.DIRECT


@rule()
def direct_all_reduce_has_no_shards(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.granularity is Granularity.SHARD:
        return "a direct all-reduce has no per-peer shards: use finer chunks, or shard with rs_ag"
    return None


@rule()
def direct_all_reduce_has_no_peer_order(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.order is Order.ALL_PEERS:
        return "a direct all-reduce sends each chunk to every peer at once: no ring to reorder"
    return None


@rule()
def direct_all_reduce_has_no_merge(p: Problem, s: Schedule) -> str | None:
    if _direct_all_reduce(p, s) and s.compute is Compute.MERGED:
        return "a direct all-reduce has no per-peer shard to merge chunks into (one GEMM is serial)"
    return None


@rule(Reads.AXES)
def order_needs_two_peers(p: Problem, s: Schedule) -> str | None:
    if s.order is Order.ALL_PEERS and (p.world < 3 or not s.overlapped):
        return "all_peers differs from the ring only in overlapped schedules with W >= 3"
    return None


@rule()
def relay_needs_relay_pattern(p: Problem, s: Schedule) -> str | None:
    if s.order in RELAYS and not spec_of(p.pattern).relay:
        relays = ", ".join(map(str, patterns_where(lambda spec: spec.relay)))
        return f"{s.order.value} rings exist for {relays} only, not {p.pattern}"
    return None


@rule(Reads.AXES)
def relay_needs_overlap(p: Problem, s: Schedule) -> str | None:
    if s.order in RELAYS and not s.overlapped:
        return f"{s.order.value} is a ring of per-step hops; a serial schedule moves all at once"
    return None


@rule()
def relay_needs_one_sided(p: Problem, s: Schedule) -> str | None:
    # Each hop's send follows the receive of the step before (gemm_rs adds onto it, ag_gemm
    # forwards it): a two-sided ring whose sends wait on their neighbours' receives would
    # deadlock, and NCCL batches only a step's halves that share a tag.
    if s.order in RELAYS and not s.transport.traits.one_sided:
        movers = names(transports_where(lambda t: t.one_sided and not t.batches_segments))
        return (
            f"{s.order.value} hops are one-sided pushes ({movers}); {s.transport.value} "
            "pairs each send with a receive of the same step"
        )
    return None


@rule(Reads.AXES)
def relay_computes_per_chunk(p: Problem, s: Schedule) -> str | None:
    if s.order in RELAYS and s.compute in (Compute.MERGED, Compute.FUSED):
        return (
            f"{s.order.value} reduces or forwards each chunk behind its own GEMM; "
            f"{s.compute.value} compute runs one GEMM over many chunks"
        )
    return None


@rule()
def relay_moves_unscaled_rows(p: Problem, s: Schedule) -> str | None:
    # ag_gemm's hops push A's rows; fp8 rows' scales move beside pulls only
    # (ficco.execute.cuda_scaled)
    if s.order in RELAYS and p.scaled and spec_of(p.pattern).moved_dim == "k":
        return (
            f"{s.order.value} pushes {p.dtype} rows of A, whose row scales move beside "
            "pulls only: use a direct order"
        )
    return None


@rule(Reads.AXES)
def birelay_needs_even_chunks(p: Problem, s: Schedule) -> str | None:
    if s.order is Order.BIRELAY and (s.granularity is not Granularity.FINER or s.chunks % 2):
        return (
            "birelay sends even chunks one way round the ring and odd ones the other: it needs "
            "finer granularity with an even chunk count"
        )
    return None


@rule()
def epilogue_needs_reducing_relay(p: Problem, s: Schedule) -> str | None:
    # the GEMM accumulates onto the partial its neighbour passed on: a reduce-scatter's relay
    if s.compute is Compute.EPILOGUE and (
        s.order not in RELAYS or spec_of(p.pattern).collective is not Collective.REDUCE_SCATTER
    ):
        return (
            "epilogue compute adds the partial received from the previous hop in the GEMM: "
            "it needs a reduce-scatter (gemm_rs) with relay or birelay order"
        )
    return None


@rule(Reads.AXES)
def transport_relay_only(p: Problem, s: Schedule) -> str | None:
    t = s.transport.traits
    if t.relay_only and s.order not in RELAYS:
        return (
            f"{s.transport.value} ({t.summary}) moves relay hops only: use +relay or "
            "+birelay, or another transport for the direct orders"
        )
    return None


@rule(Reads.AXES)
def merged_needs_finer(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.MERGED and s.granularity is not Granularity.FINER:
        return (
            "merged compute regroups finer chunks; serial and shard already have one GEMM per shard"
        )
    return None


@rule()
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


@rule(Reads.AXES)
def fused_needs_overlap(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.FUSED and not s.overlapped:
        return "fused compute waits on per-chunk flags; a serial schedule has nothing to wait on"
    return None


@rule(Reads.AXES)
def fused_needs_triton(p: Problem, s: Schedule) -> str | None:
    if s.compute is Compute.FUSED and s.gemm is not Gemm.TRITON:
        return "fused compute is ficco's persistent Triton GEMM (cuBLAS cannot wait on flags)"
    return None


@rule(Reads.AXES)
def fused_needs_row_chunks(p: Problem, s: Schedule) -> str | None:
    # A tile covers rows of one chunk only when chunks are row ranges; a k or n cut would make
    # every tile wait on every chunk of its shard (merged compute, with spinning SMs). Pooling
    # has no tiles across bags: a batch chunk's bags are its own.
    if s.compute is Compute.FUSED and s.split not in (Split.M, Split.B):
        return f"fused compute waits per row chunk; split {s.split.value} is not a row cut"
    return None


@rule(Reads.AXES)
def fused_needs_symmetric_memory(p: Problem, s: Schedule) -> str | None:
    # Flags live in symmetric memory and are set by the copy engine's stream (or the peer's
    # stores); an SM-based transport beside a GEMM that spins on its SMs could starve. For
    # gemm_ar the fused GEMM's stores are the all-reduce's transport: symm1/symm2 would be a
    # second one.
    if s.compute is Compute.FUSED and not s.transport.traits.carries_flags:
        carriers = names(transports_where(lambda t: t.carries_flags))
        return (
            f"fused compute needs the {carriers} transport (flags in symmetric memory set "
            f"after its copies or the peer's stores), not {s.transport.value}"
        )
    return None


@rule(Reads.AXES)
def sm_reserve_needs_triton(p: Problem, s: Schedule) -> str | None:
    if s.sm_reserve and s.gemm is not Gemm.TRITON:
        return "an SM reserve needs the Triton GEMM (cuBLAS takes no SM budget)"
    return None


@rule(Reads.AXES)
def sm_reserve_needs_sm_comm(p: Problem, s: Schedule) -> str | None:
    # A fused GEMM holds the SMs it is given for its whole run (spinning where a chunk has not
    # arrived); the SMs it leaves run the owner's reductions (gemm_rs) beside it.
    if s.compute is Compute.FUSED:
        return None
    # symm1/symm2 run on SMs too, but torch's ops take no SM budget (their grids, at most 24
    # blocks, are fixed inside the op, CUDASymmetricMemoryOps.cu), so their traits leave them
    # out of the reserve like the copy engines until a measurement shows a GEMM-side one pays
    if s.sm_reserve and (not s.transport.traits.sm_reserve or not s.overlapped):
        reserved = names(transports_where(lambda t: t.sm_reserve))
        return (
            f"an SM reserve only helps SM-based communication ({reserved}) or a fused GEMM "
            "running beside other work"
        )
    return None


@rule(Reads.AXES)
def sm_reserve_leaves_sms(p: Problem, s: Schedule) -> str | None:
    # A reserve is refused, never clamped: +sm99999 is a typo, not "all SMs but one".
    if s.sm_reserve >= SM_COUNT:
        return (
            f"an SM reserve of {s.sm_reserve} leaves the GEMM no SM: the GPUs ficco targets "
            f"have {SM_COUNT} SMs (ficco.defaults.SM_COUNT), so the reserve must be below that"
        )
    return None


@rule(Reads.AXES)
def priority_needs_overlap(p: Problem, s: Schedule) -> str | None:
    if s.comm_priority is Priority.HIGH and not s.overlapped:
        return "stream priority only matters when communication overlaps compute"
    return None


@rule()
def scaled_gemm_chunks_aligned(p: Problem, s: Schedule) -> str | None:
    # a k or n chunk is a GEMM's K or N: FP8 tensor cores take multiples of 16 there
    if not p.scaled or s.split is Split.M:
        return None
    for lo, hi in cut(split_extent(p, s.split, s), s):
        if lo % SCALED_GEMM_ALIGN or (hi - lo) % SCALED_GEMM_ALIGN:
            return (
                f"{p.dtype} GEMMs take {s.split.value} in multiples of {SCALED_GEMM_ALIGN}; "
                f"the chunk {s.split.value}={lo}..{hi} is not"
            )
    return None


def _of(reads: Reads) -> tuple[Rule, ...]:
    return tuple(check for check, r in _REGISTERED.items() if r is reads)


#: Every rule, in the order they are defined above: the order ``violations`` reports them.
RULES: tuple[Rule, ...] = tuple(_REGISTERED)
#: The rules the enumerator checks once per (granularity, chunks, split, transport) prefix.
PREFIX_RULES: tuple[Rule, ...] = _of(Reads.PREFIX)
#: What ``point_legal`` checks, in its order: the rules that read only the schedule's axes
#: first (cheap, and together they reject most points of the axis product), then every other
#: rule but the prefix rules.
_POINT_RULES: tuple[Rule, ...] = _of(Reads.AXES) + _of(Reads.ANY)


def violations(problem: Problem, schedule: Schedule) -> list[tuple[str, str]]:
    """``[(rule name, reason), ...]`` for every rule the schedule breaks (empty: legal)."""
    out = []
    for check in RULES:
        reason = check(problem, schedule)
        if reason is not None:
            out.append((check.__name__, reason))
    return out


def is_legal(problem: Problem, schedule: Schedule) -> bool:
    # stops at the first broken rule: most of the axis product breaks several
    return all(check(problem, schedule) is None for check in RULES)


def point_legal(problem: Problem, schedule: Schedule) -> bool:
    """``is_legal`` for a schedule whose (granularity, chunks, split, transport) obeys
    ``PREFIX_RULES`` (the enumerator checked them once for every point under it): the other
    rules, the quick ones first."""
    return all(check(problem, schedule) is None for check in _POINT_RULES)


def check_legal(problem: Problem, schedule: Schedule) -> Schedule:
    """Return the schedule, or raise ValueError naming every broken rule."""
    broken = violations(problem, schedule)
    if broken:
        reasons = "; ".join(f"{name}: {why}" for name, why in broken)
        raise ValueError(f"schedule {schedule} is illegal for {problem.key}: {reasons}")
    return schedule
