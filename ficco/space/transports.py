"""Transports as data: the ``Transport`` enum and one frozen traits record per value.

Every question ficco asks about a transport (is it one-sided, does it run on SMs, which
patterns does it serve, is it captured in a CUDA graph, how does the cost model class it, ...)
is answered here, by ``traits(transport)`` or ``transport.traits``; no other module lists
transports by hand. The legality rules (``ficco.space.rules``), the lowering
(``ficco.plan``), both executors, the ops and the cost model read these records.

How to add a transport (the files it touches):

1. ``ficco/space/transports.py`` (this file): its ``Transport`` value and its
   ``TransportTraits`` record in ``TRAITS``. The space then enumerates it for the patterns it
   serves, the rules apply its constraints (dtypes, alignment, contiguous chunks, SM
   reserve, rs_ag, fused flags), the plans lower it by its traits (one-sided pulls and
   pushes, NCCL-style paired batches, segment groups, or a chunk all-reduce kind), the
   executors issue it by them and ``runs_as_graph`` decides its capture.
   ``tests/test_transports.py`` fails until the record exists.
2. Its primitive on each backend, where it moves data in a way no transport does yet: a
   new all-reduce kernel is a ``CollectiveOp`` kind in ``ficco/execute/allreduce.py`` (its
   CUDA call, its gloo stand-in, and ``SYMM_KINDS``, on which both executors dispatch). A
   transport that issues like an existing one (one-sided copies, paired NCCL batches, one
   segment-copy kernel per step, a chunk all-reduce of an existing kind) needs none.
3. Where the cost model should price it apart from the existing classes: its cost class in
   ``ficco/model/costs.py`` (``cost_class`` names one of ``COST_CLASSES``; a transport
   priced as an existing class touches nothing there). Until it has been measured and the
   model calibrated on it (``calibrated``), ``ficco predict`` leaves it out.

Tests aside, that is at most three files. (A wholly new way of moving data, such as ``seg``'s
one launch over many segments, is a new plan op, not only a transport: it adds the op to
``ficco.plan.ops``, its lowering, and a method to each backend's primitives.)
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ficco.patterns import Pattern, patterns_where, spec_of
from ficco.patterns.spec import Collective, PatternSpec
from ficco.words import Word


class Schedule(Protocol):
    """What this module reads of a ``ficco.space.schedule.Schedule`` (which imports this
    module, so it is described here, not imported)."""

    @property
    def transport(self) -> Transport: ...

    @property
    def overlapped(self) -> bool: ...


#: ``TimingOptions.graphs`` values: capture every schedule whose transport captures, only
#: those whose plans hold no NCCL call, or none
GRAPH_MODES = ("all", "ce", "none")


class CostClass(Word):
    """The cost model's classes of data movement (``ficco.model.costs``): copy-engine copies
    pulled or pushed one-sidedly, or NCCL send/recv batches on SMs."""

    CE = "ce"
    NCCL = "nccl"


COST_CLASSES = tuple(CostClass)


class Communicator(Word):
    """The NCCL communicators a transport's collectives and send/recv run on."""

    NCCL = "nccl"
    NCCL_ZERO_CTA = "nccl_zero_cta"


COMMUNICATORS = tuple(Communicator)
#: ``CollectiveOp`` kinds of torch's symmetric-memory all-reduce kernels (symm1, symm2)
ONE_SHOT_ALL_REDUCE = Collective.ONE_SHOT_ALL_REDUCE
TWO_SHOT_ALL_REDUCE = Collective.TWO_SHOT_ALL_REDUCE
SYMM_MEM_KINDS = tuple(c for c in Collective if c.symmetric_memory)
#: ``CollectiveOp`` kinds of ficco's Triton all-reduce kernels with value-encoded flags
#: (lamport1, lamport2: ``ficco.kernels.allreduce_lamport``)
LAMPORT_ONE_SHOT = Collective.LAMPORT_ONE_SHOT_ALL_REDUCE
LAMPORT_TWO_SHOT = Collective.LAMPORT_TWO_SHOT_ALL_REDUCE
LAMPORT_KINDS = tuple(c for c in Collective if c.lamport)


class Transport(enum.StrEnum):
    CE = "ce"  # copy engines through symmetric memory (pull for gathers, push for scatters)
    NCCL = "nccl"  # NCCL kernels on SMs
    NCCL_CE = "nccl_ce"  # NCCL zero-CTA (copy-engine) collectives, where the build has them
    # gemm_ar only: PyTorch symmetric memory's all-reduce kernels (on SMs) over the symmetric
    # buffer the chunk's GEMM wrote
    SYMM1 = "symm1"  # one-shot: every rank reads every peer's chunk and sums them
    SYMM2 = "symm2"  # two-shot: each rank reduces 1/W of the chunk, then all-gathers it
    # gemm_ar only: ficco's Triton all-reduce kernels over peer pointers, their ranks told
    # by flags that carry the call's epoch (no barrier per call; CUDA-graph replay safe)
    LAMPORT1 = "lamport1"  # one-shot: each rank pushes its chunk to every peer, sums W
    LAMPORT2 = "lamport2"  # two-shot: slices pushed to their owners, summed, all-gathered
    # all-to-all patterns only: each step's segments (every peer's chunk, the local block)
    # moved by one segment-copy kernel launch (on SMs) over the peers' symmetric buffers
    SEG = "seg"
    # ag_gemm / gemm_rs relay hops moved by a Triton kernel on SMs, storing straight into the
    # neighbour's symmetric buffer (no copy-engine floor per hop)
    SM = "sm"

    @property
    def traits(self) -> TransportTraits:
        return TRAITS[self]


class Capture(enum.StrEnum):
    """Which of a transport's schedules the CUDA executor captures into a graph."""

    ALWAYS = "always"  # every schedule (its plans capture whole)
    SERIAL = "serial"  # serial collectives only: its overlapped send/recv batches do not
    NEVER = "never"  # none: it is always issued eagerly


@dataclass(frozen=True, kw_only=True, slots=True)
class TransportTraits:
    """What one transport is: every answer the rest of ficco needs about it."""

    transport: Transport
    summary: str
    """One line: what moves the data, and how (errors quote it)."""
    one_sided: bool
    """Moves data through peers' symmetric buffers: the acting side pulls (gathers) or pushes
    (scatters), no collective, one start barrier. Otherwise its transfers are two-sided (both
    halves posted) and its serial schedules call a collective."""
    copy_engine: bool
    """Its bytes are moved by copy engines (DMA), not by kernels on SMs."""
    on_sms: bool
    """Its communication runs kernels on SMs, which contend with the GEMM for them."""
    sm_reserve: bool
    """A ``+smR`` reserve is offered beside it: SM-based communication whose kernels share
    the SMs the Triton GEMM leaves (torch's symmetric-memory ops fix their own grids, so they
    take none)."""
    symmetric_memory: bool
    """Its plans read or write peers' buffers in ficco's symmetric memory."""
    needs_signals: bool
    """Its pushes tell the receiver through symmetric memory's ``put_signal`` /
    ``wait_signal`` (the executor refuses it where torch has none)."""
    batches_pairs: bool
    """Two-sided: the send and receive halves of a step that share a tag are issued as one
    batch (``batch_isend_irecv``), so no rank blocks its peer's matching operation."""
    batches_segments: bool
    """Each step's transfers and local copies are issued as one operation (one segment-copy
    kernel over all their segments: a ``TransferGroupOp``)."""
    serves: Callable[[PatternSpec], bool]
    """Whether it serves a pattern, asked of the pattern's spec (so a new pattern with the
    capability gets the transport without an edit here)."""
    dtypes: tuple[str, ...] | None = None
    """The dtypes it moves (None: every dtype ficco knows)."""
    alignment_bytes: int = 1
    """Every range it moves starts and ends on a multiple of this many bytes."""
    contiguous_only: bool
    """It moves contiguous ranges only: a strided (column) chunk would turn a copy-engine
    copy into an SM kernel, or is not one range of the symmetric buffer."""
    moves_transfers: bool
    """It moves a plan's point-to-point transfers (rs_ag builds gemm_ar's all-reduce from
    them); False for a transport that is one whole collective kernel."""
    reduces: bool
    """A serial reduce-scatter or all-reduce can run on it: its collective reduces, or the
    ranks reduce what its one-sided pushes deliver (copy engines alone do not reduce)."""
    carries_flags: bool
    """A fused GEMM's per-chunk flags can ride on it (flags in symmetric memory, written
    after its copies or by the peer's stores)."""
    all_reduce_kind: Collective | None
    """The ``CollectiveOp`` kind one chunk's direct all-reduce (gemm_ar) lowers to; None:
    the partials are pushed and every rank reduces them."""
    relay_only: bool = False
    """It moves relay hops only (``+relay``, ``+birelay``): the direct orders' W - 1 peers
    at once stay on the other transports."""
    all_reduce_in_place: bool = False
    """That all-reduce sums the chunk where the GEMM wrote it (the output); otherwise it
    reads a separate buffer (peer-visible ``staging`` on symmetric memory, else
    ``partial``)."""
    capture: Capture
    communicator: Communicator | None
    """The NCCL communicator it issues on (one of ``COMMUNICATORS``); None: its plans hold no
    NCCL call."""
    cost_class: CostClass
    """The cost model's class of its transfers (one of ``COST_CLASSES``): ``ce`` prices them
    as one-sided copy-engine copies (a push's receiver waits on its signal), ``nccl`` as
    NCCL send/recv batches. Uncalibrated transports are priced as the nearer class."""
    calibrated: bool
    """The shipped cost model was fitted on measurements of it (``ficco predict`` covers
    only these by default)."""

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        """The registered patterns it serves."""
        return patterns_where(self.serves)

    def __post_init__(self) -> None:
        # the words as members (a record may spell them as strings)
        for name, word in (
            ("cost_class", CostClass),
            ("communicator", Communicator),
            ("all_reduce_kind", Collective),
        ):
            value = getattr(self, name)
            if value is not None and value in tuple(word):
                object.__setattr__(self, name, word(value))
        if self.cost_class not in COST_CLASSES:
            raise ValueError(
                f"cost_class: {self.cost_class!r} for {self.transport}; expected one of "
                f"{', '.join(COST_CLASSES)}"
            )
        if self.communicator is not None and self.communicator not in COMMUNICATORS:
            raise ValueError(
                f"communicator: {self.communicator!r} for {self.transport}; expected None or "
                f"one of {', '.join(COMMUNICATORS)}"
            )
        if self.alignment_bytes < 1:
            raise ValueError(f"alignment_bytes: must be >= 1, got {self.alignment_bytes}")
        if self.one_sided and self.batches_pairs:
            raise ValueError(
                f"{self.transport}: a one-sided transport has no two-sided pairs to batch"
            )


def relay_patterns(spec: PatternSpec) -> bool:
    """Patterns with ring-relay schedules (``+relay``, ``+birelay``: ``ficco.plan.relay``)."""
    return spec.relay


def every_pattern(spec: PatternSpec) -> bool:
    return True


def all_reduce_patterns(spec: PatternSpec) -> bool:
    """Patterns whose collective is an all-reduce (the kernels are whole all-reduces)."""
    return spec.all_reduce


def batched_block_patterns(spec: PatternSpec) -> bool:
    """Patterns whose steps move several row blocks at once, one per peer (the all-to-alls:
    ag_gemm / gemm_rs steps move one contiguous chunk of one peer, which ce already issues
    as one copy)."""
    return spec.batched_blocks


#: torch's symmetric-memory all-reduce kernels (``CUDASymmetricMemoryOps.cu``): fp32 and
#: bf16 only (``AT_DISPATCH_FLOAT_AND_BFLOAT16``), 4-byte vectors (``get_and_verify_alignment``)
_SYMM_KERNEL = dict(
    one_sided=False,
    copy_engine=False,
    on_sms=True,
    sm_reserve=False,
    symmetric_memory=True,
    needs_signals=False,  # the kernels synchronize the ranks through their own signal pads
    batches_pairs=False,
    batches_segments=False,
    serves=all_reduce_patterns,
    dtypes=("fp32", "bf16"),
    alignment_bytes=4,
    contiguous_only=True,
    moves_transfers=False,
    reduces=True,
    carries_flags=False,
    capture=Capture.ALWAYS,
    communicator=None,
    cost_class="ce",
    calibrated=False,
)

#: ficco's Triton all-reduce kernels (``ficco.kernels.allreduce_lamport``): any element
#: count, fp32 / bf16 / fp16, a fixed grid (no SM reserve); their scratch and flags are the
#: kernel's own symmetric workspace, not the plan's buffers (the GEMM writes ``partial``)
_LAMPORT_KERNEL = dict(
    one_sided=False,
    copy_engine=False,
    on_sms=True,
    sm_reserve=False,
    symmetric_memory=False,
    needs_signals=False,  # the kernels tell the peers themselves (epoch-valued flags)
    batches_pairs=False,
    batches_segments=False,
    serves=all_reduce_patterns,
    dtypes=("fp32", "bf16", "fp16"),
    contiguous_only=True,
    moves_transfers=False,
    reduces=True,
    carries_flags=False,
    capture=Capture.ALWAYS,
    communicator=None,
    cost_class="ce",
    calibrated=False,
)

TRAITS: dict[Transport, TransportTraits] = {
    t.transport: t
    for t in (
        TransportTraits(
            transport=Transport.CE,
            summary="copy-engine copies through symmetric memory (gathers pull, scatters push)",
            serves=every_pattern,
            one_sided=True,
            copy_engine=True,
            on_sms=False,
            sm_reserve=False,
            symmetric_memory=True,
            needs_signals=True,
            batches_pairs=False,
            batches_segments=False,
            contiguous_only=True,
            moves_transfers=True,
            reduces=True,
            carries_flags=True,
            all_reduce_kind=None,
            capture=Capture.ALWAYS,
            communicator=None,
            cost_class="ce",
            calibrated=True,
        ),
        TransportTraits(
            transport=Transport.NCCL,
            summary="NCCL kernels on SMs (grouped send/recv; serial: the collective)",
            serves=every_pattern,
            one_sided=False,
            copy_engine=False,
            on_sms=True,
            sm_reserve=True,
            symmetric_memory=False,
            needs_signals=False,
            batches_pairs=True,
            batches_segments=False,
            contiguous_only=False,
            moves_transfers=True,
            reduces=True,
            carries_flags=False,
            all_reduce_kind="all_reduce",
            # captured batch_isend_irecv replays read NaN, hung, or hit an illegal address on
            # 2xH200 (torch 2.11, NCCL 2.28): overlapped schedules are timed as issued eagerly
            capture=Capture.SERIAL,
            communicator="nccl",
            cost_class="nccl",
            calibrated=True,
        ),
        TransportTraits(
            transport=Transport.NCCL_CE,
            summary="NCCL zero-CTA collectives on copy engines (where the build has them)",
            serves=every_pattern,
            one_sided=False,
            copy_engine=True,
            on_sms=False,
            sm_reserve=False,
            symmetric_memory=False,
            needs_signals=False,
            batches_pairs=True,
            batches_segments=False,
            contiguous_only=True,
            moves_transfers=True,
            reduces=False,  # zero-CTA collectives have no reductions
            carries_flags=False,
            all_reduce_kind=None,
            capture=Capture.NEVER,  # not known to survive graph capture
            communicator="nccl_zero_cta",
            cost_class="ce",  # priced as copy-engine copies: never measured
            calibrated=False,
        ),
        TransportTraits(
            transport=Transport.SYMM1,
            summary="symmetric memory's one-shot all-reduce kernel",
            all_reduce_kind=ONE_SHOT_ALL_REDUCE,
            **_SYMM_KERNEL,
        ),
        TransportTraits(
            transport=Transport.SYMM2,
            summary="symmetric memory's two-shot all-reduce kernel",
            all_reduce_kind=TWO_SHOT_ALL_REDUCE,
            all_reduce_in_place=True,
            **_SYMM_KERNEL,
        ),
        TransportTraits(
            transport=Transport.LAMPORT1,
            summary="ficco's one-shot all-reduce kernel (Triton, epoch-valued flags)",
            all_reduce_kind=LAMPORT_ONE_SHOT,
            **_LAMPORT_KERNEL,
        ),
        TransportTraits(
            transport=Transport.LAMPORT2,
            summary="ficco's two-shot all-reduce kernel (Triton, epoch-valued flags)",
            all_reduce_kind=LAMPORT_TWO_SHOT,
            **_LAMPORT_KERNEL,
        ),
        TransportTraits(
            transport=Transport.SEG,
            summary="one segment-copy kernel (on SMs) per step over peers' symmetric buffers",
            one_sided=True,
            copy_engine=False,
            on_sms=True,
            sm_reserve=True,
            symmetric_memory=True,
            needs_signals=True,
            batches_pairs=False,
            batches_segments=True,
            serves=batched_block_patterns,
            # the kernel moves 16-byte vectors (ficco.kernels.segment_copy.ALIGN_BYTES)
            alignment_bytes=16,
            contiguous_only=False,
            moves_transfers=True,
            reduces=True,
            carries_flags=False,
            all_reduce_kind=None,
            capture=Capture.ALWAYS,
            communicator=None,
            cost_class="ce",
            calibrated=False,
        ),
        TransportTraits(
            transport=Transport.SM,
            summary="a Triton kernel on SMs stores each relay hop into the neighbour's "
            "symmetric buffer",
            one_sided=True,
            copy_engine=False,
            on_sms=True,
            sm_reserve=True,
            symmetric_memory=True,
            needs_signals=True,
            batches_pairs=False,
            batches_segments=False,
            serves=relay_patterns,
            relay_only=True,
            contiguous_only=False,
            moves_transfers=True,
            reduces=True,
            carries_flags=False,
            all_reduce_kind=None,
            capture=Capture.ALWAYS,
            communicator=None,
            cost_class="ce",  # priced as one-sided copies until measured
            calibrated=False,
        ),
    )
}


def traits(transport: Transport | str) -> TransportTraits:
    """The traits record of ``transport`` (a value or its name)."""
    try:
        return TRAITS[Transport(transport)]
    except ValueError:
        allowed = ", ".join(t.value for t in Transport)
        raise ValueError(
            f"transport: unknown value {transport!r}; expected one of {allowed}"
        ) from None


def transports_where(predicate) -> tuple[Transport, ...]:
    """The transports whose traits satisfy ``predicate``, in enum order."""
    return tuple(t for t in Transport if predicate(TRAITS[t]))


def names(transports: tuple[Transport, ...]) -> str:
    """``'ce, nccl'``: for messages."""
    return ", ".join(t.value for t in transports)


#: the note of a candidate kept eager by :func:`graph_refusal`
NCCL_ALL_TO_ALL_EAGER = (
    "eager (NCCL all-to-all not captured: its grouped ncclSend/ncclRecv hung or left rows "
    "unwritten when replayed from CUDA graphs on 2xH200, torch 2.11 / NCCL 2.28)"
)
#: set to 1: NCCL all-to-alls are captured like other NCCL plans (the rule is off)
CAPTURE_NCCL_ALL_TO_ALL_ENV = "FICCO_CAPTURE_NCCL_ALL_TO_ALL"


def graph_refusal(pattern: Pattern, schedule: Schedule) -> str | None:
    """Why ``schedule`` of ``pattern`` is issued eagerly although its transport captures (the
    note its measurement keeps), or None. Nothing of an all-to-all pattern that calls NCCL is
    captured: torch issues ``all_to_all_single`` as one group of ``ncclSend``/``ncclRecv`` per
    peer, the point-to-point calls the ``nccl`` transport already keeps out of graphs, and
    captured they hung or replayed NaN on 2xH200 (``ficco.execute.capture`` has the record).
    The same on every rank: it reads the pattern, the transport and the environment."""
    if TRAITS[schedule.transport].communicator is None:
        return None  # copy-engine and kernel transports: no NCCL call
    if spec_of(pattern).collective is not Collective.ALL_TO_ALL:
        return None
    return None if os.environ.get(CAPTURE_NCCL_ALL_TO_ALL_ENV) == "1" else NCCL_ALL_TO_ALL_EAGER


def runs_as_graph(schedule: Schedule, graphs: str = "all", pattern: Pattern | None = None) -> bool:
    """Whether the CUDA executor captures ``schedule`` into a CUDA graph and times its replays
    (the one definition: the executor and the cost model both ask here). ``graphs`` is
    ``TimingOptions.graphs``: 'all', 'ce' (only plans without NCCL calls) or 'none'. With
    ``pattern``, :func:`graph_refusal`'s rule applies too. A capture that fails at run time
    still falls back to eager issue (recorded in the measurement's ``extra['graph']``); this
    says what is attempted."""
    if graphs not in GRAPH_MODES:
        raise ValueError(f"graphs: {graphs!r}; expected one of {', '.join(GRAPH_MODES)}")
    t = TRAITS[schedule.transport]
    if graphs == "none" or t.capture is Capture.NEVER:
        return False
    if t.capture is Capture.SERIAL and schedule.overlapped:
        return False
    if pattern is not None and graph_refusal(pattern, schedule) is not None:
        return False
    # 'ce' keeps every plan with an NCCL call eager
    return graphs == "all" or t.communicator is None
