"""Evaluation on unseen shapes: grouped cross-validation and the metrics of DESIGN section 7.

Splits hold out whole groups (by default whole models, e.g. every layer of ``llama3-70b``), never
random rows: a shape's neighbours from the same model would otherwise leak its answer.
``LeaveOneGroupOut`` when there are few groups, ``GroupKFold`` when ``n_splits`` is given.

Metrics of a set of picks (one schedule per problem):

``top1``          share of problems whose pick is the label;
``within_3pct``   share whose pick's time is within 3% of the oracle (the fastest measured);
``mean_regret``   mean of ``t_pick / t_oracle - 1``; ``worst_regret`` its maximum.

A pick with no ok measurement on its problem (never measured, failed or incorrect) counts as a
miss for ``top1`` and ``within_3pct`` and is charged the serial schedule's time, what a runtime
falls back to; ``n_unmeasured`` says how many.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from sklearn.base import clone

from ficco.select.baselines import BASELINES
from ficco.select.dataset import SERIAL, Dataset
from ficco.select.features import roofs_for
from ficco.select.selector import ScheduleSelector

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
    hits, within, regrets, unmeasured = 0, 0, [], 0
    for key in keys:
        oracle = float(dataset.oracle_ms[key])
        if times is not None:
            t = float(times[key])
        else:
            t = dataset.time_of(key, picks[key])
            hits += picks[key] == dataset.labels[key]
        if math.isnan(t):
            unmeasured += 1
            t = dataset.time_of(key, SERIAL)
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


def grouped_splits(
    dataset: Dataset, holdout_by: str = "model", n_splits: int | None = None
) -> Iterator[tuple[list[str], list[str]]]:
    """``(train_keys, test_keys)`` pairs holding out whole groups of ``holdout_by``."""
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    if holdout_by not in dataset.problems.columns:
        raise ValueError(
            f"holdout_by: no column {holdout_by!r}; choose one of {list(dataset.problems.columns)}"
        )
    groups = dataset.problems[holdout_by].astype(str).to_numpy()
    n_groups = len(set(groups))
    if n_groups < 2:
        raise ValueError(
            f"holdout_by: grouped cross-validation needs at least 2 distinct {holdout_by} values, "
            f"the profiles have {n_groups}"
        )
    splitter = (
        LeaveOneGroupOut() if n_splits is None or n_splits >= n_groups else GroupKFold(n_splits)
    )
    keys = np.array(dataset.keys, dtype=object)
    for train, test in splitter.split(keys, groups=groups):
        yield list(keys[train]), list(keys[test])


def fit_selector(estimator: ScheduleSelector, dataset: Dataset) -> ScheduleSelector:
    """Fit a clone of ``estimator`` on every problem of ``dataset``."""
    model = clone(estimator)
    return model.fit(dataset.problems, dataset.labels.to_numpy(), times=dataset.times)


def cross_val_picks(
    estimator: ScheduleSelector,
    dataset: Dataset,
    holdout_by: str = "model",
    n_splits: int | None = None,
) -> pd.Series:
    """Out-of-fold picks: each problem answered by a selector that never saw its group."""
    picks: dict[str, str] = {}
    for train, test in grouped_splits(dataset, holdout_by, n_splits):
        model = fit_selector(estimator, dataset.subset(train))
        for key, pick in zip(test, model.predict(dataset.problems.loc[test]), strict=True):
            picks[key] = str(pick)
    return pd.Series(picks, dtype=object).reindex(dataset.keys)


def default_families(machine: str = "h200x2") -> dict[str, ScheduleSelector]:
    """The model families compared before shipping one."""
    return {
        "tree": ScheduleSelector(family="tree", machine=machine, max_depth=6, min_samples_leaf=2),
        "forest": ScheduleSelector(family="forest", machine=machine, n_estimators=200),
        "boosting": ScheduleSelector(
            family="boosting", machine=machine, n_estimators=100, max_depth=3
        ),
        "regressor": ScheduleSelector(
            family="regressor", machine=machine, n_estimators=200, min_samples_leaf=2
        ),
        "near": ScheduleSelector(
            family="near", machine=machine, n_estimators=300, min_samples_leaf=2, softness=0.01
        ),
        "pairwise": ScheduleSelector(
            family="pairwise",
            machine=machine,
            feature_set="scale_free",
            n_estimators=300,
            min_samples_leaf=2,
            softness=0.02,
        ),
    }


def baseline_picks(dataset: Dataset, machine: str = "h200x2") -> dict[str, pd.Series]:
    """Each baseline's pick for every problem (baselines need no training)."""
    roofs = roofs_for(machine)
    problems = dataset.problem_list()
    return {
        name: pd.Series(
            {key: rule(p, roofs) for key, p in zip(dataset.keys, problems, strict=True)},
            dtype=object,
        )
        for name, rule in BASELINES.items()
    }


@dataclass(slots=True)
class Evaluation:
    """Cross-validated metrics of every family and the baselines, on one dataset."""

    best: str
    """The family with the least mean regret (then the higher top-1)."""
    families: dict[str, Metrics]
    """Out-of-fold metrics per family."""
    baselines: dict[str, Metrics]
    """Metrics per baseline over the same problems."""
    holdout_by: str
    """The column whose groups were held out."""
    n_groups: int
    """Distinct values of ``holdout_by``."""
    n_problems: int
    """Problems scored."""
    picks: dict[str, pd.Series] = field(default_factory=dict)
    """Out-of-fold picks per family and picks per baseline."""
    params: dict[str, dict] = field(default_factory=dict)
    """Each family's estimator parameters."""

    def to_dict(self) -> dict:
        best = self.families[self.best].to_dict()
        return {
            **{k: best[k] for k in ("top1", "within_3pct", "mean_regret", "worst_regret")},
            "family": self.best,
            "n_problems": self.n_problems,
            "holdout_by": self.holdout_by,
            "n_groups": self.n_groups,
            "families": {name: m.to_dict() for name, m in self.families.items()},
            "baselines": {name: m.to_dict() for name, m in self.baselines.items()},
        }


def evaluate(
    dataset: Dataset,
    *,
    machine: str = "h200x2",
    holdout_by: str = "model",
    families: Mapping[str, ScheduleSelector] | None = None,
    n_splits: int | None = None,
) -> Evaluation:
    """Compare model families by grouped cross-validation and score the baselines."""
    families = dict(families) if families is not None else default_families(machine)
    if not families:
        raise ValueError("families: give at least one estimator to evaluate")
    metrics, picks, params = {}, {}, {}
    for name, estimator in families.items():
        estimator = clone(estimator).set_params(machine=machine)
        picks[name] = cross_val_picks(estimator, dataset, holdout_by, n_splits)
        metrics[name] = score_picks(dataset, picks[name])
        params[name] = estimator.get_params()
    order = list(families)
    best = min(order, key=lambda n: (metrics[n].mean_regret, -metrics[n].top1, order.index(n)))
    baselines = {}
    for name, chosen in baseline_picks(dataset, machine).items():
        baselines[name] = score_picks(dataset, chosen)
        picks[f"baseline:{name}"] = chosen
    if "async_tp" in dataset.baseline_ms.columns:
        measured = dataset.baseline_ms["async_tp"].dropna()
        if len(measured):
            baselines["async_tp_measured"] = score_picks(
                dataset.subset(measured.index),
                pd.Series("async_tp", index=measured.index),
                times=measured,
            )
    return Evaluation(
        best=best,
        families=metrics,
        baselines=baselines,
        holdout_by=holdout_by,
        n_groups=int(dataset.problems[holdout_by].nunique()),
        n_problems=len(dataset),
        picks=picks,
        params=params,
    )
