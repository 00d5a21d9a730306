"""Families that learn each schedule's *nearness* to the problem's oracle,
``exp(-(t_s / t_oracle - 1) / softness)`` (1 for the fastest, 1/e at ``softness`` slower, 0
where not measured ok), and pick the candidate with the highest predicted nearness. They learn
which schedules are near-optimal together, not one label per problem, so near-ties cost them
nothing. Candidates: the schedules within ``near_oracle`` of the oracle on at least one
training problem. With ``safe_margin`` > 0 they defer to the measured safe default of the
pattern (``ficco.select.safe``, from the training problems) unless their best candidate is
predicted nearer by more than that margin: a model unsure of a shape unlike its training ones
answers what was measured to be safe.

``near``      one multi-output ``RandomForestRegressor`` from problem features to every
              candidate's nearness;
``pairwise``  one ``RandomForestRegressor`` over (problem, schedule) rows: problem features plus
              the schedule's features and the piece it cuts (``selector.pair_features``, from
              ``ficco.space.geometry``). Schedules share what it learns (a 64-row piece is slow
              whichever schedule cuts it);
``physical``  ``pairwise`` on the features of ``ficco.select.physics`` only: ratios and
              efficiencies that keep their meaning beyond the measured shapes; one forest per
              pattern (``by_pattern``). On the h200x2 store, leave one model out, per-pattern
              forests with softness 0.02 and margin 0.02 raised within 3% from 90.9% to 94.2%
              (gemm_rs 90.9% -> 93.5%, ag_gemm 90.9% -> 94.8%) over one forest for both with
              0.03 / 0.05 (``profiles/h200x2/NOTES_selector.md``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ficco.select.families import Family, register_family
from ficco.select.families.regressor import forest_regressor
from ficco.select.safe import safe_defaults


class _Nearness(Family):
    needs_times = True

    def targets(self, problems, times) -> np.ndarray:
        e = self.est
        if e.safe_margin > 0:
            patterns = pd.Series([p.pattern.value for p in problems], index=times.index)
            self.safe = {p: d.schedule for p, d in safe_defaults(times, patterns).items()}
        if not e.softness > 0:
            raise ValueError(f"softness: must be > 0, got {e.softness}")
        values = times.to_numpy(dtype=float)
        relative = values / np.nanmin(values, axis=1)[:, None]
        near = (relative <= 1 + e.near_oracle) & ~np.isnan(values)
        keep = near.any(axis=0)
        self.classes = [str(c) for c in times.columns[keep]]
        return np.exp(-(relative[:, keep] - 1) / e.softness)

    def order(self, problems, predicted: np.ndarray) -> list[list[str]]:
        """Candidates by predicted nearness (ties toward the simpler schedule). With
        ``safe_margin``, the pattern's measured safe default goes first unless the best
        candidate's predicted nearness beats it by more than the margin."""
        from ficco.select.selector import complexity_of

        complexity = np.array([complexity_of(n) for n in self.classes])
        index = {name: j for j, name in enumerate(self.classes)}
        out = []
        for problem, row in zip(problems, predicted, strict=True):
            ranking = [self.classes[j] for j in np.lexsort((complexity, -row))]
            safe = self.safe.get(problem.pattern.value) if self.est.safe_margin > 0 else None
            if safe in index and row[index[safe]] >= row.max() - self.est.safe_margin:
                ranking.remove(safe)
                ranking.insert(0, safe)
            out.append(ranking)
        return out


@register_family(
    "near",
    simplicity=20,
    defaults={"n_estimators": 300, "min_samples_leaf": 2, "softness": 0.01},
)
class NearFamily(_Nearness):
    def fit(self, problems, features, labels, times) -> None:
        nearness = self.targets(problems, times)
        self.model = forest_regressor(self.est).fit(features, np.nan_to_num(nearness, nan=0.0))

    def rank(self, problems, features) -> list[list[str]]:
        predicted = self.model.predict(features).reshape(len(problems), len(self.classes))
        return self.order(problems, predicted)


class _Pairwise(_Nearness):
    def pair(self, problem, name: str) -> list[float]:
        from ficco.select.selector import pair_features

        return pair_features(problem, name)

    def fit(self, problems, features, labels, times) -> None:
        nearness = self.targets(problems, times)
        rows, targets = [], []
        for i, problem in enumerate(problems):
            for j, name in enumerate(self.classes):
                if not np.isnan(nearness[i, j]):  # unmeasured pairs teach nothing
                    rows.append([*features[i], *self.pair(problem, name)])
                    targets.append(nearness[i, j])
        self.model = forest_regressor(self.est).fit(np.array(rows), np.array(targets))

    def rank(self, problems, features) -> list[list[str]]:
        block = [
            [*row, *self.pair(problem, name)]
            for problem, row in zip(problems, features, strict=True)
            for name in self.classes
        ]
        predicted = self.model.predict(np.array(block)).reshape(len(problems), len(self.classes))
        return self.order(problems, predicted)


@register_family(
    "pairwise",
    simplicity=60,
    defaults={
        "feature_set": "scale_free",
        "n_estimators": 300,
        "min_samples_leaf": 2,
        "softness": 0.02,
    },
)
class PairwiseFamily(_Pairwise):
    pass


@register_family(
    "physical",
    simplicity=50,
    defaults={
        "feature_set": "physical",
        "n_estimators": 200,
        "min_samples_leaf": 2,
        "softness": 0.02,
        "safe_margin": 0.02,
        "by_pattern": 30,
    },
)
class PhysicalFamily(_Pairwise):
    def pair(self, problem, name: str) -> list[float]:
        from ficco.select.physics import pair_physics

        return list(pair_physics(problem, name, self.est.roofs_))
