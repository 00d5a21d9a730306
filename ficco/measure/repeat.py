"""Repeatability by split rounds: a record's rounds cut in two, each part a measurement.

A record's ``median_ms`` is the median of its rounds (``extra.times_ms``, interleaved with the
other candidates of its problem). Cutting those rounds in two gives two measurements of the
same schedule, each of half the rounds; how far apart they land is what noise alone does:

``halves``     in time order: the first ``n // 2`` rounds, then the rest (drift, and the
               bimodal runs of host-bound eager schedules, show here)
``odd_even``   alternately: rounds 0, 2, 4, ... and 1, 3, 5, ... (the same without the drift)

The one definition of the cut: the selector's noise ceiling (``ficco.select.noise``: pick by
the first half, score on the second) and the model's noise floor (``ficco.model.noise``: the
two halves' relative difference) both take their parts here. Pure Python.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: how rounds are cut in two
SPLITS = ("halves", "odd_even")


def record_rounds(record: dict[str, Any]) -> list[float]:
    """The per-round times of a stored record (``extra.times_ms``; empty where it kept none)."""
    return list((record.get("extra") or {}).get("times_ms") or [])


def split_rounds(times: Sequence[float], split: str = "halves") -> tuple[list[float], list[float]]:
    """The rounds ``times`` cut in two (``split``: one of ``SPLITS``). ``halves`` gives the
    second part the odd round out."""
    if split == "halves":
        mid = len(times) // 2
        return list(times[:mid]), list(times[mid:])
    if split == "odd_even":
        return list(times[0::2]), list(times[1::2])
    raise ValueError(f"split: {split!r}; expected one of {', '.join(SPLITS)}")


def split_medians(times: Sequence[float], split: str = "halves") -> tuple[float, float] | None:
    """The medians of the two parts of ``times``; None with fewer than 2 rounds (a part
    would be empty)."""
    if len(times) < 2:
        return None
    first, second = split_rounds(times, split)
    return statistics.median(first), statistics.median(second)
