"""Metrics of a set of picks (one schedule per problem), pooled and per pattern.

``top1``          share of problems whose pick is the label;
``within_3pct``   share whose pick's time is within 3% of the oracle (the fastest measured);
``mean_regret``   mean of ``t_pick / t_oracle - 1``; ``worst_regret`` its maximum.

A pick with no ok measurement on its problem (never measured, failed or incorrect) counts as a
miss for ``top1`` and ``within_3pct`` and is charged the serial schedule's time, what a runtime
falls back to; ``n_unmeasured`` says how many.

Patterns differ (a pooled figure can hide one pattern far below its noise ceiling), so every
evaluation also reports each figure per pattern (``per_pattern``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ficco.select.dataset import SERIAL, Dataset

WITHIN = 0.03


@dataclass(frozen=True, slots=True)
class Metrics:
    """How good one way of picking schedules is, over a set of problems."""

    top1: float
    """Share of problems where the pick is the label."""
    within_3pct: float
    """Share of problems where the pick's time is within 3% of the oracle."""
    mean_regret: float
    """Mean of t_pick / t_oracle - 1."""
    worst_regret: float
    """Largest t_pick / t_oracle - 1."""
    n_problems: int
    """Problems scored."""
    n_unmeasured: int = 0
    """Picks with no ok measurement on their problem (charged the serial time)."""

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self).items()
        }


def score_picks(
    dataset: Dataset, picks: Mapping[str, str] | pd.Series, times: Mapping[str, float] | None = None
) -> Metrics:
    """Metrics of ``picks`` (problem_key -> schedule) over the problems they name.

    ``times`` (problem_key -> ms) scores picks that are not schedules of the space (a measured
    baseline): then ``top1`` is NaN."""
    keys = list(picks.keys())
    # every lookup at once (a problem's oracle, label, pick's and serial's time), in key order
    oracles = dataset.oracle_ms.loc[keys].tolist()
    if times is None:
        picked = picks.tolist() if isinstance(picks, pd.Series) else [picks[k] for k in keys]
        labels = dataset.labels.loc[keys].tolist()
        picked_ms = dataset.times_of(keys, picked)
    serial_ms = dataset.times_of(keys, [SERIAL] * len(keys))
    hits, within, regrets, unmeasured = 0, 0, [], 0
    for i, key in enumerate(keys):
        oracle = float(oracles[i])
        if times is not None:
            t = float(times[key])
        else:
            t = picked_ms[i]
            hits += picked[i] == labels[i]
        if math.isnan(t):
            unmeasured += 1
            t = serial_ms[i]
            if math.isnan(t):
                continue
        else:
            within += t <= oracle * (1 + WITHIN)
        regrets.append(t / oracle - 1)
    n = len(keys)
    return Metrics(
        top1=math.nan if times is not None or not n else hits / n,
        within_3pct=within / n if n else math.nan,
        mean_regret=float(np.mean(regrets)) if regrets else math.nan,
        worst_regret=float(np.max(regrets)) if regrets else math.nan,
        n_problems=n,
        n_unmeasured=unmeasured,
    )


def per_pattern(
    dataset: Dataset, pickers: Mapping[str, pd.Series | None], keys: list[str]
) -> dict[str, dict[str, Metrics]]:
    """Per pattern of the problems ``keys``, every picker's metrics on that pattern's problems
    (a picker given as None is left out). ``dataset`` scores the picks (the second half of the
    rounds for the noise ceiling)."""
    patterns = dataset.problems["pattern"].astype(str)
    out: dict[str, dict[str, Metrics]] = {}
    for pattern in sorted({patterns[k] for k in keys if k in patterns.index}):
        mine = [k for k in keys if k in patterns.index and patterns[k] == pattern]
        out[pattern] = {
            name: score_picks(dataset, picks.reindex([k for k in mine if k in picks.index]))
            for name, picks in pickers.items()
            if picks is not None
        }
    return out
