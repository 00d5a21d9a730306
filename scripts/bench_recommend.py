"""Time one ``ficco.recommend`` lookup from an exported table (target: <= 50 us in Python).

Protocol: load the table once (the first call reads and validates the file; it is cached
while the file is unchanged), build a fixed set of problems inside and outside the table's
training ranges, then for ``--rounds`` rounds time ``--lookups`` calls cycling through them with
``time.perf_counter_ns`` and take the median over rounds of the per-call mean. The stdlib
lookup alone (``Table.lookup``, what a runtime copying ``ficco/export/lookup*.py`` pays) is timed
the same way. The last line printed is the result, with the environment fingerprint.

    python scripts/bench_recommend.py                       # schedules/h200x2/table.json
    python scripts/bench_recommend.py --table path/to/table.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import ficco
from ficco.export.lookup import load_table
from ficco.export.recommend import DEFAULT_MACHINE, TableNotFound, open_table, table_path

TARGET_US = 50.0


def bench_problems(table) -> list[ficco.Problem]:
    """Problems at the ends and middle of every training range, and one outside each."""
    out = []
    for r in table.data["range"]:
        w = r["world"]
        experts = r["experts"][0] if "experts" in r else None
        for frac in (0.0, 0.5, 1.0):
            m = int(r["m"][0] + frac * (r["m"][1] - r["m"][0])) // w * w or w
            n = int(r["n"][0] + frac * (r["n"][1] - r["n"][0]))
            k = int(r["k"][0] + frac * (r["k"][1] - r["k"][0]))
            out.append(
                ficco.Problem(
                    pattern=r["pattern"], m=m, n=n, k=k, world=w, dtype=r["dtype"], experts=experts
                )
            )
        out.append(
            ficco.Problem(
                pattern=r["pattern"],
                m=r["m"][1] * 4 // w * w,
                n=r["n"][0],
                k=r["k"][0],
                world=w,
                dtype=r["dtype"],
                experts=experts,
            )
        )
    return out


def time_calls(fn, args: list, lookups: int, rounds: int) -> float:
    """Median over rounds of the mean microseconds per call."""
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for i in range(lookups):
            fn(args[i % len(args)])
        per_call.append((time.perf_counter_ns() - start) / lookups / 1000)
    return statistics.median(per_call)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default=DEFAULT_MACHINE)
    parser.add_argument("--table", default=None, help="table file [default: the machine's]")
    parser.add_argument("--lookups", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    path = args.table or str(table_path(args.machine))
    try:
        open_table(args.machine, args.table)
    except TableNotFound as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table = load_table(path)
    problems = bench_problems(table)
    for p in problems:
        ficco.recommend(p, args.machine, table=args.table)  # warm caches

    def via_recommend(p):
        return ficco.recommend(p, args.machine, table=args.table)

    def via_lookup(p):
        return table.lookup(p.pattern.value, p.m, p.n, p.k, p.world, p.dtype, p.experts)

    lookup_us = time_calls(via_lookup, problems, args.lookups, args.rounds)
    recommend_us = time_calls(via_recommend, problems, args.lookups, args.rounds)
    print(f"stdlib Table.lookup: {lookup_us:.2f} us per call")

    from ficco.measure.fingerprint import fingerprint

    host = fingerprint(backend="cpu")
    keep = ("host_cpu", "python", "ficco", "git_commit")
    print(
        f"recommend: {recommend_us:.2f} us per call (median of {args.rounds} rounds x "
        f"{args.lookups} calls over {len(problems)} problems; target <= {TARGET_US:.0f} us; "
        f"{'ok' if recommend_us <= TARGET_US else 'SLOWER THAN TARGET'}) | table {path} "
        f"(machine {table.machine}, fingerprints {table.data.get('fingerprints', [])}) | "
        f"fingerprint {json.dumps({k: host.get(k) for k in keep})}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
