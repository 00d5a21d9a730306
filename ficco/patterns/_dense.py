"""Parts shared by the dense patterns (ag_gemm, gemm_rs, gemm_ar): every rank holds whole
rows of A (or of its shard) and the collective moves whole [rows, K] or [rows, N] blocks.

:func:`spec` builds a dense pattern's spec from the parts that pattern gives over
:data:`DEFAULTS` (ag_gemm's and gemm_rs's values), so each module shows what differs."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ficco.patterns import spec_of
from ficco.patterns.spec import BASELINE_COMM, ModelSupport, PatternSpec, Sizes
from ficco.space.schedule import RELAYS, Compute, Granularity

if TYPE_CHECKING:
    from ficco.problem import Problem
    from ficco.space.schedule import Schedule


def gemm_flops(p: Problem) -> int:
    """One [M, N, K] GEMM (ag_gemm: the gathered A; the all-to-alls: all routed tokens)."""
    return 2 * p.m * p.n * p.k


def every_rank_gemm_flops(p: Problem) -> int:
    """W GEMMs of [M, N, K], one per rank's slice of K (gemm_rs, gemm_ar)."""
    return 2 * p.m * p.n * p.k * p.world


def shard_rows(p: Problem, schedule: Schedule | None = None) -> int:
    return p.m_shard


def whole_m(p: Problem) -> int:
    return p.m


def never(schedule: Schedule | None = None) -> bool:
    return False


def once(schedule: Schedule | None = None) -> int:
    return 1


def no_roundings(p: Problem) -> int:
    return 0


def reduced_roundings(p: Problem) -> int:
    """A reduction of W partials in the working dtype: W - 1 roundings."""
    return p.world - 1


def ring_comm_bytes(p: Problem) -> int:
    """W - 1 peer shards of M/W whole rows of the matrix the pattern's collective moves."""
    return (p.world - 1) * p.m_shard * spec_of(p.pattern).moved_row_bytes(p)


def sharded_sizes(p: Problem) -> Sizes:
    """ag_gemm and gemm_rs: the whole M computed, a shard of M/W rows per peer."""
    shard_bytes = p.m_shard * spec_of(p.pattern).moved_row_bytes(p)
    return Sizes(p.m, p.k * p.n, p.comm_bytes_per_rank(), shard_bytes, 0)


def plan_key(p: Problem, s: Schedule) -> tuple:
    """The dense patterns' overlapped plans do not depend on the transport (every transport
    runs the same transfers; only a serial schedule picks NCCL's collective or a ring of
    transfers by it), and their visit order matters only where there is more than one peer
    and more than one chunk; a fused plan's flags depend on both."""
    if s.compute is Compute.FUSED:
        return (s.transport, s.order)
    if s.order in RELAYS:  # relay hops are pushes on every transport that moves them
        return (None, s.order)
    transport = s.transport if s.granularity is Granularity.SERIAL else None
    one_order = s.granularity is not Granularity.FINER or p.world == 2
    return (transport, None if one_order else s.order)


def summed_partials(parts) -> tuple:
    """A reduction's reference from every rank's ``(a, b)``: ``(exact float64, plain)``, the
    plain sum of working-dtype partials taken in fp32 and rounded once."""
    exact = sum(a.double() @ b.double() for a, b in parts)
    plain = sum((a @ b).float() for a, b in parts).to(parts[0][0].dtype)
    return exact, plain


#: the parts a dense pattern has unless its spec gives them: each rank holds (or ends with)
#: M/W rows, moved as one shard per peer and step, in one pass; a fused schedule; no problem
#: fields of its own; measured and calibrated (ag_gemm's and gemm_rs's values)
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    dict(
        routed=False,
        rows_per_rank=True,
        fused=True,
        batched_blocks=False,
        relay=False,
        work_is_gather=False,
        in_selector=True,
        cost_model=ModelSupport.CALIBRATED,
        comm_alone=(BASELINE_COMM,),
        comm_bytes=ring_comm_bytes,
        shard_rows=shard_rows,
        serial_gemm_rows=whole_m,
        one_step=never,
        transfer_passes=once,
        plan_key=plan_key,
        sizes=sharded_sizes,
        scaled_inputs=True,
        problem_fields=(),
    )
)


def spec(**parts: Any) -> PatternSpec:
    """A dense pattern's spec: ``parts`` (the pattern's own), :data:`DEFAULTS` for the rest."""
    return PatternSpec(**(DEFAULTS | parts))
