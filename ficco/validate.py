"""Input checks shared by every public entry point (pure Python, no ficco imports).

Each check returns the value in its one accepted type or raises :class:`InputError` naming the
field, the value and the rule. Nothing is rounded, clamped or replaced: ``12.9`` is not an
integer, ``0`` rounds are not "the default", ``True`` is not the count 1.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable


class InputError(ValueError):
    """A value given to ficco breaks a rule. ``field`` names the parameter (the command-line
    option of the same name, with dashes); ``str(err)`` is ``"field: rule, got value"``, or
    ``"field: rule"`` where the rule already names the value (or no value was given)."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        shown = "" if value is None or names_value(rule, value) else f", got {value!r}"
        super().__init__(f"{field}: {rule}{shown}")


def names_value(text: str, value: object) -> bool:
    """Whether ``text`` already shows ``value``: its repr anywhere, or a string of 4 or more
    characters standing alone (not inside a longer name: 'llama3' is not in 'llama3-8b')."""
    if not isinstance(value, str):
        return not isinstance(value, numbers.Number) and repr(value) in text
    if repr(value) in text:
        return True
    word = value.strip()
    if len(word) < 4:
        return False
    return re.search(rf"(?<![\w.\-/+]){re.escape(word)}(?![\w\-/+]|\.\w)", text) is not None


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def integer(
    field: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    rule: str | None = None,
    text: bool = True,
) -> int:
    """``value`` as an int: an int (not a bool) or, with ``text``, a string of decimal digits
    ("64": what a command line or a CSV cell holds).

    Floats are refused even when integral (64.0), as are "12.9", "1e3" and True. Without
    ``text`` a string is refused too: where values arrive typed (Python, JSON), ``"3"`` is a
    string where a count belongs, not a count. ``rule`` replaces the default wording of a
    bound's refusal."""
    if isinstance(value, bool):
        raise InputError(field, value, "must be an integer, not a boolean")
    if not text and isinstance(value, str | bytes):
        raise InputError(field, value, "must be an integer, not a string")
    if isinstance(value, numbers.Integral):
        number = int(value)
    elif isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise InputError(field, value, "must be an integer")
    if minimum is not None and number < minimum:
        raise InputError(field, value, rule or f"must be an integer >= {minimum}")
    if maximum is not None and number > maximum:
        raise InputError(field, value, rule or f"must be an integer <= {maximum}")
    return number


def count(field: str, value: object, *, rule: str | None = None) -> int:
    """A count: an integer >= 1."""
    return integer(field, value, minimum=1, rule=rule)


def rounds(field: str, value: object) -> int | str:
    """Timing rounds: a count >= 1, or ``"auto"`` (rounds until each median is known to a
    stated precision; ``ficco.execute.TimingOptions``)."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    return integer(field, value, minimum=1, rule="needs at least 1 round, or 'auto'")


def optional_count(field: str, value: object) -> int | None:
    return None if value is None else count(field, value)


def counts(field: str, values: Iterable[object], *, minimum: int = 1) -> tuple[int, ...]:
    """Each of ``values`` an integer >= ``minimum`` (the field named with the value's index)."""
    if isinstance(values, str | bytes):
        raise InputError(field, values, "must be a sequence of integers")
    return tuple(
        integer(f"{field}[{i}]" if field else str(i), v, minimum=minimum)
        for i, v in enumerate(values)
    )


def number(
    field: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` as a finite float: an int, a float or a decimal string (not a bool, not NaN)."""
    if isinstance(value, bool):
        raise InputError(field, value, "must be a number, not a boolean")
    if isinstance(value, numbers.Real):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise InputError(field, value, "must be a number") from None
    else:
        raise InputError(field, value, "must be a number")
    if not math.isfinite(result):
        raise InputError(field, value, "must be a finite number")
    if above is not None and result <= above:
        raise InputError(field, value, f"must be > {above:g}")
    if at_least is not None and result < at_least:
        raise InputError(field, value, f"must be >= {at_least:g}")
    if at_most is not None and result > at_most:
        raise InputError(field, value, f"must be <= {at_most:g}")
    return result


def seconds(field: str, value: object) -> float:
    """A duration in seconds: a number > 0 (0 is not "no limit" and not "the default")."""
    return number(field, value, above=0)


def choice(field: str, value: object, allowed: Iterable[str]) -> str:
    """One of ``allowed`` (exact string match)."""
    names = tuple(allowed)
    if not isinstance(value, str) or value not in names:
        raise InputError(field, value, f"must be one of {', '.join(names)}")
    return value


def choices(field: str, values: Iterable[object], allowed: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    names = tuple(allowed)
    return tuple(choice(field, v, names) for v in values)


def flag(field: str, value: object) -> bool:
    """A bool (not 0/1, not "yes")."""
    if not isinstance(value, bool):
        raise InputError(field, value, "must be True or False")
    return value


def text(field: str, value: object, *, empty: bool = False) -> str:
    """A string (non-empty unless ``empty``)."""
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise InputError(field, value, "must be a non-empty string")
    return value


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name(field: str, value: object) -> str:
    """A plain name (a machine kind such as ``h200x2``): letters, digits, '_', '.', '-', not
    starting with '.', never a path."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise InputError(field, value, "must be a plain name such as h200x2 (no path)")
    return value
