"""Schedule selection: features, the dataset, the selector estimator, evaluation.

``ficco.select.features`` and ``ficco.select.physics`` are pure Python (``features`` is what
``recommend`` needs). Model families live in a registry (``ficco.select.families``: one
decorated class per family). The rest uses pandas
and scikit-learn and is imported on first use of its names, so importing this package stays
light.
"""

from __future__ import annotations

from importlib import import_module

from ficco.select.features import MACHINES, Roofs, raw_features, roofs_for, selector_features

_LAZY = {
    "Dataset": "ficco.select.dataset",
    "build_dataset": "ficco.select.dataset",
    "pick_label": "ficco.select.dataset",
    "SERIAL": "ficco.select.dataset",
    "SHARD_CE": "ficco.select.dataset",
    "ScheduleSelector": "ficco.select.selector",
    "FAMILIES": "ficco.select.selector",
    "Family": "ficco.select.families",
    "register_family": "ficco.select.families",
    "registry": "ficco.select.families",
    "SafeDefault": "ficco.select.safe",
    "safe_defaults": "ficco.select.safe",
    "half_datasets": "ficco.select.noise",
    "choose_family": "ficco.select.evaluate",
    "folds_of": "ficco.select.evaluate",
    "fold_picks": "ficco.select.evaluate",
    "EVALUATIONS": "ficco.select.evaluate",
    "BASELINES": "ficco.select.baselines",
    "Evaluation": "ficco.select.evaluate",
    "Metrics": "ficco.select.metrics",
    "cross_val_picks": "ficco.select.evaluate",
    "default_families": "ficco.select.evaluate",
    "evaluate": "ficco.select.evaluate",
    "fit_selector": "ficco.select.evaluate",
    "grouped_splits": "ficco.select.evaluate",
    "score_picks": "ficco.select.metrics",
    "per_pattern": "ficco.select.metrics",
}

__all__ = [
    "MACHINES",
    "Roofs",
    "raw_features",
    "roofs_for",
    "selector_features",
    *sorted(_LAZY),
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ficco.select' has no attribute {name!r}")
