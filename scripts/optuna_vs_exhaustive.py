"""How close does the optuna strategy get to the exhaustive best, for how many trials?

Replays a profile store (an exhaustive sweep) through ``ReplayRunner``: for every problem the
optuna strategy may measure at most ``--fraction`` (default 30%) of the schedules the store
holds for it, and its best is compared with the store's best. Nothing runs on a GPU: the
replayed medians stand in for measurements, so the comparison is exactly as noisy as the
store. Prints one row per problem, then last the two figures:

    within 2% of the exhaustive best: <share of problems>
    trials used: <measured schedules as a share of the exhaustive sweep's>

Usage: python scripts/optuna_vs_exhaustive.py --store profiles/h200x2
"""

from __future__ import annotations

import argparse
import math

from ficco.profile import MemoryStore
from ficco.sweep import ReplayRunner, SweepOptions, candidates, ranked, sweep


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="profile store of an exhaustive sweep")
    parser.add_argument(
        "--fraction", type=float, default=0.3, help="most trials per problem, as a share"
    )
    parser.add_argument("--within", type=float, default=0.02, help="tolerance on the best")
    parser.add_argument("--batch", type=int, default=1, help="trials asked per runner call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    runner = ReplayRunner(args.store)
    store = runner.source
    hits = total_trials = total_exhaustive = compared = 0
    print(f"{'problem':<44} {'cands':>5} {'trials':>6} {'exhaustive ms':>13} {'optuna ms':>10}")
    for problem in runner.problems():
        n = len(candidates(problem, None, runner, None))
        exhaustive = ranked(store.measurements(problem.key))
        if not n or not exhaustive:
            continue
        trials = max(1, math.floor(args.fraction * n))
        before = runner.calls
        result = sweep(
            [problem],
            runner=runner,
            store=MemoryStore(runner.fingerprint()),
            strategy="optuna",
            options=SweepOptions(trials=trials, batch=args.batch, seed=args.seed),
        )
        used = runner.calls - before
        best = result.outcomes[0].best
        target = exhaustive[0].median_ms
        found = best.median_ms if best else math.inf
        hit = found <= target * (1 + args.within)
        hits += hit
        compared += 1
        total_trials += used
        total_exhaustive += n
        label = f"{problem.name or problem.pattern} m={problem.m}"
        print(
            f"{label:<44} {n:>5} {used:>6} {target:>13.4f} {found:>10.4f}"
            f"{'' if hit else '  (missed)'}"
        )
    if not compared:
        raise SystemExit(f"{args.store}: no problem with a correct schedule to compare")
    print(
        f"within {args.within:.0%} of the exhaustive best: {hits}/{compared} problems "
        f"= {hits / compared:.1%}"
    )
    print(
        f"trials used: {total_trials}/{total_exhaustive} = {total_trials / total_exhaustive:.1%} "
        "of exhaustive"
    )


if __name__ == "__main__":
    main()
