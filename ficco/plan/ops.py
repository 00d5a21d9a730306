"""The plan vocabulary: buffers, regions, the five task ops, tasks on two streams, the plan.

A plan names buffers, never tensors, so it is pure Python. Tasks run on two logical streams,
``compute`` and ``comm``; a task waits only on its ``deps``. Transfers move one rectangle
between ranks: gathers *pull* (the receiver initiates, so its peer's data must be ready: a
start barrier), scatters *push* (the sender initiates, after the GEMM that produced the data).
Two-sided transports (NCCL, gloo) post both halves; the ``tag`` (``ficco.plan.tags``) pairs
them. The lowerings build plans with ``ficco.plan.build``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from ficco.patterns.spec import Collective
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.words import Word


class Stream(enum.StrEnum):
    COMPUTE = "compute"
    COMM = "comm"


class Direction(Word):
    """A transfer's side on this rank: ``recv`` (remote -> local) or ``send``."""

    RECV = "recv"
    SEND = "send"


class Initiator(Word):
    """The side that moves a transfer's data on one-sided transports: the ``receiver``
    pulls, the ``sender`` pushes."""

    RECEIVER = "receiver"
    SENDER = "sender"


@dataclass(frozen=True, slots=True)
class Region:
    """``buffer[index][rows[0]:rows[1], cols[0]:cols[1]]`` (index only for 3-D buffers)."""

    buffer: str
    rows: tuple[int, int]
    cols: tuple[int, int]
    index: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True, slots=True)
class GemmOp:
    """``out (+)= a @ b``."""

    a: Region
    b: Region
    out: Region
    accumulate: bool = False


@dataclass(frozen=True, slots=True)
class TransferOp:
    """Move a rectangle between this rank and ``peer``.

    ``recv``: ``remote`` (on peer) -> ``local`` (here). ``send``: ``local`` (here) -> ``remote``.
    ``initiator`` is the side that moves the data on one-sided transports (ce).
    """

    peer: int
    direction: Direction
    local: Region
    remote: Region
    tag: int
    initiator: Initiator


@dataclass(frozen=True, slots=True)
class CollectiveOp:
    """A collective over all ranks (serial schedules on nccl transports; gemm_ar's chunked
    all-reduces)."""

    kind: Collective  # NCCL's, or symmetric memory's all-reduce kernels (gemm_ar)
    src: str
    dst: str
    # all_to_all: rows this rank sends to / receives from each rank
    send_rows: tuple[int, ...] = ()
    recv_rows: tuple[int, ...] = ()
    # all_reduce: the rectangle of src summed over ranks into the same rectangle of dst
    # (src and dst have one shape)
    rows: tuple[int, int] = (0, 0)
    cols: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Collective.parse("kind", self.kind))


@dataclass(frozen=True, slots=True)
class LocalCopyOp:
    """A copy within this rank (the local shard into a gathered buffer)."""

    src: Region
    dst: Region


@dataclass(frozen=True, slots=True)
class TransferGroupOp:
    """The transfers this rank initiates in one step, issued as one operation (the ``seg``
    transport: one segment-copy kernel over all their segments).

    ``transfers``: the acting halves only (pulls, or pushes), each keeping its peer and tag
    so a two-sided transport still pairs it with the peer's passive half, which stays a
    :class:`TransferOp` task of its own; ``copies``: this rank's local blocks moved in the
    same launch."""

    transfers: tuple[TransferOp, ...]
    copies: tuple[LocalCopyOp, ...] = ()

    def __post_init__(self) -> None:
        if not self.transfers and not self.copies:
            raise ValueError("transfer group: needs at least one transfer or local copy")
        kinds = {(t.direction, t.initiator) for t in self.transfers}
        if not kinds <= {(Direction.RECV, PULL), (Direction.SEND, PUSH)} or len(kinds) > 1:
            raise ValueError(
                "transfer group: its transfers must all be pulls (recv, receiver) or all "
                f"pushes (send, sender), got {sorted(kinds)}"
            )


@dataclass(frozen=True, slots=True)
class ReduceOp:
    """``out = sum(inputs)`` (the owner's side of a reduce-scatter)."""

    inputs: tuple[Region, ...]
    out: Region


@dataclass(frozen=True, slots=True)
class FusedCopy:
    """A further destination of a fused chunk's tiles: the same tile stored again."""

    out: Region
    out_rank: int
    """The rank whose peer-visible buffer ``out`` names."""
    signal: tuple[int, int] | None = None
    """``(rank, flag slot)`` set once every tile of the chunk is stored (None: no one waits)."""


@dataclass(frozen=True, slots=True)
class FusedChunk:
    """One row chunk of a fused GEMM: ``out = a @ b`` over these rows."""

    a: Region
    out: Region
    out_rank: int
    """The rank whose buffer ``out`` names: this rank, or (gemm_rs) the owner of the rows,
    written zero-copy into its peer-visible buffer by this rank's epilogue."""
    wait: int | None = None
    """This rank's flag slot the chunk's tiles wait on before reading ``a`` (None: ready,
    the local shard)."""
    signal: tuple[int, int] | None = None
    """``(rank, flag slot)`` set once every tile of the chunk is stored (None: no one waits)."""
    copies: tuple[FusedCopy, ...] = ()
    """Further destinations of the same tiles (gemm_ar: every peer's ``staging``): each tile
    is computed once and stored to ``out`` and to every copy, and the chunk's last tile sets
    every destination's flag."""

    @property
    def stores(self) -> tuple[FusedCopy, ...]:
        """Every destination of the chunk's tiles, ``out`` first."""
        return (FusedCopy(self.out, self.out_rank, self.signal), *self.copies)


@dataclass(frozen=True, slots=True)
class FusedGemmOp:
    """One persistent GEMM over ``chunks`` in order (the order tiles are taken in): each
    chunk's tiles wait on its ``wait`` flag, compute ``a @ b`` and store into ``out`` on
    ``out_rank`` (and into each of its ``copies``), and the chunk's last tile sets its
    ``signal`` flag (and each copy's)."""

    b: Region
    chunks: tuple[FusedChunk, ...]


@dataclass(frozen=True, slots=True)
class SignalOp:
    """Set this rank's flag ``slot`` once the tasks it depends on are complete (after a
    copy: a write ordered behind it on the same stream)."""

    slot: int


@dataclass(frozen=True, slots=True)
class WaitFlagsOp:
    """Wait until every flag in ``slots`` (this rank's) is set, by whichever rank's fused
    GEMM stores the data they guard."""

    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PoolSegment:
    """Bags ``[bags[0], bags[1])`` pooled into rows ``out.rows[0] + i`` (all D columns)."""

    bags: tuple[int, int]
    out: Region


@dataclass(frozen=True, slots=True)
class PoolChunk:
    """Segments stored into buffers of ``out_rank`` (this rank's, or zero-copy into a peer's
    peer-visible buffer); once every segment is stored, flag ``signal = (rank, slot)`` is set
    (None: no one waits)."""

    segments: tuple[PoolSegment, ...]
    out_rank: int
    signal: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PoolOp:
    """Embedding-bag pooling (emb_a2a). Bag ``j`` is ``weights`` rows
    ``indices[offsets[j]:offsets[j+1]]`` (int64 ``index`` buffers; an index is a row of the
    stacked ``weights [rows, D]``). For each chunk in order and each of its segments, bag
    ``bags[0] + i`` pooled -- the sum of its rows, divided by its size for ``mean`` (an empty
    bag pools to zeros), accumulated in fp32 and stored once in the buffer's dtype -- lands in
    row ``out.rows[0] + i`` of ``out`` on ``out_rank``; then the chunk's ``signal`` flag is
    set. A ``+fused`` plan holds one such task whose peer chunks store into the destination's
    receive buffer and flag it; the other plans' chunks stay on this rank, without flags."""

    weights: str
    indices: str
    offsets: str
    mode: str  # "sum" | "mean"
    chunks: tuple[PoolChunk, ...]


def _repr_set_fields(obj, later: tuple[str, ...]) -> str:
    """``obj``'s dataclass repr less the fields of ``later`` left at None: fields added
    after plans were first recorded are written only where a plan sets them, so every other
    plan prints (and its golden digest, ``tests/test_plan_golden.py``, reads) as before."""
    shown = (
        f"{f.name}={getattr(obj, f.name)!r}"
        for f in dataclasses.fields(obj)
        if not (f.name in later and getattr(obj, f.name) is None)
    )
    return f"{type(obj).__qualname__}({', '.join(shown)})"


@dataclass(frozen=True, slots=True, repr=False)
class NormOp:
    """gemm_ar's add_rms_norm epilogue over whole rows (``ficco.patterns.epilogues``):
    ``new_residual = summed + residual`` rounded, ``normed = rms_norm(new_residual, eps) *
    weight`` (``weight``: a ``[1, N]`` region). ``all_reduce`` None: ``summed`` holds the
    all-reduced sum already; a kind: ``summed`` is this rank's partial, all-reduced by that
    kind's kernel in the same launch (lamport1's fused epilogue: the sum is never stored)."""

    summed: Region
    residual: Region
    weight: Region
    normed: Region
    new_residual: Region
    eps: float
    all_reduce: Collective | None = None
    scale: Region | None = None
    """A ``[1, 1]`` fp32 region: ``normed`` is FP8 e4m3, ``normed / scale`` saturated at
    e4m3's largest (the add_rms_norm_fp8 epilogue); None: ``normed`` in the sum's dtype."""

    def __repr__(self) -> str:
        return _repr_set_fields(self, ("scale",))


Op = (
    GemmOp
    | TransferOp
    | TransferGroupOp
    | CollectiveOp
    | LocalCopyOp
    | ReduceOp
    | FusedGemmOp
    | SignalOp
    | WaitFlagsOp
    | PoolOp
    | NormOp
)

#: ops that run GEMM work, or a pattern's compute in its place (the ``gemm`` side of the
#: interpreter's modes)
GEMM_OPS = (GemmOp, FusedGemmOp, PoolOp)


def flag_slot(source: int, chunk: int, chunks: int) -> int:
    """The flag slot of ``(source rank, chunk)`` on the rank that waits for it."""
    return source * chunks + chunk


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    op: Op
    stream: Stream
    deps: tuple[int, ...] = ()
    chunk: tuple[int, int] | None = None
    """(peer shard, chunk index) the task belongs to, for per-chunk signatures."""


@dataclass(frozen=True, slots=True, repr=False)
class BufferSpec:
    name: str
    shape: tuple[int, ...]
    role: str  # "input" | "replicated" | "constant" | "index" | "workspace" | "output"
    """``input``: random values of this rank's; ``replicated``: random values alike on every
    rank (gemm_ar's residual and norm weight: tensor-parallel decode replicates them);
    ``constant``: values the problem defines, alike on every rank and seed (gemm_ar's FP8
    norm scale; its pattern module's ``constant_inputs``); ``index``: an int64 input the
    problem defines; ``workspace``, ``output``: written."""
    peer_visible: bool = False
    """Other ranks read or write it directly (symmetric memory on the ce transport)."""
    dtype: str | None = None
    """Its element type (a ``ficco.dtypes`` name) where it is not the problem's (None):
    gemm_ar's add_rms_norm_fp8 epilogue writes ``normed`` in fp8_e4m3 beside an fp32 scale."""
    scale: str | None = None
    """The ``[1, 1]`` fp32 buffer holding its per-tensor scale: an FP8 buffer stands for its
    values times that scale (verification dequantizes it so)."""

    def __repr__(self) -> str:
        return _repr_set_fields(self, ("dtype", "scale"))

    @property
    def is_input(self) -> bool:
        """Given, never written (random values: this rank's own, or every rank's alike; or
        the problem's constants)."""
        return self.role in ("input", "replicated", "constant")


@dataclass(frozen=True)
class Plan:
    problem: Problem
    schedule: Schedule
    rank: int
    buffers: tuple[BufferSpec, ...]
    tasks: tuple[Task, ...]
    output: str | tuple[str, ...]
    """The output buffer; or the buffers of an output's parts, where their dtypes differ
    (gemm_ar's add_rms_norm_fp8 epilogue: ``normed`` in FP8, ``new_residual``), each
    verified on its own."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """The output's buffers, one or several."""
        return (self.output,) if isinstance(self.output, str) else self.output

    def buffer(self, name: str) -> BufferSpec:
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def transfers(self) -> list[TransferOp]:
        """Every transfer, a group's members included (in task order)."""
        out: list[TransferOp] = []
        for t in self.tasks:
            if isinstance(t.op, TransferOp):
                out.append(t.op)
            elif isinstance(t.op, TransferGroupOp):
                out.extend(t.op.transfers)
        return out

    def gemms(self) -> list[GemmOp]:
        """The plan's separate GEMM launches (a fused GEMM is not one of them)."""
        return [t.op for t in self.tasks if isinstance(t.op, GemmOp)]

    def fused(self) -> FusedGemmOp | None:
        """The plan's fused GEMM, if it has one."""
        return next((t.op for t in self.tasks if isinstance(t.op, FusedGemmOp)), None)

    @property
    def flag_slots(self) -> int:
        """Flag slots this rank's plan uses (waits, signals and waited-for slots), 0 if none."""
        used = [0]
        for t in self.tasks:
            if isinstance(t.op, SignalOp):
                used.append(t.op.slot + 1)
            elif isinstance(t.op, WaitFlagsOp):
                used.extend(s + 1 for s in t.op.slots)
            elif isinstance(t.op, FusedGemmOp):
                for c in t.op.chunks:
                    used.append(0 if c.wait is None else c.wait + 1)
                    used.extend(0 if d.signal is None else d.signal[1] + 1 for d in c.stores)
            elif isinstance(t.op, PoolOp):
                used.extend(0 if c.signal is None else c.signal[1] + 1 for c in t.op.chunks)
        return max(used)


#: who moves the data of a transfer on one-sided transports: gathers pull, scatters push
PULL, PUSH = Initiator.RECEIVER, Initiator.SENDER
