#!/usr/bin/env python3
"""One family of configs against another in a GEMM tuning cache's records: per record (one
shape's tuning, every candidate timed in the tuner's interleaved rounds), the fastest config
whose name matches ``--match`` over the fastest of the others (or of those matching
``--against``). Ratios above 1: the matched family is slower.

    python scripts/tuning_records_compare.py RAW_CACHE --match REGEX [--against REGEX]

RAW_CACHE is a run's ``$FICCO_CACHE_DIR/gemm_tuning.json``, e.g. the committed
``profiles/h200/gemm_tuning_raw_callF.json``. Prints each compared record's ratio (fastest
first), then the count, the median and how many records the matched family won.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def compare(entries: dict, match: str, against: str | None = None) -> list[tuple[float, str]]:
    """``(fastest matched / fastest other, record key)`` for every record that timed both
    families, the fastest ratio first (fused tuning records left out)."""
    mine, theirs = re.compile(match), re.compile(against) if against else None
    out = []
    for key, entry in entries.items():
        if "|fused|" in key:
            continue
        times = entry.get("timings_ms") or {}
        matched = [ms for name, ms in times.items() if mine.search(name)]
        others = [
            ms
            for name, ms in times.items()
            if not mine.search(name) and (theirs is None or theirs.search(name))
        ]
        if matched and others:
            out.append((min(matched) / min(others), key))
    return sorted(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="a run's gemm_tuning.json")
    parser.add_argument("--match", required=True, help="regex on config names: the family")
    parser.add_argument("--against", help="regex: compare with these only (default: the rest)")
    args = parser.parse_args(argv)
    try:
        entries = json.loads(args.raw.read_text())["entries"]
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"{args.raw}: not a tuning cache ({err})") from None
    rows = compare(entries, args.match, args.against)
    if not rows:
        raise SystemExit(f"no record of {args.raw} timed both families")
    for ratio, key in rows:
        print(f"{ratio:.3f}  {key}")
    ratios = [r for r, _ in rows]
    wins = sum(r < 1 for r in ratios)
    print(f"records {len(rows)}  min {ratios[0]:.3f}  median {statistics.median(ratios):.3f}")
    print(f"matched family fastest in {wins} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
