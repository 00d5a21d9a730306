"""A schedule as numbers, derived from the fields of :class:`ficco.space.Schedule`.

Every field of the schedule is an axis: an enum field (granularity, split, transport, order,
compute, gemm, comm_priority, all_reduce) gives one column per member (1 for the schedule's
value, else 0), an integer field (chunks, sm_reserve) gives its value. Nothing is listed by
hand, so a new transport, option or axis value becomes a new column, never zeros; a field of
any other type is refused when this module loads. The models that read these columns are
trees, invariant to monotone transforms, so integers enter as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from functools import lru_cache

from ficco.space import Schedule


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

#: Column names: ``<field>_<member value>`` per enum member, ``<field>`` per integer field.
SCHEDULE_FEATURES: tuple[str, ...] = tuple(
    name
    for field, kind in SCHEDULE_AXES
    for name in ([f"{field}_{member.value}" for member in kind] if kind else [field])
)


def schedule_vector(schedule: Schedule) -> tuple[float, ...]:
    """``schedule`` in ``SCHEDULE_FEATURES`` order."""
    out: list[float] = []
    for field, kind in SCHEDULE_AXES:
        value = getattr(schedule, field)
        if kind is None:
            out.append(float(value))
        else:
            out.extend(float(value is member) for member in kind)
    return tuple(out)


@lru_cache(maxsize=4096)
def _features_of(name: str) -> tuple[float, ...]:
    return schedule_vector(Schedule.parse(name))


def schedule_features(name: str) -> list[float]:
    """The schedule string ``name`` in ``SCHEDULE_FEATURES`` order."""
    return list(_features_of(name))
