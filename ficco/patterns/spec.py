"""The pattern spec: everything ficco knows about one GEMM + collective pattern, in one value.

A spec holds plain data and pure functions (problem sizes, geometry, legality facts, the
plan-key fields its plans depend on), torch-using functions that import torch inside
themselves (references, CUDA baselines), and :class:`Ref` names of parts that live in higher
layers (its lowering and buffers in ``ficco.plan``), resolved on first use, so reading a spec
never imports torch, Triton or the planner.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeAlias

from ficco.words import Word

# The types a spec's callables take are named here, not imported: ``ficco.problem`` and
# ``ficco.space`` read this registry, so importing them (even for a type checker) closes a
# circle (tests/test_imports_acyclic.py).
Pattern: TypeAlias = enum.StrEnum  # ficco.patterns.Pattern
Problem: TypeAlias = Any  # ficco.problem.Problem
Schedule: TypeAlias = Any  # ficco.space.Schedule
Split: TypeAlias = enum.StrEnum  # ficco.space.Split


class Collective(Word):
    """A collective over all ranks: the one a pattern pairs with its GEMM, and what one
    ``ficco.plan.CollectiveOp`` runs (NCCL's calls, or torch's symmetric-memory all-reduce
    kernels of symm1 / symm2). Values are spelled as NCCL's calls (and as the cost model's ring
    parameters); :attr:`label` as people write them."""

    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
    ONE_SHOT_ALL_REDUCE = "one_shot_all_reduce"
    TWO_SHOT_ALL_REDUCE = "two_shot_all_reduce"
    LAMPORT_ONE_SHOT_ALL_REDUCE = "lamport_one_shot_all_reduce"
    LAMPORT_TWO_SHOT_ALL_REDUCE = "lamport_two_shot_all_reduce"

    @property
    def label(self) -> str:
        """As people write it: 'all-gather'."""
        return self.value.replace("_", "-")

    @property
    def reduces(self) -> bool:
        """Sums partials from every rank (copy engines cannot; each adds W - 1 roundings)."""
        return (
            self in (Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)
            or self.symmetric_memory
            or self.lamport
        )

    @property
    def symmetric_memory(self) -> bool:
        """One of torch's symmetric-memory all-reduce kernels (no NCCL call)."""
        return self in (Collective.ONE_SHOT_ALL_REDUCE, Collective.TWO_SHOT_ALL_REDUCE)

    @property
    def lamport(self) -> bool:
        """One of ficco's Triton all-reduce kernels with value-encoded flags (lamport1 /
        lamport2: ``ficco.kernels.allreduce_lamport``; no NCCL call)."""
        return self in (
            Collective.LAMPORT_ONE_SHOT_ALL_REDUCE,
            Collective.LAMPORT_TWO_SHOT_ALL_REDUCE,
        )

    @property
    def fuses_add_rms_norm(self) -> bool:
        """Its kernel takes gemm_ar's add_rms_norm epilogue in the same launch (ficco's
        lamport kernels: ``ficco.patterns.epilogues``)."""
        return self.lamport


class ModelSupport(enum.StrEnum):
    """How the cost model (``ficco.model``) knows the pattern's ops."""

    CALIBRATED = "calibrated"  # its ops were measured and fitted
    # its ops are the calibrated patterns' ops (copies, NCCL, GEMMs), and pooling priced by
    # the machine description's gather bandwidth (``ficco.model.gather``)
    REUSED = "reused"
    NONE = "none"  # not modelled: predictions refuse it


#: the baseline timing the undecomposed GEMM alone (``t_gemm``), measured for every pattern
BASELINE_GEMM = "gemm_alone"
#: the baseline timing the serial schedule's collective alone (NCCL's: ``t_comm``)
BASELINE_COMM = "comm_alone"
#: the baseline of the serial NCCL collective then cuBLAS, issued the plain eager way
BASELINE_SERIAL_EAGER = "serial_eager"
#: the baseline of PyTorch's async-TP (``torch.ops.symm_mem`` fused_all_gather_matmul /
#: fused_matmul_reduce_scatter), where the pattern has one
BASELINE_ASYNC_TP = "async_tp"

#: ``PatternSpec.cuda_baselines`` value: the CUDA baselines are the serial plan run whole
#: (``serial_eager``) and its collective and GEMM parts alone (``ficco.execute.baselines``)
SERIAL_PLAN_PARTS = "serial plan parts"


def eager_baselines(
    gemm_alone: Callable[[], None],
    comm_alone: Callable[[], None],
    serial_eager: Callable[[], None],
    out,
) -> dict[str, Callable[[], None]]:
    """The baselines a ``cuda_baselines`` function builds, by name: the GEMM alone, the
    collective alone, and both in the serial order, whose result ``out`` is verified."""
    serial_eager.out = out
    return {
        BASELINE_GEMM: gemm_alone,
        BASELINE_COMM: comm_alone,
        BASELINE_SERIAL_EAGER: serial_eager,
    }


class Sizes(NamedTuple):
    """One rank's sizes, the selector's features and the lookup twin are built on."""

    rows: int
    """GEMM rows one rank computes (the all-to-alls: the most tokens any rank receives)."""
    weights: int
    """Weight elements one rank's GEMM reads."""
    comm_bytes: int
    """Bytes the busiest rank receives."""
    shard_bytes: int
    """Bytes of one peer's shard (the all-to-alls: the largest rank-to-rank block)."""
    experts: int
    """Total experts (0 without experts)."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A part named by ``"module:attribute"``, imported on first :meth:`load`: how a spec
    names code of a higher layer without importing it."""

    target: str

    def load(self) -> Any:
        module, _, name = self.target.partition(":")
        if not module or not name:
            raise ValueError(f"ref: {self.target!r} must be 'module:attribute'")
        return getattr(importlib.import_module(module), name)


def json_value(value: Any) -> Any:
    """A field's value as ``Problem.to_dict`` writes it: tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


def python_value(value: Any) -> Any:
    """A field's value as ``Problem.from_dict`` reads it back: lists as tuples."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, kw_only=True, slots=True)
class ProblemField:
    """A problem field of one pattern's own (not every pattern's, like ``m`` or ``dtype``),
    declared in its spec's ``problem_fields``: ``Problem`` takes it as a keyword, exposes it
    as an attribute, checks it and writes it into its key and dict; the CLI's problem options
    and ``api.make_problem`` take it; patterns that do not declare it refuse it."""

    name: str
    """The ``Problem`` attribute and ``make_problem`` keyword; the option is ``--name``
    (``_`` as ``-``)."""
    help: str
    """Its option's help, one phrase without a final period (the CLI puts the patterns that
    take it before it, and its default after it)."""
    parse: Callable[[Any], Any]
    """Command-line text or an API value -> the value ``Problem`` checks (InputError
    naming the field where it cannot); never passed None."""
    check: Callable[[Problem, Any], Any]
    """``(problem, value) -> canonical value``, or InputError naming the field, the value and
    the rule. ``value`` is the one given, else ``default``; checks run in declaration order
    on a problem whose earlier fields are canonical already, so one may read those."""
    key: Callable[[Any], str]
    """Its part of ``Problem.key`` (parts are joined by ``:``), from the canonical value."""
    default: Any
    """The value a problem that omits it is checked with (None: required)."""
    metavar: str = "TEXT"
    """Its option's metavar (where ``choices`` are given: they are)."""
    choices: tuple[str, ...] = ()
    """Its values, where they are a closed set: the option's metavar and the shapes CSV's
    help name them (``check`` refuses the others, naming them too)."""
    to_json: Callable[[Any], Any] = json_value
    """Its value in ``Problem.to_dict``."""
    from_json: Callable[[Any], Any] = python_value
    """``to_json``'s inverse, read by ``Problem.from_dict``."""
    implicit_default: bool = False
    """A problem at ``default`` writes nothing of it (no key part, no dict entry): a field
    added to a pattern after its problems were measured leaves their keys and records as
    they were."""
    csv_column: bool = False
    """A shapes CSV (``ficco.workloads.read_shapes_csv``) may carry it as a column of its
    name: one cell of command-line text, an empty cell its default."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PatternSpec:
    """One pattern's parts. Every field is required: :func:`ficco.patterns.missing_parts`
    names any left None, and registration refuses such a spec."""

    pattern: Pattern
    collective: Collective
    """The collective around the GEMM."""
    routed: bool
    """Tokens routed to experts: the problem takes ``experts``, ``routing`` and ``top_k``."""
    rows_per_rank: bool
    """Every rank holds (or ends with) M/W rows, so M must divide by W."""
    splits: tuple[Split, ...]
    """Dimensions a finer schedule may cut (those that cut the collective's matrix)."""
    fused: bool
    """Has a ``+fused`` schedule (one persistent GEMM on per-chunk flags)."""
    batched_blocks: bool
    """Each step moves several row blocks (one per peer): the ``seg`` transport applies."""
    relay: bool
    """Has ring-relay schedules (``+relay``, ``+birelay``: one hop per step, ``ficco.plan.relay``)
    and the ``sm`` transport that moves their hops."""
    in_selector: bool
    """Measured profiles exist: the selector's features and the tables have its column."""
    cost_model: ModelSupport
    comm_alone: tuple[str, ...]
    """Baselines timing the whole collective alone; the ideal takes the fastest of those
    measured (``ficco.patterns.ideal``). The first is the serial schedule's collective."""

    flops: Callable[[Problem], int]
    """Multiply-adds x 2 of the whole GEMM, all ranks."""
    comm_bytes: Callable[[Problem], int]
    """Bytes the busiest rank receives."""
    moved_dim: str
    """The problem's dimension (``"k"`` or ``"n"``) that is the width of the rows the
    collective moves: K of A (gathered or dispatched), N of C (reduced or combined)."""
    shard_rows: Callable[[Problem, Schedule | None], int]
    """Rows of one shard (the all-to-alls: the largest block) a step moves; schedule
    ``None``: the pattern's default reading (gemm_ar: its direct all-reduce)."""
    serial_gemm_rows: Callable[[Problem], int]
    """Rows of the serial schedule's one GEMM."""
    one_step: Callable[[Schedule | None], bool]
    """Every chunk goes to all peers at once: one step, no peer shards (gemm_ar's direct
    all-reduce; ``None``: the pattern's default reading)."""
    transfer_passes: Callable[[Schedule], int]
    """How many times each chunk crosses the links (2: reduce-scattered, then all-gathered)."""
    plan_key: Callable[[Problem, Schedule], tuple]
    """The transport and order fields its plans depend on (see ``ficco.plan.plan_key``)."""
    extra_roundings: Callable[[Problem], int]
    """Roundings a correct schedule adds to the plain computation (reductions of partials)."""
    sizes: Callable[[Problem], Sizes]
    """Sizes of one rank (the selector's features)."""
    lookup_sizes: str
    """Key of the stdlib twin of ``sizes`` in ``ficco.export.lookup_features.SIZES``."""
    reference: Callable[..., tuple]
    """``(problem, rank, inputs(rank, name)) -> (exact float64, plain)``: this rank's output
    from every rank's inputs, without communication (imports torch inside)."""
    reference_by_collectives: Callable[..., tuple]
    """``(problem, tensors, device) -> (exact fp32, plain)`` through the serial collective."""
    cuda_baselines: Callable[..., dict] | str
    """``(problem, tensors, device, group_name) -> {name: callable}``, or
    :data:`SERIAL_PLAN_PARTS`."""
    lowering: Ref
    """``(problem, schedule, rank) -> Plan``."""
    buffers: Ref
    """``(problem, rank) -> tuple[BufferSpec, ...]``: what every schedule's plan allocates."""
    scaled_inputs: bool
    """Takes scaled (fp8) inputs (``ficco.dtypes``): its plans run and verify with quantized
    A and B, A's row scales moving with its rows, and bf16 outputs (False: problems of it
    refuse fp8 dtypes)."""
    problem_fields: tuple[ProblemField, ...]
    """The problem fields of its own, in order (``()``: only the common ones); see
    :class:`ProblemField`."""
    work_is_gather: bool
    """Its ``flops`` are a gather's additions (one per element read through HBM, emb_a2a's
    pooling), not tensor-core multiply-adds: the physical floor (``ficco.measure.floor``)
    prices them at the HBM's bandwidth, not the card's peak."""

    @property
    def all_reduce(self) -> bool:
        return self.collective is Collective.ALL_REDUCE

    def moved_cols(self, problem: Problem) -> int:
        """Columns of the rows the collective moves (``moved_dim`` of ``problem``)."""
        return getattr(problem, self.moved_dim)

    def moved_dtype(self, problem: Problem) -> str:
        """The dtype of the matrix the collective moves: the input's where it moves A (K
        wide), the output's where it moves C (N wide: bf16 partials for fp8)."""
        return problem.dtype if self.moved_dim == "k" else problem.output_dtype

    def moved_bytes(self, problem: Problem, rows: int, cols: int) -> int:
        """Bytes of a ``rows x cols`` block of the matrix the collective moves: its elements
        in the moved dtype, and, where rows of A move with row-wise scales, each row's scale
        (whatever columns the block has)."""
        if self.moved_dim == "k":
            return rows * (cols * problem.dtype_bytes + problem.row_scale_bytes)
        return rows * cols * problem.output_bytes

    def moved_row_bytes(self, problem: Problem) -> int:
        """Bytes one whole moved row carries."""
        return self.moved_bytes(problem, 1, self.moved_cols(problem))


#: parts a spec may leave empty (still required: an empty tuple says "none", not "forgotten")
MAY_BE_EMPTY = ("problem_fields",)


def spec_parts() -> tuple[str, ...]:
    """The names of a spec's parts (every field)."""
    return tuple(f.name for f in fields(PatternSpec))
