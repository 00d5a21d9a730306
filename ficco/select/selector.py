"""The schedule selector: a scikit-learn estimator from problems to schedules.

``ScheduleSelector(family=...)`` wraps one model family from the registry of
``ficco.select.families`` (one decorated class per family; ``FAMILIES`` lists them, simplest
first): ``safe_default`` (one measured schedule per pattern), ``tree``, ``near``, ``forest``,
``boosting``, ``physical``, ``pairwise``, ``regressor``. Each family's module says what it
learns.

``feature_set``: ``all`` (every selector feature), ``scale_free`` (the pattern, W, dtype, rows
per rank and the roofline's predicted times and ratios, without the raw N, K, FLOPs and bytes)
or ``physical`` (``ficco.select.physics``: ratios and efficiencies only, no size at all).
Held-out models are larger or smaller than the training ones, and shapes beyond the measured
range larger still; raw sizes let the trees split on where each model sits, which says nothing
about a shape never seen.

``X`` is a table of problems (a DataFrame with ``pattern, m, n, k, world, dtype, experts`` or a
list of :class:`~ficco.problem.Problem`); features come from the problem alone
(:mod:`ficco.select.features`). ``predict`` never returns a schedule that is illegal for the
problem: families rank their candidates, the first legal one is the pick, and
``serial/nccl/cublas`` (always legal) ends every list. Fitting is single-threaded with a fixed
seed (``random_state``), so the same data give the same model on every machine.
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
from ficco.select.families import family_class, registry
from ficco.select.features import (
    PATTERN_FEATURES,
    RAW_FEATURES,
    ROUTING_FEATURES,
    raw_features,
    roofs_for,
    selector_feature_names,
)
from ficco.select.features import selector_features as _problem_features
from ficco.select.physics import PHYSICAL_PROBLEM_FEATURES, problem_physics
from ficco.select.schedules import SCHEDULE_FEATURES, schedule_features
from ficco.space import Schedule, is_legal
from ficco.space.geometry import geometry

#: Registered model families, simplest first.
FAMILIES: tuple[str, ...] = tuple(registry())

FEATURE_SETS: tuple[str, ...] = ("all", "scale_free", "physical")


#: The routing features as the selector names them (``log2_`` where it scales them).
_ROUTING_SELECTOR_NAMES: tuple[str, ...] = tuple(
    dict(zip(RAW_FEATURES, selector_feature_names(), strict=True))[f] for f in ROUTING_FEATURES
)
#: ``feature_set="scale_free"``: no raw N, K, FLOPs or bytes (see the module docstring)
SCALE_FREE_FEATURES: tuple[str, ...] = (
    *PATTERN_FEATURES,
    "world",
    "dtype_bytes",
    "log2_m_shard",
    "log2_intensity",
    "log2_t_gemm_pred_ms",
    "log2_t_comm_ce_pred_ms",
    "log2_t_comm_nccl_pred_ms",
    "log2_comm_compute_ratio",
    *_ROUTING_SELECTOR_NAMES,
)
#: The routing features as the selector's feature sets name them.
ROUTING_SELECTOR_FEATURES: frozenset[str] = frozenset(_ROUTING_SELECTOR_NAMES)
PAIR_FEATURES: tuple[str, ...] = (*SCHEDULE_FEATURES, "log2_piece_rows", "log2_pieces")


@lru_cache(maxsize=4096)
def _parse(name: str) -> Schedule:
    return Schedule.parse(name)


def complexity_of(name: str) -> int:
    """``Schedule.complexity`` of a schedule string (ties go to the lower)."""
    return _parse(name).complexity


def pair_features(problem: Problem, name: str) -> list[float]:
    """Schedule features plus what the schedule makes of this problem
    (``ficco.space.geometry``): the rows of one GEMM piece and the number of GEMM launches,
    both log2."""
    g = geometry(problem, _parse(name))
    return [*schedule_features(name), math.log2(g.gemm_rows), math.log2(g.gemm_launches)]


def as_problems(X) -> list[Problem]:
    """Problems from a DataFrame of problem columns, or a sequence of Problems."""
    if isinstance(X, pd.DataFrame):
        return [problem_from_row(row) for row in X.to_dict("records")]
    if isinstance(X, Sequence) and all(isinstance(p, Problem) for p in X):
        return list(X)
    raise TypeError(
        "X: expected a DataFrame with columns pattern, m, n, k, world, dtype, experts or a "
        f"list of Problem, got {type(X).__name__}"
    )


#: ``family_``'s key of the model over every pattern (answering those without their own).
ALL_PATTERNS = "*"


def _pattern_rows(problems: list[Problem], by_pattern: int) -> dict[str, list[int]]:
    """Row indices of the training ``problems`` per model: a pattern with at least
    ``by_pattern`` problems (``by_pattern`` > 0) gets its own rows; when any pattern has fewer,
    one model over every problem (``ALL_PATTERNS``) answers those."""
    per_pattern: dict[str, list[int]] = {}
    for i, problem in enumerate(problems):
        per_pattern.setdefault(problem.pattern.value, []).append(i)
    out = {p: rows for p, rows in per_pattern.items() if 0 < by_pattern <= len(rows)}
    if len(out) < len(per_pattern):
        out[ALL_PATTERNS] = list(range(len(problems)))
    return out


class ScheduleSelector(ClassifierMixin, BaseEstimator):
    """Pick a schedule for a problem, from features of the problem alone.

    Parameters
    ----------
    family : str
        A registered model family (``FAMILIES``; see ``ficco.select.families``).
    feature_set : {"all", "scale_free", "physical"}
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
    safe_margin : float
        Nearness families: answer the pattern's measured safe default unless the best
        candidate's predicted nearness exceeds the safe default's by more than this (0: off).
    by_pattern : int
        A pattern with at least this many training problems gets its own model, fitted on its
        problems alone (the patterns' costs differ in kind: an all-gather feeds the GEMM, a
        reduce-scatter drains it); the others share one model fitted on every problem, which
        is fitted only when some pattern needs it. 0: one model for every pattern. A pattern no
        model covers (none of its own, no shared one) is answered serial.
    random_state : int or None
        Seed of the models' randomness.

    Attributes
    ----------
    classes_ : ndarray of str
        Schedules the selector can answer (labels seen, or the regressor's candidates).
    model_ : estimator, None, or dict
        The fitted scikit-learn model (None when training had a single class); with
        per-pattern models, a dict of them by pattern (``ALL_PATTERNS``: the shared one).
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
        safe_margin: float = 0.0,
        by_pattern: int = 0,
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
        self.safe_margin = safe_margin
        self.by_pattern = by_pattern
        self.random_state = random_state

    # --- fitting ---------------------------------------------------------------------------

    def _features(self, problems: list[Problem]) -> np.ndarray:
        if self.feature_set == "physical":
            rows = [problem_physics(p, self.roofs_) for p in problems]
        else:
            rows = [_problem_features(p, self.roofs_) for p in problems]
        full = np.array(rows, dtype=float)
        return full[:, self.feature_columns_] if len(problems) else full

    def serial_pred(self, problem: Problem) -> float:
        """The roofline's predicted serial time (ms): GEMM plus NCCL collective."""
        raw = raw_features(problem, self.roofs_)
        return raw["t_gemm_pred_ms"] + raw["t_comm_nccl_pred_ms"]

    def fit(self, X, y, times: pd.DataFrame | None = None) -> ScheduleSelector:
        """Fit on problems ``X`` and their label schedules ``y``.

        ``times``: problem x schedule median ms, rows aligned with ``X`` (NaN where not measured
        ok); required by the families that learn from every schedule's time."""
        cls = family_class(self.family)
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
        if cls.needs_times:
            if times is None:
                raise ValueError(
                    f"times: the {self.family} family learns per-schedule times; pass times="
                )
            if len(times) != len(problems):
                raise ValueError(f"times: {len(times)} rows for {len(problems)} problems")
        self.roofs_ = roofs_for(self.machine)
        if self.feature_set == "physical":
            every = list(PHYSICAL_PROBLEM_FEATURES)
        else:
            every = selector_feature_names()
        wanted = list(SCALE_FREE_FEATURES) if self.feature_set == "scale_free" else every
        if not any(p.pattern.is_all_to_all for p in problems):
            # without an all-to-all the routing features are constants that teach nothing;
            # left out, the models of such a store are the ones fitted before they existed
            wanted = [name for name in wanted if name not in ROUTING_SELECTOR_FEATURES]
        self.feature_columns_ = [every.index(name) for name in wanted]
        self.feature_names_ = list(wanted)
        self.n_features_in_ = len(self.feature_names_)
        features = self._features(problems)
        groups = _pattern_rows(problems, self.by_pattern)
        self.family_ = {}
        for pattern, rows in groups.items():
            family = cls(self)
            family.fit(
                [problems[i] for i in rows],
                features[rows],
                labels[rows],
                None if times is None else times.iloc[rows],
            )
            self.family_[pattern] = family
        self.classes_ = np.array(
            sorted({c for f in self.family_.values() for c in f.classes}), dtype=object
        )
        models = {pattern: f.model for pattern, f in self.family_.items()}
        self.model_ = models[ALL_PATTERNS] if list(models) == [ALL_PATTERNS] else models
        return self

    # --- prediction ------------------------------------------------------------------------

    def rank(self, X) -> list[list[str]]:
        """Per problem, the schedules the selector can answer, most preferred first (legal or
        not)."""
        check_is_fitted(self, "classes_")
        problems = as_problems(X)
        if not problems:
            return []
        features = self._features(problems)
        out: list[list[str]] = [[SERIAL] for _ in problems]  # a pattern no model answers
        rows_of: dict[str, list[int]] = {}
        for i, problem in enumerate(problems):
            pattern = problem.pattern.value
            key = pattern if pattern in self.family_ else ALL_PATTERNS
            if key in self.family_:
                rows_of.setdefault(key, []).append(i)
        for key, rows in rows_of.items():
            ranked = self.family_[key].rank([problems[i] for i in rows], features[rows])
            for i, ranking in zip(rows, ranked, strict=True):
                out[i] = ranking
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
