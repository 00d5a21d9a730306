"""Evaluation on unseen shapes: three held-out evaluations and their metrics.

``lomo``           leave one model out: hold out whole groups (by default whole models, e.g.
                   every layer of ``llama3-70b``), never random rows (a shape's neighbours
                   from the same model would leak its answer). ``LeaveOneGroupOut``, or
                   ``GroupKFold`` when ``n_splits`` is given.
``extrapolation``  train on M <= 4096, test on M >= 8192; and the reverse (two folds).
``both``           per model: train on the *other* models at M <= 4096, test this model at
                   M >= 8192; and the reverse.

Every problem is answered once per evaluation, by a selector that never saw it. Each evaluation
reports every family beside the fixed-rule baselines (``ficco.select.baselines``), the measured
safe default (the ``safe_default`` family: per pattern, the schedule of least mean regret on the
training folds) and the noise ceiling of the store (``ficco.select.noise``).

The shipped family is chosen by a declared rule (``choose_family``): families are walked from
the simplest (``ficco.select.families``' ``simplicity``); a more complex family replaces the
current choice only when its mean regret, fold by fold over the folds of all three evaluations,
is lower on average by more than the spread of the cross-validation: two standard errors of the
mean per-fold difference (``SPREAD_SE * std / sqrt(folds)``).

Metrics (``ficco.select.metrics``): top-1, within 3% of the oracle, mean and worst regret, pooled
and per pattern for every picker, the noise ceiling included (``SplitResult.patterns``,
``Evaluation.pattern_summary``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.base import clone

from ficco.select.baselines import BASELINES
from ficco.select.dataset import Dataset
from ficco.select.families import registry
from ficco.select.features import roofs_for
from ficco.select.metrics import Metrics, per_pattern, score_picks
from ficco.select.noise import ceiling_picks
from ficco.select.safe import best_fixed, safe_defaults
from ficco.select.selector import ScheduleSelector
from ficco.validate import InputError

#: The extrapolation splits: "low" problems have M <= LOW_MAX_M, "high" ones M >= HIGH_MIN_M.
LOW_MAX_M = 4096
HIGH_MIN_M = 8192
EVALUATIONS: tuple[str, ...] = ("lomo", "extrapolation", "both")
#: Families ``default_families`` compares (the registry may hold more).
COMPARED: tuple[str, ...] = ("safe_default", "tree", "near", "physical", "pairwise")

#: Standard errors of the mean per-fold gain a more complex family must beat (``choose_family``).
SPREAD_SE = 2.0

Fold = tuple[str, list[str], list[str]]  # (label, train keys, test keys)


def grouped_splits(
    dataset: Dataset, holdout_by: str = "model", n_splits: int | None = None
) -> Iterator[tuple[list[str], list[str]]]:
    """``(train_keys, test_keys)`` pairs holding out whole groups of ``holdout_by``."""
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    if holdout_by not in dataset.problems.columns:
        raise InputError(
            "holdout_by",
            holdout_by,
            f"no column {holdout_by!r}; choose one of {list(dataset.problems.columns)}",
        )
    groups = dataset.problems[holdout_by].astype(str).to_numpy()
    n_groups = len(set(groups))
    if n_groups < 2:
        raise InputError(
            "holdout_by",
            holdout_by,
            f"grouped cross-validation needs at least 2 distinct {holdout_by} values, "
            f"the profiles have {n_groups}",
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


def lomo_folds(
    dataset: Dataset, holdout_by: str = "model", n_splits: int | None = None
) -> list[Fold]:
    """Leave-one-group-out folds."""
    out = []
    for train, test in grouped_splits(dataset, holdout_by, n_splits):
        label = ",".join(sorted(set(dataset.problems.loc[test, holdout_by].astype(str))))
        out.append((label, train, test))
    return out


def _m_sides(dataset: Dataset) -> tuple[pd.Series, pd.Series]:
    m = dataset.problems["m"].astype(int)
    return m <= LOW_MAX_M, m >= HIGH_MIN_M


def extrapolation_folds(dataset: Dataset) -> list[Fold]:
    """Train on M <= 4096, test on M >= 8192; and the reverse. Empty folds are left out."""
    low, high = _m_sides(dataset)
    keys = pd.Series(dataset.keys, index=dataset.keys)
    folds = [
        (f"M<={LOW_MAX_M} -> M>={HIGH_MIN_M}", list(keys[low]), list(keys[high])),
        (f"M>={HIGH_MIN_M} -> M<={LOW_MAX_M}", list(keys[high]), list(keys[low])),
    ]
    return [f for f in folds if f[1] and f[2]]


def both_folds(dataset: Dataset, holdout_by: str = "model") -> list[Fold]:
    """Per group: train on the other groups' low (high) M, test this group's high (low) M."""
    low, high = _m_sides(dataset)
    group = dataset.problems[holdout_by].astype(str)
    out = []
    for name in sorted(set(group)):
        mine = group == name
        for label, train_side, test_side in (
            (f"{name}: M<={LOW_MAX_M} of others -> M>={HIGH_MIN_M}", low, high),
            (f"{name}: M>={HIGH_MIN_M} of others -> M<={LOW_MAX_M}", high, low),
        ):
            train = list(group.index[~mine & train_side])
            test = list(group.index[mine & test_side])
            if train and test:
                out.append((label, train, test))
    return out


def folds_of(
    dataset: Dataset, evaluation: str, holdout_by: str = "model", n_splits: int | None = None
) -> list[Fold]:
    """The folds of one of ``EVALUATIONS``."""
    if evaluation == "lomo":
        return lomo_folds(dataset, holdout_by, n_splits)
    if evaluation == "extrapolation":
        return extrapolation_folds(dataset)
    if evaluation == "both":
        return both_folds(dataset, holdout_by)
    raise ValueError(f"evaluation: unknown {evaluation!r}; expected one of {EVALUATIONS}")


def fold_picks(estimator: ScheduleSelector, dataset: Dataset, folds: list[Fold]) -> pd.Series:
    """Out-of-fold picks: each test problem answered by a selector fitted on its fold's train.
    A problem tested by several folds keeps the last fold's pick (no built-in split does)."""
    picks: dict[str, str] = {}
    for _, train, test in folds:
        model = fit_selector(estimator, dataset.subset(train))
        for key, pick in zip(test, model.predict(dataset.problems.loc[test]), strict=True):
            picks[key] = str(pick)
    tested = [k for k in dataset.keys if k in picks]
    return pd.Series(picks, dtype=object).reindex(tested)


def cross_val_picks(
    estimator: ScheduleSelector,
    dataset: Dataset,
    holdout_by: str = "model",
    n_splits: int | None = None,
) -> pd.Series:
    """Out-of-fold picks: each problem answered by a selector that never saw its group."""
    return fold_picks(estimator, dataset, lomo_folds(dataset, holdout_by, n_splits))


def default_families(machine: str = "h200x2") -> dict[str, ScheduleSelector]:
    """The model families compared before shipping one (``COMPARED``), with their registered
    default parameters, simplest first."""
    return {
        name: ScheduleSelector(family=name, machine=machine, **cls.defaults)
        for name, cls in registry().items()
        if name in COMPARED
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


def fold_regrets(dataset: Dataset, picks: pd.Series, folds: list[Fold]) -> list[float]:
    """Mean regret of ``picks`` on each fold's test problems."""
    return [score_picks(dataset, picks.loc[test]).mean_regret for _, _, test in folds]


def choose_family(
    fold_regret: Mapping[str, list[float]], simplicity: Mapping[str, int]
) -> tuple[str, list[dict]]:
    """The declared selection rule (see the module docstring). Returns the family and, per
    challenger, the mean and spread of its per-fold gain over the choice it was compared with."""
    order = sorted(fold_regret, key=lambda n: (simplicity[n], n))
    chosen, steps = order[0], []
    for challenger in order[1:]:
        gain = np.array(fold_regret[chosen]) - np.array(fold_regret[challenger])
        mean = float(np.mean(gain))
        spread = (
            SPREAD_SE * float(np.std(gain, ddof=1)) / math.sqrt(len(gain))
            if len(gain) > 1
            else math.inf
        )
        wins = mean > spread
        steps.append(
            {
                "incumbent": chosen,
                "challenger": challenger,
                "mean_gain": mean,
                "spread": spread,
                "replaces": wins,
            }
        )
        if wins:
            chosen = challenger
    return chosen, steps


@dataclass(slots=True)
class SplitResult:
    """One evaluation: every picker scored on the problems its folds held out."""

    name: str
    folds: list[str]
    """Fold labels."""
    families: dict[str, Metrics]
    baselines: dict[str, Metrics]
    noise_ceiling: Metrics | None
    directions: dict[str, dict[str, Metrics]] = field(default_factory=dict)
    """extrapolation and both: per direction (M up / M down), every picker's metrics."""
    patterns: dict[str, dict[str, Metrics]] = field(default_factory=dict)
    """Per pattern, every picker's metrics on its problems: the families by name, the baselines
    as ``baseline:<name>``, and ``noise_ceiling``."""

    def to_dict(self) -> dict:
        return {
            "folds": list(self.folds),
            "families": {n: m.to_dict() for n, m in self.families.items()},
            "baselines": {n: m.to_dict() for n, m in self.baselines.items()},
            "noise_ceiling": None if self.noise_ceiling is None else self.noise_ceiling.to_dict(),
            "directions": {
                d: {n: m.to_dict() for n, m in pickers.items()}
                for d, pickers in self.directions.items()
            },
            "per_pattern": {
                p: {n: m.to_dict() for n, m in pickers.items()}
                for p, pickers in self.patterns.items()
            },
        }


@dataclass(slots=True)
class Evaluation:
    """Held-out metrics of every family and the baselines, on one dataset."""

    best: str
    """The family the selection rule ships."""
    families: dict[str, Metrics]
    """Leave-one-model-out metrics per family."""
    baselines: dict[str, Metrics]
    """Metrics per baseline over the same problems."""
    holdout_by: str
    """The column whose groups were held out."""
    n_groups: int
    """Distinct values of ``holdout_by``."""
    n_problems: int
    """Problems scored."""
    picks: dict[str, pd.Series] = field(default_factory=dict)
    """Leave-one-model-out picks per family and picks per baseline."""
    params: dict[str, dict] = field(default_factory=dict)
    """Each family's estimator parameters."""
    splits: dict[str, SplitResult] = field(default_factory=dict)
    """Every evaluation (``EVALUATIONS``) by name."""
    selection: list[dict] = field(default_factory=list)
    """The selection rule's steps (see ``choose_family``)."""
    fold_regret: dict[str, list[float]] = field(default_factory=dict)
    """Per family, the mean regret of each fold of every evaluation (the rule's input)."""
    fold_labels: list[str] = field(default_factory=list)
    """``evaluation: fold`` labels, in the order of ``fold_regret``."""
    simplicity: dict[str, int] = field(default_factory=dict)
    safe_default: dict[str, dict] = field(default_factory=dict)
    """Per pattern, the safe default measured on every problem (what the table ships)."""
    best_fixed: dict = field(default_factory=dict)
    """The single schedule of least mean regret over every problem."""
    fingerprints: list[str] = field(default_factory=list)

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
            "evaluations": {name: r.to_dict() for name, r in self.splits.items()},
            "selection_rule": {
                "rule": "walk families from the simplest; a more complex family replaces the "
                "choice only when its per-fold mean regret, over the folds of every evaluation, "
                f"is lower on average by more than {SPREAD_SE:g} standard errors of the mean "
                "per-fold difference",
                "simplicity": dict(self.simplicity),
                "steps": list(self.selection),
                "folds": list(self.fold_labels),
                "fold_regret": {n: list(v) for n, v in self.fold_regret.items()},
            },
            "safe_default": dict(self.safe_default),
            "best_fixed": dict(self.best_fixed),
            "per_pattern": self.pattern_summary(),
            "fingerprints": list(self.fingerprints),
        }

    def pattern_summary(self) -> dict[str, dict]:
        """Per pattern: the shipped family's leave-one-model-out figures, then every family,
        baseline and the noise ceiling on the same problems, and the shipped family beside the
        ceiling in the other evaluations."""
        out: dict[str, dict] = {}
        for pattern, pickers in self.splits["lomo"].patterns.items():
            best = pickers[self.best].to_dict()
            ceiling = pickers.get("noise_ceiling")
            out[pattern] = {
                **{k: best[k] for k in ("top1", "within_3pct", "mean_regret", "worst_regret")},
                "n_problems": best["n_problems"],
                "noise_ceiling": None if ceiling is None else ceiling.to_dict(),
                "families": {n: pickers[n].to_dict() for n in self.families if n in pickers},
                "baselines": {
                    n.removeprefix("baseline:"): m.to_dict()
                    for n, m in pickers.items()
                    if n.startswith("baseline:")
                },
                "evaluations": {
                    name: {
                        picker: split.patterns[pattern][picker].to_dict()
                        for picker in (self.best, "noise_ceiling")
                        if picker in split.patterns.get(pattern, {})
                    }
                    for name, split in self.splits.items()
                    if name != "lomo"
                },
            }
        return out


def _directions(folds: list[Fold]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for label, _, test in folds:
        direction = "up" if label.endswith(f"M>={HIGH_MIN_M}") else "down"
        out.setdefault(direction, []).extend(test)
    return out


def _score_all(
    dataset: Dataset, pickers: Mapping[str, pd.Series], keys: list[str]
) -> dict[str, Metrics]:
    return {name: score_picks(dataset, picks.reindex(keys)) for name, picks in pickers.items()}


def evaluate(
    dataset: Dataset,
    *,
    machine: str = "h200x2",
    holdout_by: str = "model",
    families: Mapping[str, ScheduleSelector] | None = None,
    n_splits: int | None = None,
    halves: tuple[Dataset, Dataset] | None = None,
    evaluations: tuple[str, ...] = EVALUATIONS,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Score every family in every evaluation, beside the baselines, the safe default and the
    noise ceiling (when ``halves``, from ``ficco.select.noise.half_datasets``, is given), and
    choose the family to ship by the declared rule."""
    families = dict(families) if families is not None else default_families(machine)
    if not families:
        raise ValueError("families: give at least one estimator to evaluate")
    if "lomo" not in evaluations:
        raise ValueError(f"evaluations: must include 'lomo', got {evaluations}")
    known = registry()
    simplicity = {name: known[est.family].simplicity for name, est in families.items()}
    rules = baseline_picks(dataset, machine)
    ceiling = None
    if halves is not None:
        first, second = halves
        shared = [k for k in dataset.keys if k in first.times.index and k in second.times.index]
        ceiling = (second.subset(shared), ceiling_picks(first.subset(shared)))

    splits: dict[str, SplitResult] = {}
    fold_regret: dict[str, list[float]] = {name: [] for name in families}
    lomo_picks: dict[str, pd.Series] = {}
    fold_labels: list[str] = []
    params = {}
    for evaluation in evaluations:
        folds = folds_of(dataset, evaluation, holdout_by, n_splits)
        if not folds:
            continue
        fold_labels += [f"{evaluation}: {label}" for label, _, _ in folds]
        picks = {}
        for name, estimator in families.items():
            if progress:
                progress(f"{evaluation}: {name}")
            estimator = clone(estimator).set_params(machine=machine)
            params[name] = estimator.get_params()
            picks[name] = fold_picks(estimator, dataset, folds)
            fold_regret[name] += fold_regrets(dataset, picks[name], folds)
        if evaluation == "lomo":
            lomo_picks = picks
        tested = list(next(iter(picks.values())).index)
        result = SplitResult(
            name=evaluation,
            folds=[label for label, _, _ in folds],
            families=_score_all(dataset, picks, tested),
            baselines=_score_all(dataset, rules, tested),
            noise_ceiling=_ceiling(ceiling, tested),
            patterns=_pattern_metrics(dataset, picks, rules, ceiling, tested),
        )
        if evaluation != "lomo":
            for direction, keys in _directions(folds).items():
                result.directions[direction] = {
                    **_score_all(dataset, picks, keys),
                    **{f"baseline:{n}": m for n, m in _score_all(dataset, rules, keys).items()},
                }
                if ceiling is not None:
                    result.directions[direction]["noise_ceiling"] = _ceiling(ceiling, keys)
        splits[evaluation] = result

    best, steps = choose_family(fold_regret, simplicity)
    lomo = splits["lomo"]
    baselines = dict(lomo.baselines)
    all_picks: dict[str, pd.Series] = dict(lomo_picks)
    for name, chosen in rules.items():
        all_picks[f"baseline:{name}"] = chosen
    if "async_tp" in dataset.baseline_ms.columns:
        measured = dataset.baseline_ms["async_tp"].dropna()
        if len(measured):
            baselines["async_tp_measured"] = score_picks(
                dataset.subset(measured.index),
                pd.Series("async_tp", index=measured.index),
                times=measured,
            )
    patterns = dataset.problems["pattern"].astype(str)
    safe = safe_defaults(dataset.times, patterns)
    fixed_name, fixed_regret = best_fixed(dataset.times)
    safe_picks = pd.Series({k: safe[patterns[k]].schedule for k in dataset.keys}, dtype=object)
    return Evaluation(
        best=best,
        families=dict(lomo.families),
        baselines=baselines,
        holdout_by=holdout_by,
        n_groups=int(dataset.problems[holdout_by].nunique()),
        n_problems=len(dataset),
        picks=all_picks,
        params=params,
        splits=splits,
        selection=steps,
        fold_regret=fold_regret,
        fold_labels=fold_labels,
        simplicity=simplicity,
        safe_default={
            "per_pattern": {p: d.to_dict() for p, d in safe.items()},
            "all_problems": score_picks(dataset, safe_picks).to_dict(),
        },
        best_fixed={
            "schedule": fixed_name,
            **score_picks(dataset, pd.Series(fixed_name, index=dataset.keys)).to_dict(),
        },
        fingerprints=list(dataset.fingerprints),
    )


def _pattern_metrics(
    dataset: Dataset,
    picks: Mapping[str, pd.Series],
    rules: Mapping[str, pd.Series],
    ceiling,
    keys: list[str],
) -> dict[str, dict[str, Metrics]]:
    """``SplitResult.patterns``: every picker per pattern of ``keys``."""
    pickers = {**picks, **{f"baseline:{n}": p for n, p in rules.items()}}
    out = per_pattern(dataset, pickers, keys)
    if ceiling is not None:
        second, chosen = ceiling
        scored = [k for k in keys if k in chosen.index]
        for pattern, metrics in per_pattern(second, {"noise_ceiling": chosen}, scored).items():
            out.setdefault(pattern, {}).update(metrics)
    return out


def _ceiling(ceiling, keys: list[str]) -> Metrics | None:
    if ceiling is None:
        return None
    second, picks = ceiling
    keys = [k for k in keys if k in picks.index]
    return score_picks(second, picks.reindex(keys))
