"""``regressor``: a ``RandomForestRegressor`` of each schedule's log time (relative to the
roofline's predicted serial time) from problem + schedule features; the pick is the candidate
with the least predicted time. Its candidates are the schedules within ``near_oracle`` of the
oracle on at least one training problem."""

from __future__ import annotations

import math

import numpy as np

from ficco.select.families import Family, register_family


def forest_regressor(est):
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(
        n_estimators=est.n_estimators,
        max_depth=est.max_depth,
        min_samples_leaf=est.min_samples_leaf,
        random_state=est.random_state,
        n_jobs=1,
    )


@register_family("regressor", simplicity=70, defaults={"n_estimators": 200, "min_samples_leaf": 2})
class RegressorFamily(Family):
    needs_times = True

    def fit(self, problems, features, labels, times) -> None:
        from ficco.select.schedules import schedule_features
        from ficco.select.selector import SERIAL

        values = times.to_numpy(dtype=float)
        oracle = np.nanmin(values, axis=1)
        near = (values <= oracle[:, None] * (1 + self.est.near_oracle)) & ~np.isnan(values)
        candidates = {str(c) for c, hit in zip(times.columns, near.any(axis=0), strict=True) if hit}
        self.classes = sorted(candidates | {str(c) for c in labels} | {SERIAL})
        rows, targets = [], []
        for i, problem in enumerate(problems):
            base = self.est.serial_pred(problem)
            for j, name in enumerate(times.columns):
                if not np.isnan(values[i, j]):
                    rows.append([*features[i], *schedule_features(str(name))])
                    targets.append(math.log(values[i, j] / base))
        self.model = forest_regressor(self.est).fit(np.array(rows), np.array(targets))

    def rank(self, problems, features) -> list[list[str]]:
        from ficco.select.schedules import schedule_features
        from ficco.select.selector import complexity_of

        names = self.classes
        sched = np.array([schedule_features(n) for n in names])
        n_c = len(names)
        block = np.hstack([np.repeat(features, n_c, axis=0), np.tile(sched, (len(problems), 1))])
        predicted = self.model.predict(block).reshape(len(problems), n_c)
        complexity = np.array([complexity_of(n) for n in names])
        return [[names[j] for j in np.lexsort((complexity, row))] for row in predicted]
