"""The Schedule value and its stable string form.

A schedule is written ``GRANULARITY/TRANSPORT/GEMM[+OPTION...]``:

``serial/nccl/cublas``            whole collective, then the whole GEMM
``shard/ce/triton``               one step per peer shard, copy-engine transfers
``finer-c4-m/ce/cublas+hi``       each shard cut into 4 row chunks, comm stream at high priority
``finer-c8-k/nccl/triton+merged+all_peers+sm16``
``finer-c4-m/symm2/cublas+hi``    gemm_ar: 4 row chunks, each all-reduced by the two-shot kernel
``finer-c2-m/seg/cublas+all_peers``  a2a: each chunk's segments from every peer in one kernel
``finer-c4-b/ce/triton``          emb_a2a: 4 batch chunks, each a sample range of every table

Options (each omitted when at its default): ``merged`` (one GEMM per shard after its chunks
arrive, instead of one per chunk), ``fused`` (one persistent Triton GEMM per rank: for
ag_gemm its tiles wait on the arrival flag of the chunk they read; for gemm_rs its epilogue
stores each tile into the owning rank's buffer and flags the chunk), ``all_peers`` (every peer's chunk in flight at once instead
of the ring rotation), ``relay`` (gemm_rs: a ring reduce-scatter, each rank adding its
partial to the block its neighbour passed on and passing it on, the next step's GEMM
running meanwhile; ag_gemm: a ring all-gather, each rank forwarding the shard it received),
``birelay`` (the same, half the chunks each way round the ring), ``epilogue`` (relay
gemm_rs: each step's GEMM accumulates onto the partial received, so no separate
reduction), ``smR`` (R SMs kept free of the Triton GEMM for SM-based
communication), ``hi`` (communication stream at high priority), ``rs_ag`` (gemm_ar only: the
all-reduce done as a reduce-scatter overlapped with the GEMM, as gemm_rs schedules it, then an
all-gather; without it each chunk is all-reduced whole, overlapping the next chunk's GEMM).

The string is the schedule's key everywhere (profiles, tables): ``Schedule.parse(str(s)) == s``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ficco.space.transports import Transport


class Granularity(enum.StrEnum):
    SERIAL = "serial"  # whole collective, then whole GEMM: "don't overlap" is always legal
    SHARD = "shard"  # one step per peer shard (PyTorch async-TP, TE ring-exchange)
    FINER = "finer"  # each shard cut again into `chunks` (FiCCO)


class Split(enum.StrEnum):
    M = "m"  # rows: contiguous chunks
    N = "n"  # output columns: strided chunks
    K = "k"  # reduction columns: strided chunks, partial sums accumulate
    B = "b"  # batch (emb_a2a): a range of samples of every table, one row run per table


class Order(enum.StrEnum):
    RING = "ring"  # one peer per step, rotated; the local shard where it needs no wait
    ALL_PEERS = "all_peers"  # every peer's chunk in flight at once
    # one hop per step to the next rank, which adds its own partial (gemm_rs) or forwards the
    # shard (ag_gemm): no rank waits on W - 1 peers at once (ficco.plan.relay)
    RELAY = "relay"
    BIRELAY = "birelay"  # relay with even chunks going to rank r + 1, odd ones to rank r - 1


class Compute(enum.StrEnum):
    PER_CHUNK = "per_chunk"  # one GEMM launch per arrived chunk
    MERGED = "merged"  # one GEMM per shard once all its chunks arrived
    FUSED = "fused"  # one persistent GEMM per rank whose tiles wait on their chunk's flag
    # relay gemm_rs: each step's GEMM accumulates onto the partial received the step before
    # (the reduction rides in the GEMM's epilogue)
    EPILOGUE = "epilogue"


class Gemm(enum.StrEnum):
    TRITON = "triton"  # ficco's persistent Triton GEMM (takes an SM budget)
    CUBLAS = "cublas"  # torch.matmul (on CPU: torch's CPU matmul stands in)


class AllReduce(enum.StrEnum):
    DIRECT = "direct"  # one all-reduce per chunk (NCCL's, or push partials + reduce locally)
    RS_AG = "rs_ag"  # reduce-scatter overlapped with the GEMM, then all-gather (gemm_ar)


class Priority(enum.StrEnum):
    NORMAL = "normal"
    HIGH = "high"


#: the orders that relay blocks round the ring (``ficco.plan.relay``)
RELAYS = (Order.RELAY, Order.BIRELAY)

#: the option strings of the non-default compute and order values (the value itself)
_COMPUTE_OPTIONS = tuple(c.value for c in Compute if c is not Compute.PER_CHUNK)
_ORDER_OPTIONS = tuple(o.value for o in Order if o is not Order.RING)


@dataclass(frozen=True, slots=True, order=True)
class Schedule:
    """One point of the schedule space. Legality for a problem is checked by ``space.rules``."""

    granularity: Granularity = Granularity.SERIAL
    chunks: int = 1
    """Chunks per shard; 1 unless granularity is finer."""
    split: Split = Split.M
    """Dimension the chunks cut; m unless granularity is finer."""
    transport: Transport = Transport.NCCL
    order: Order = Order.RING
    compute: Compute = Compute.PER_CHUNK
    gemm: Gemm = Gemm.CUBLAS
    sm_reserve: int = 0
    """SMs kept free of the Triton GEMM, for SM-based communication (0: the GEMM uses all)."""
    comm_priority: Priority = Priority.NORMAL
    all_reduce: AllReduce = AllReduce.DIRECT
    """How gemm_ar's all-reduce is built (direct for every other pattern)."""

    def __post_init__(self) -> None:
        for fname, kind in (
            ("granularity", Granularity),
            ("split", Split),
            ("transport", Transport),
            ("order", Order),
            ("compute", Compute),
            ("gemm", Gemm),
            ("comm_priority", Priority),
            ("all_reduce", AllReduce),
        ):
            value = getattr(self, fname)
            if type(value) is kind:
                continue  # already its member (the enumerator builds ~10,000 per problem)
            try:
                object.__setattr__(self, fname, kind(value))
            except ValueError:
                allowed = ", ".join(v.value for v in kind)
                raise ValueError(
                    f"{fname}: unknown value {value!r}; expected one of {allowed}"
                ) from None
        for fname in ("chunks", "sm_reserve"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{fname}: must be an integer, got {value!r}")
        if self.chunks < 1:
            raise ValueError(f"chunks: must be >= 1, got {self.chunks}")
        if self.sm_reserve < 0:
            raise ValueError(f"sm_reserve: must be >= 0, got {self.sm_reserve}")

    @property
    def overlapped(self) -> bool:
        return self.granularity is not Granularity.SERIAL

    def __str__(self) -> str:
        head = self.granularity.value
        if self.granularity is Granularity.FINER:
            head += f"-c{self.chunks}-{self.split.value}"
        text = f"{head}/{self.transport.value}/{self.gemm.value}"
        if self.compute is Compute.MERGED:
            text += "+merged"
        elif self.compute is not Compute.PER_CHUNK:
            text += f"+{self.compute.value}"
        if self.order is not Order.RING:
            text += f"+{self.order.value}"
        if self.sm_reserve:
            text += f"+sm{self.sm_reserve}"
        if self.comm_priority is Priority.HIGH:
            text += "+hi"
        if self.all_reduce is AllReduce.RS_AG:
            text += "+rs_ag"
        return text

    @property
    def complexity(self) -> int:
        """Rank used to break ties within noise toward the simpler schedule (lower is simpler)."""
        return (
            ["serial", "shard", "finer"].index(self.granularity.value) * 100
            + self.chunks
            + (self.compute is Compute.MERGED)
            + 2 * (self.compute is Compute.FUSED)
            + (self.order is not Order.RING)
            + (self.order is Order.BIRELAY)
            + (self.compute is Compute.EPILOGUE)
            + (self.sm_reserve > 0)
            + (self.comm_priority is Priority.HIGH)
            + 2 * (self.gemm is Gemm.TRITON)
            + (self.all_reduce is AllReduce.RS_AG)
        )

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Inverse of ``str``. Raises ValueError naming the part that does not parse."""
        if not isinstance(text, str):
            raise ValueError(f"schedule {text!r}: expected a string such as 'shard/ce/cublas'")
        parts = text.strip().split("+")
        core, options = parts[0], parts[1:]
        fields = core.split("/")
        if len(fields) != 3:
            raise ValueError(
                f"schedule {text!r}: expected GRANULARITY/TRANSPORT/GEMM[+OPTION...], "
                "e.g. 'finer-c4-m/ce/triton+hi'"
            )
        head, transport, gemm = fields
        kwargs: dict[str, object] = {"transport": transport, "gemm": gemm}
        match = re.fullmatch(r"finer-c([0-9]+)-([a-z]+)", head)
        if match:
            kwargs.update(granularity="finer", chunks=int(match[1]), split=match[2])
        elif head in ("serial", "shard"):
            kwargs["granularity"] = head
        else:
            raise ValueError(
                f"schedule {text!r}: granularity part {head!r} must be 'serial', 'shard' or "
                "'finer-c<chunks>-<m|n|k|b>'"
            )
        for opt in options:
            if opt in _COMPUTE_OPTIONS:
                kwargs["compute"] = Compute(opt)
            elif opt in _ORDER_OPTIONS:
                kwargs["order"] = Order(opt)
            elif opt == "hi":
                kwargs["comm_priority"] = Priority.HIGH
            elif opt == "rs_ag":
                kwargs["all_reduce"] = AllReduce.RS_AG
            elif re.fullmatch(r"sm[0-9]+", opt):
                kwargs["sm_reserve"] = int(opt[2:])
            else:
                raise ValueError(
                    f"schedule {text!r}: unknown option {opt!r}; options are "
                    f"{', '.join((*_COMPUTE_OPTIONS, *_ORDER_OPTIONS))}, smN, hi, rs_ag"
                )
        try:
            schedule = cls(**kwargs)  # type: ignore[arg-type]
        except ValueError as err:
            raise ValueError(f"schedule {text!r}: {err}") from None
        if str(schedule) != text.strip():
            raise ValueError(
                f"schedule {text!r}: not in canonical form; write it as {str(schedule)!r}"
            )
        return schedule
