"""A schedule as numbers, derived from the fields of :class:`ficco.space.Schedule`.

Every field of the schedule is an axis: an enum field (granularity, split, transport, order,
compute, gemm, comm_priority, all_reduce) gives one column per member (1 for the schedule's
value, else 0), an integer field (chunks, sm_reserve) gives its value. Nothing is listed by
hand but the axis values measured (:data:`MEASURED`), so a new axis is new columns and a new
value of an axis is refused by name until measured, never zeros; a field of any other type
is refused when this module loads. The models that read these columns are
trees, invariant to monotone transforms, so integers enter as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from functools import lru_cache

from ficco.space import (
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


def _axes() -> tuple[tuple[str, type[enum.Enum] | None], ...]:
    """``(field, enum type or None for an integer)`` per field of ``Schedule``, in order."""
    hints = typing.get_type_hints(Schedule)
    out: list[tuple[str, type[enum.Enum] | None]] = []
    for f in dataclasses.fields(Schedule):
        kind = hints[f.name]
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            out.append((f.name, kind))
        elif kind is int:
            out.append((f.name, None))
        else:
            raise TypeError(
                f"Schedule.{f.name}: type {kind!r} has no numeric encoding; the selector "
                "encodes enum fields (one column per member) and integer fields (the value)"
            )
    return tuple(out)


#: The schedule's axes: ``(field, enum type)``, or ``(field, None)`` for an integer field.
SCHEDULE_AXES: tuple[tuple[str, type[enum.Enum] | None], ...] = _axes()


#: The axis values the profile stores behind the shipped tables measured: only these get a
#: column. A value added since (the lamport all-reduce kernels, the relay orders with their sm
#: transport and epilogue compute) or never measured for the selector (emb_a2a's batch split:
#: its pattern is not ``in_selector``) lies outside the selector's domain, as the patterns
#: without ``in_selector`` do, and is refused by name, never encoded as zeros: a column of
#: zeros over every training problem would only shift the forests' random feature draws. A
#: new value of any axis starts outside; a store that measures it adds it here, and the
#: shipped tables are retrained with its column.
MEASURED: frozenset[enum.Enum] = frozenset(
    {
        *(Granularity.SERIAL, Granularity.SHARD, Granularity.FINER),
        *(Split.M, Split.N, Split.K),
        *(Transport.CE, Transport.NCCL, Transport.NCCL_CE, Transport.SYMM1, Transport.SYMM2),
        Transport.SEG,
        *(Order.RING, Order.ALL_PEERS),
        *(Compute.PER_CHUNK, Compute.MERGED, Compute.FUSED),
        *(Gemm.TRITON, Gemm.CUBLAS),
        *(Priority.NORMAL, Priority.HIGH),
        *(AllReduce.DIRECT, AllReduce.RS_AG),
    }
)


#: Per enum field, its members with a column: the measured ones, in the enum's order.
AXIS_MEMBERS: dict[str, tuple[enum.Enum, ...]] = {
    field: tuple(m for m in kind if m in MEASURED)
    for field, kind in SCHEDULE_AXES
    if kind is not None
}

#: Column names: ``<field>_<member value>`` per enum member, ``<field>`` per integer field.
SCHEDULE_FEATURES: tuple[str, ...] = tuple(
    name
    for field, kind in SCHEDULE_AXES
    for name in ([f"{field}_{m.value}" for m in AXIS_MEMBERS[field]] if kind else [field])
)


def schedule_vector(schedule: Schedule) -> tuple[float, ...]:
    """``schedule`` in ``SCHEDULE_FEATURES`` order; a member outside the selector's domain
    is refused (never a row of zeros)."""
    out: list[float] = []
    for field, kind in SCHEDULE_AXES:
        value = getattr(schedule, field)
        if kind is None:
            out.append(float(value))
            continue
        members = AXIS_MEMBERS[field]
        if value not in members:
            columns = ", ".join(m.value for m in members)
            raise ValueError(
                f"{field}: {value.value!r} lies outside the selector's domain: no profile "
                f"store behind its tables measured it (its columns: {columns})"
            )
        out.extend(float(value is member) for member in members)
    return tuple(out)


@lru_cache(maxsize=4096)
def _features_of(name: str) -> tuple[float, ...]:
    return schedule_vector(Schedule.parse(name))


def schedule_features(name: str) -> list[float]:
    """The schedule string ``name`` in ``SCHEDULE_FEATURES`` order."""
    return list(_features_of(name))
