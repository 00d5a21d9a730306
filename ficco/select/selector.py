"""The schedule selector: a scikit-learn estimator from problems to schedules.

``ScheduleSelector(family=...)`` wraps one model family:

``tree``       a ``DecisionTreeClassifier`` on the label (the fastest schedule, ties toward
               simpler);
``forest``     a ``RandomForestClassifier`` on the label;
``boosting``   a ``GradientBoostingClassifier`` on the label;
``regressor``  a ``RandomForestRegressor`` of each schedule's log time (relative to the
               roofline's predicted serial time) from problem + schedule features; the pick is
               the candidate with the least predicted time.
``near``       a multi-output ``RandomForestRegressor`` of each schedule's nearness to the
               problem's oracle, ``exp(-(t_s / t_oracle - 1) / softness)`` (1 for the fastest,
               1/e at ``softness`` slower, 0 where not measured ok); the pick is the candidate
               with the highest predicted nearness. It learns which schedules are near-optimal
               together, not one label per problem, so near-ties cost it nothing.
``pairwise``   one ``RandomForestRegressor`` of the same nearness over (problem, schedule)
               rows: problem features plus schedule features plus the rows of one GEMM piece
               and the number of pieces. Schedules share what it learns (a 64-row chunk is
               slow whichever schedule cuts it), so it carries over to shapes unlike the
               training ones better than one output per schedule.

``feature_set``: ``all`` (every selector feature) or ``scale_free`` (the pattern, W, dtype, rows
per rank and the roofline's predicted times and ratios, without the raw N, K, FLOPs and bytes).
Held-out models are larger or smaller than the training ones; raw sizes let the trees split on
where each model sits, which says nothing about a model never seen.

``X`` is a table of problems (a DataFrame with ``pattern, m, n, k, world, dtype, experts`` or a
list of :class:`~ficco.problem.Problem`); features come from the problem alone
(:mod:`ficco.select.features`). ``predict`` never returns a schedule that is illegal for the
problem: classifiers walk their classes from the most to the least probable, the regressor its
candidates from the fastest predicted, and ``serial/nccl/cublas`` (always legal) ends every list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from ficco.problem import Problem
from ficco.select.dataset import SERIAL, problem_from_row
from ficco.select.features import raw_features, roofs_for, selector_feature_names
from ficco.select.features import selector_features as _problem_features
from ficco.space import Schedule, is_legal

FAMILIES: tuple[str, ...] = ("tree", "forest", "boosting", "regressor", "near", "pairwise")
FEATURE_SETS: tuple[str, ...] = ("all", "scale_free")

SCHEDULE_FEATURES: tuple[str, ...] = (
    "granularity",
    "log2_chunks",
    "split_m",
    "split_n",
    "split_k",
    "transport_ce",
    "transport_nccl",
    "transport_nccl_ce",
    "gemm_triton",
    "merged",
    "all_peers",
    "sm_reserve",
    "comm_high_priority",
)


#: ``feature_set="scale_free"``: no raw N, K, FLOPs or bytes (see the module docstring)
SCALE_FREE_FEATURES: tuple[str, ...] = (
    "is_ag_gemm",
    "is_gemm_rs",
    "is_a2a_gemm",
    "is_gemm_a2a",
    "world",
    "dtype_bytes",
    "log2_m_shard",
    "log2_intensity",
    "log2_t_gemm_pred_ms",
    "log2_t_comm_ce_pred_ms",
    "log2_t_comm_nccl_pred_ms",
    "log2_comm_compute_ratio",
)
PAIR_FEATURES: tuple[str, ...] = (*SCHEDULE_FEATURES, "log2_piece_rows", "log2_pieces")


@lru_cache(maxsize=4096)
def _parse(name: str) -> Schedule:
    return Schedule.parse(name)


def schedule_features(name: str) -> list[float]:
    """Numeric description of a schedule (for the ``regressor`` family)."""
    s = _parse(name)
    return [
        float(["serial", "shard", "finer"].index(s.granularity.value)),
        math.log2(s.chunks),
        float(s.split.value == "m"),
        float(s.split.value == "n"),
        float(s.split.value == "k"),
        float(s.transport.value == "ce"),
        float(s.transport.value == "nccl"),
        float(s.transport.value == "nccl_ce"),
        float(s.gemm.value == "triton"),
        float(s.compute.value == "merged"),
        float(s.order.value == "all_peers"),
        float(s.sm_reserve),
        float(s.comm_priority.value == "high"),
    ]


def pair_features(problem: Problem, name: str) -> list[float]:
    """Schedule features plus what the schedule makes of this problem: the rows of one GEMM
    piece (``m / W / chunks``; a shard's rows for shard-level and serial schedules) and the
    number of pieces (steps x chunks), both log2."""
    s = _parse(name)
    chunks = s.chunks if s.granularity.value == "finer" else 1
    steps = 1 if s.granularity.value == "serial" else problem.world
    piece_rows = max(problem.m // problem.world // chunks, 1)
    return [*schedule_features(name), math.log2(piece_rows), math.log2(steps * chunks)]


def as_problems(X) -> list[Problem]:
    """Problems from a DataFrame of problem columns, or a sequence of Problems."""
    if isinstance(X, pd.DataFrame):
        return [problem_from_row(row) for _, row in X.iterrows()]
    if isinstance(X, Sequence) and all(isinstance(p, Problem) for p in X):
        return list(X)
    raise TypeError(
        "X: expected a DataFrame with columns pattern, m, n, k, world, dtype, experts or a "
        f"list of Problem, got {type(X).__name__}"
    )


class ScheduleSelector(ClassifierMixin, BaseEstimator):
    """Pick a schedule for a problem, from features of the problem alone.

    Parameters
    ----------
    family : {"tree", "forest", "boosting", "regressor", "near", "pairwise"}
        Model family (see the module docstring).
    feature_set : {"all", "scale_free"}
        Which problem features the model sees (see the module docstring).
    machine : str
        Machine kind whose roofs give the predicted-time features (``features.MACHINES``).
    n_estimators : int
        Trees of the forest / boosting stages / regressor forest (unused by ``tree``).
    max_depth : int or None
        Depth limit of each tree (``boosting`` uses 3 when None).
    min_samples_leaf : int
        Fewest training rows per leaf.
    learning_rate : float
        ``boosting`` only.
    near_oracle : float
        ``regressor`` and ``near``: their candidates are the schedules within this fraction of
        the oracle on at least one training problem.
    softness : float
        ``near`` only: the relative slowdown at which a schedule's nearness falls to 1/e.
    random_state : int or None
        Seed of the models' randomness.

    Attributes
    ----------
    classes_ : ndarray of str
        Schedules the selector can answer (labels seen, or the regressor's candidates).
    model_ : estimator or None
        The fitted scikit-learn model (None when training had a single class).
    roofs_ : ficco.select.features.Roofs
    feature_names_ : list of str
        Problem features, in column order.
    n_features_in_ : int
    """

    def __init__(
        self,
        family: str = "forest",
        machine: str = "h200x2",
        feature_set: str = "all",
        n_estimators: int = 200,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        learning_rate: float = 0.1,
        near_oracle: float = 0.03,
        softness: float = 0.01,
        random_state: int | None = 0,
    ):
        self.family = family
        self.machine = machine
        self.feature_set = feature_set
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.learning_rate = learning_rate
        self.near_oracle = near_oracle
        self.softness = softness
        self.random_state = random_state

    # --- fitting ---------------------------------------------------------------------------

    def _make_model(self):
        from sklearn.ensemble import (
            GradientBoostingClassifier,
            RandomForestClassifier,
            RandomForestRegressor,
        )
        from sklearn.tree import DecisionTreeClassifier

        if self.family == "tree":
            return DecisionTreeClassifier(
                max_depth=self.max_depth,
                min_samples_leaf=self.min_samples_leaf,
                random_state=self.random_state,
            )
        if self.family == "forest":
            return RandomForestClassifier(
                n_estimators=self.n_estimators,
                max_depth=self.max_depth,
                min_samples_leaf=self.min_samples_leaf,
                random_state=self.random_state,
            )
        if self.family == "boosting":
            return GradientBoostingClassifier(
                n_estimators=self.n_estimators,
                max_depth=self.max_depth or 3,
                min_samples_leaf=self.min_samples_leaf,
                learning_rate=self.learning_rate,
                random_state=self.random_state,
            )
        return RandomForestRegressor(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
        )

    def _features(self, problems: list[Problem]) -> np.ndarray:
        full = np.array([_problem_features(p, self.roofs_) for p in problems], dtype=float)
        return full[:, self.feature_columns_] if len(problems) else full

    def fit(self, X, y, times: pd.DataFrame | None = None) -> ScheduleSelector:
        """Fit on problems ``X`` and their label schedules ``y``.

        ``times``: problem x schedule median ms, rows aligned with ``X`` (NaN where not measured
        ok); required by the ``regressor`` family, ignored by the classifiers."""
        if self.family not in FAMILIES:
            raise ValueError(
                f"family: unknown family {self.family!r}; expected one of {', '.join(FAMILIES)}"
            )
        problems = as_problems(X)
        labels = np.asarray(y, dtype=object)
        if len(problems) != len(labels):
            raise ValueError(f"y: {len(labels)} labels for {len(problems)} problems")
        if not len(problems):
            raise ValueError("X: no problems to fit on")
        for name in set(labels):
            _parse(str(name))  # ValueError naming a label that is not a schedule
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(
                f"feature_set: unknown {self.feature_set!r}; expected one of "
                f"{', '.join(FEATURE_SETS)}"
            )
        self.roofs_ = roofs_for(self.machine)
        every = selector_feature_names()
        wanted = every if self.feature_set == "all" else SCALE_FREE_FEATURES
        self.feature_columns_ = [every.index(name) for name in wanted]
        self.feature_names_ = list(wanted)
        self.n_features_in_ = len(self.feature_names_)
        features = self._features(problems)
        if self.family == "regressor":
            self._fit_regressor(problems, features, labels, times)
            return self
        if self.family in ("near", "pairwise"):
            self._fit_near(problems, features, labels, times)
            return self
        self.classes_ = np.array(sorted(set(labels)), dtype=object)
        if len(self.classes_) == 1:
            self.model_ = None
        else:
            self.model_ = self._make_model().fit(features, labels)
        return self

    def _fit_regressor(self, problems, features, labels, times) -> None:
        if times is None:
            raise ValueError("times: the regressor family learns per-schedule times; pass times=")
        if len(times) != len(problems):
            raise ValueError(f"times: {len(times)} rows for {len(problems)} problems")
        values = times.to_numpy(dtype=float)
        oracle = np.nanmin(values, axis=1)
        near = (values <= oracle[:, None] * (1 + self.near_oracle)) & ~np.isnan(values)
        candidates = {str(c) for c, hit in zip(times.columns, near.any(axis=0), strict=True) if hit}
        candidates |= {str(c) for c in labels} | {SERIAL}
        self.classes_ = np.array(sorted(candidates), dtype=object)
        rows, targets = [], []
        for i, problem in enumerate(problems):
            base = self._serial_pred(problem)
            for j, name in enumerate(times.columns):
                if not np.isnan(values[i, j]):
                    rows.append([*features[i], *schedule_features(str(name))])
                    targets.append(math.log(values[i, j] / base))
        self.model_ = self._make_model().fit(np.array(rows), np.array(targets))

    def _fit_near(self, problems, features, labels, times) -> None:
        if times is None:
            raise ValueError(
                f"times: the {self.family} family learns per-schedule times; pass times="
            )
        if len(times) != len(problems):
            raise ValueError(f"times: {len(times)} rows for {len(problems)} problems")
        if not self.softness > 0:
            raise ValueError(f"softness: must be > 0, got {self.softness}")
        values = times.to_numpy(dtype=float)
        relative = values / np.nanmin(values, axis=1)[:, None]
        near = (relative <= 1 + self.near_oracle) & ~np.isnan(values)
        keep = near.any(axis=0)
        self.classes_ = np.array([str(c) for c in times.columns[keep]], dtype=object)
        nearness = np.exp(-(relative[:, keep] - 1) / self.softness)
        if self.family == "near":
            self.model_ = self._make_model().fit(features, np.nan_to_num(nearness, nan=0.0))
            return
        # pairwise: one row per measured (problem, candidate); unmeasured pairs teach nothing
        rows, targets = [], []
        for i, problem in enumerate(problems):
            for j, name in enumerate(self.classes_):
                if not np.isnan(nearness[i, j]):
                    rows.append([*features[i], *pair_features(problem, name)])
                    targets.append(nearness[i, j])
        self.model_ = self._make_model().fit(np.array(rows), np.array(targets))

    def _serial_pred(self, problem: Problem) -> float:
        raw = raw_features(problem, self.roofs_)
        return raw["t_gemm_pred_ms"] + raw["t_comm_nccl_pred_ms"]

    # --- prediction ------------------------------------------------------------------------

    def rank(self, X) -> list[list[str]]:
        """Per problem, the schedules the selector can answer, most preferred first (legal or
        not)."""
        check_is_fitted(self, "classes_")
        problems = as_problems(X)
        if not problems:
            return []
        features = self._features(problems)
        if self.model_ is None:
            return [list(self.classes_) for _ in problems]
        if self.family == "regressor":
            return self._rank_regressor(problems, features)
        if self.family in ("near", "pairwise"):
            if self.family == "near":
                predicted = self.model_.predict(features)
            else:
                block = [
                    [*row, *pair_features(problem, str(name))]
                    for problem, row in zip(problems, features, strict=True)
                    for name in self.classes_
                ]
                predicted = self.model_.predict(np.array(block))
            predicted = predicted.reshape(len(problems), len(self.classes_))
            complexity = np.array([_parse(str(n)).complexity for n in self.classes_])
            return [
                [str(self.classes_[j]) for j in np.lexsort((complexity, -row))] for row in predicted
            ]
        proba = self.model_.predict_proba(features)
        classes = self.model_.classes_
        order = np.argsort(-proba, axis=1, kind="stable")
        return [[str(classes[j]) for j in row] for row in order]

    def _rank_regressor(self, problems, features) -> list[list[str]]:
        names = [str(c) for c in self.classes_]
        sched = np.array([schedule_features(n) for n in names])
        n_c = len(names)
        block = np.hstack([np.repeat(features, n_c, axis=0), np.tile(sched, (len(problems), 1))])
        predicted = self.model_.predict(block).reshape(len(problems), n_c)
        complexity = np.array([_parse(n).complexity for n in names])
        out = []
        for row in predicted:
            order = np.lexsort((complexity, row))
            out.append([names[j] for j in order])
        return out

    def predict(self, X) -> np.ndarray:
        """The most preferred legal schedule of each problem (serial when none is legal)."""
        problems = as_problems(X)
        picks = []
        for problem, ranking in zip(problems, self.rank(problems), strict=True):
            pick = SERIAL
            for name in ranking:
                if is_legal(problem, _parse(name)):
                    pick = name
                    break
            picks.append(pick)
        return np.array(picks, dtype=object)

    def score(self, X, y, sample_weight=None) -> float:
        """Top-1 accuracy against the labels ``y``."""
        picks = self.predict(X)
        hits = np.asarray(picks == np.asarray(y, dtype=object), dtype=float)
        return float(np.average(hits, weights=sample_weight))
