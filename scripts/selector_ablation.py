"""How much of the shipped selector's figure is the choice of settings, and how much is noise?

Leave-one-model-out, on one profile store, for the shipped family (``default_families``'s
``pairwise``) and its neighbours: the other feature set, the ``near`` family, another softness,
other seeds. Then the noise ceiling: each schedule's stored samples split in two halves, the
fastest schedule of the first half scored on the second (what a perfect picker trained on
those rounds would reach). Prints a row per picker, then last the shipped one's
``within_3pct`` and the ceiling.

Usage: python scripts/selector_ablation.py --store profiles/h200x2/store [--machine h200x2]
"""

from __future__ import annotations

import argparse
import statistics

import pandas as pd
from sklearn.base import clone

from ficco.profile import ProfileStore
from ficco.profile.frame import frame_from_records
from ficco.select.dataset import build_dataset
from ficco.select.evaluate import cross_val_picks, default_families, score_picks


def half_medians(records: list[dict], half: int) -> list[dict]:
    """The records with each median taken over one half of its stored samples."""
    out = []
    for record in records:
        samples = (record.get("extra") or {}).get("times_ms")
        if samples and len(samples) >= 2:
            part = samples[: len(samples) // 2] if half == 0 else samples[len(samples) // 2 :]
            record = {**record, "median_ms": statistics.median(part), "samples": len(part)}
        out.append(record)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="profile store directory")
    parser.add_argument("--machine", default="h200x2")
    args = parser.parse_args(argv)

    records = ProfileStore.read(args.store).records()
    dataset = build_dataset(frame_from_records(records))
    shipped = default_families(args.machine)["pairwise"]
    pickers = {
        "pairwise, scale-free (shipped)": shipped,
        "pairwise, all features": clone(shipped).set_params(feature_set="all"),
        "pairwise, softness 0.01": clone(shipped).set_params(softness=0.01),
        "pairwise, seed 1": clone(shipped).set_params(random_state=1),
        "pairwise, seed 2": clone(shipped).set_params(random_state=2),
        "near, scale-free": default_families(args.machine)["near"].set_params(
            feature_set="scale_free"
        ),
        "near, all features": default_families(args.machine)["near"],
    }
    print(f"{'picker':<34} {'within 3%':>9} {'mean regret':>11} {'worst':>7}")
    scores, picks_of = {}, {}
    for name, estimator in pickers.items():
        picks_of[name] = picks = cross_val_picks(estimator, dataset, "model")
        scores[name] = m = score_picks(dataset, picks)
        print(f"{name:<34} {m.within_3pct:>9.3f} {m.mean_regret:>11.4f} {m.worst_regret:>7.3f}")
    shipped_picks = picks_of["pairwise, scale-free (shipped)"]
    print("shipped, within 3% per held-out model:")
    for model, keys in dataset.problems.groupby("model").groups.items():
        m = score_picks(dataset.subset(keys), shipped_picks.loc[keys])
        print(f"  {model:<14} {m.within_3pct:.3f} ({m.n_problems} problems)")

    first, second = (build_dataset(frame_from_records(half_medians(records, h))) for h in (0, 1))
    fastest_first = pd.Series(first.times.idxmin(axis=1), index=first.keys)
    ceiling = score_picks(second.subset(first.keys), fastest_first)
    print(
        f"shipped, held-out models: within 3% on {scores['pairwise, scale-free (shipped)'].within_3pct:.1%}"
    )
    print(
        f"noise ceiling (fastest of half the rounds, scored on the other half): "
        f"within 3% on {ceiling.within_3pct:.1%}"
    )


if __name__ == "__main__":
    main()
