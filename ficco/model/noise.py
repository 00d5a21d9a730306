"""What a profile store's own repeatability allows a model: its noise floor, per group.

A record's ``median_ms`` is the median of its rounds (``extra.times_ms``, interleaved with the
other candidates of its problem). Two readings of how far a second measurement would land:

``halves``     the rounds split in time order (first half, second half; the cut is
               ``ficco.measure.repeat``'s, as the selector's noise ceiling makes it): the
               relative difference of the two half-medians, over the record's median. Drift
               and the bimodal runs of host-bound eager schedules (a few fast rounds, then
               slow ones) show here.
``odd_even``   the rounds split alternately: the same figure without the drift.

Either is the disagreement of two measurements of half the rounds each; a model predicting the
true time perfectly would still differ from one full measurement by about half of it (the
noise of a median of n rounds falls as 1/sqrt(n)), so read a model's error against ~half the
half-split figure, and against the whole figure as an upper bound of what noise explains.

Two schedule-level baselines say how much of a group's time a model of the schedule alone
(no problem sizes) can capture: the measured median of each ``(pattern, schedule)`` as the
prediction for every record of it (``const_schedule``), and of each ``(pattern, schedule, n,
k)`` (``const_schedule_nk``: only M left free). Where they are small, time hardly depends on
the sizes (host-bound eager issue); where a model's error stays above them, it misses what a
lookup table would get.

Pure Python (statistics only); the validation script and its tests call it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable

from ficco.measure.repeat import record_rounds, split_medians


def split_rel_diffs(times: list[float]) -> tuple[float, float] | None:
    """(halves, odd_even) relative differences of a record's rounds (cut by
    ``ficco.measure.repeat.split_medians``), over their median; None with fewer than 4
    rounds or a non-positive median."""
    if len(times) < 4:
        return None
    whole = statistics.median(times)
    if not (whole > 0 and math.isfinite(whole)):
        return None
    (a, b), (odd, even) = split_medians(times, "halves"), split_medians(times, "odd_even")
    return abs(a - b) / whole, abs(odd - even) / whole


def quantiles(values: Iterable[float]) -> dict:
    """n, median and p90 (the value at 0.9 of the sorted list, as the validation reports)."""
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "median": statistics.median(v), "p90": v[int(0.9 * (len(v) - 1))]}


def _constant_errors(entries: list[tuple[tuple, float]]) -> list[float]:
    """Relative error of predicting each measurement by its key's median measurement."""
    by_key: dict[tuple, list[float]] = defaultdict(list)
    for key, ms in entries:
        by_key[key].append(ms)
    median = {key: statistics.median(v) for key, v in by_key.items()}
    return [abs(median[key] - ms) / ms for key, ms in entries]


def noise_floor(records: list[dict], group_of: Callable[[dict], str | None]) -> dict:
    """Per group (``group_of(record)``; None leaves a record out) and over ``all``: the
    half-split repeatability and the two schedule-level constant baselines. ``records``:
    ok schedule records with ``median_ms`` (those without ``extra.times_ms`` count in the
    baselines only)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        group = group_of(rec)
        if group is not None:
            groups[group].append(rec)
            groups["all"].append(rec)
    out = {}
    for group, recs in sorted(groups.items()):
        splits = [split_rel_diffs(record_rounds(r)) for r in recs]
        splits = [s for s in splits if s is not None]
        problem = [r["problem"] for r in recs]
        schedule_only = [
            ((p["pattern"], r["name"]), r["median_ms"]) for p, r in zip(problem, recs, strict=True)
        ]
        with_nk = [
            ((p["pattern"], r["name"], p["n"], p["k"]), r["median_ms"])
            for p, r in zip(problem, recs, strict=True)
        ]
        out[group] = {
            "records": len(recs),
            "halves": quantiles(h for h, _ in splits),
            "odd_even": quantiles(o for _, o in splits),
            "const_schedule": quantiles(_constant_errors(schedule_only)),
            "const_schedule_nk": quantiles(_constant_errors(with_nk)),
        }
    return out
