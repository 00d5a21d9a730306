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


def _members(kind: type[enum.Enum]) -> tuple[enum.Enum, ...]:
    """The members of an enum axis that get a column: every one, except splits that no
        pattern the selector covers takes (emb_a2a's batch split ``b``), and transports without a
        ``selector_column`` (gemm_ar's kernels added after the shipped models) and the order and compute
    values no store has measured (``ficco.space.schedule.UNMEASURED_BY_SELECTOR``: the relays). Those lie outside the
        selector's domain, as the patterns without ``in_selector`` do, and a column of zeros over
        every training problem would only shift the forests' random feature draws."""
    from ficco.patterns import spec_of
    from ficco.select.features import FEATURE_PATTERNS
    from ficco.space import Split, Transport
    from ficco.space.schedule import UNMEASURED_BY_SELECTOR

    if kind is Transport:
        return tuple(t for t in Transport if t.traits.selector_column)
    if kind is not Split:
        return tuple(m for m in kind if m not in UNMEASURED_BY_SELECTOR)
    taken = {split for p in FEATURE_PATTERNS for split in spec_of(p).splits}
    return tuple(m for m in kind if m in taken)


#: Per enum field, its members with a column (:func:`_members`).
AXIS_MEMBERS: dict[str, tuple[enum.Enum, ...]] = {
    field: _members(kind) for field, kind in SCHEDULE_AXES if kind is not None
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
            raise ValueError(
                f"{field}: {value.value!r} is taken by no pattern the selector covers "
                f"(its columns: {', '.join(m.value for m in members)})"
            )
        out.extend(float(value is member) for member in members)
    return tuple(out)


@lru_cache(maxsize=4096)
def _features_of(name: str) -> tuple[float, ...]:
    return schedule_vector(Schedule.parse(name))


def schedule_features(name: str) -> list[float]:
    """The schedule string ``name`` in ``SCHEDULE_FEATURES`` order."""
    return list(_features_of(name))
