#!/usr/bin/env python3
"""Make a card's shipped Gluon GEMM picks (`schedules/<card>/gluon_gemm_picks.json`, read by
`ficco.kernels.gluon_configs.shipped_picks`) from `scripts/bench_gluon_gemm.py` runs of one card.

A bf16 shape is picked when, in every run given that measured it (at least `MIN_RUNS`: runs
of bench_gemm's shapes and of the decode set can be given together), the Gluon kernel's pick
ran faster than ficco's Triton kernel (by at least `PICK_MARGIN`) in the same interleaved
rounds (both checked against an fp32 product first); the configuration is the last such
run's pick. Keys are the tuning cache's (card, Triton version, dtype, shape, SM budget), so
only the card and Triton that measured them match. An existing file is not replaced without
--replace.

    python scripts/gluon_picks_from_bench.py RUN.json [RUN2.json ...] --out FILE [--replace]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.kernels.gluon_configs import (  # noqa: E402
    BF16_CONFIGS,
    PICK_MARGIN,
    PICKS_FORMAT,
    config_to_dict,
)
from ficco.kernels.tuning import TuningKey  # noqa: E402

#: the runs a shape must have been measured in to be picked
MIN_RUNS = 2


def key_of(env: dict, m: int, n: int, k: int) -> str:
    """The tuning cache's key of a bf16 shape measured in ``env`` (a bench fingerprint)."""
    return str(TuningKey(env["gpu"], env["triton"], "bfloat16", m, n, k, env["sm_count"]))


def picks(runs: list[dict]) -> tuple[dict, dict]:
    envs = {(r["environment"]["gpu"], r["environment"]["triton"]) for r in runs}
    if len(envs) != 1:
        raise SystemExit(f"runs of different cards or Tritons: {sorted(envs)}")
    by_name = {c.name: c for c in BF16_CONFIGS}
    per_run = []
    for run in runs:
        rows = {}
        for row in run["rows"]:
            if row.get("dtype") == "bf16":
                rows[(row["M"], row["N"], row["K"])] = row
        per_run.append(rows)
    shapes = sorted({shape for rows in per_run for shape in rows})
    chosen, stats = {}, {"shapes": len(shapes), "picked": 0}
    env = runs[-1]["environment"]
    for shape in shapes:
        # every run that measured the shape (runs of other sets did not), at least two; a
        # run where either kernel was not timed there (failed, wrong) rules the shape out
        rows = [r[shape] for r in per_run if shape in r]
        timed = all("gluon" in r.get("ms", {}) and "triton" in r.get("ms", {}) for r in rows)
        if len(rows) < MIN_RUNS or not timed:
            continue
        last = rows[-1]
        gains = [r["ms"]["triton"] / r["ms"]["gluon"] for r in rows]
        if min(gains) < 1 + PICK_MARGIN or last["pick"] not in by_name:
            continue
        chosen[key_of(env, *shape)] = {
            "config": config_to_dict(by_name[last["pick"]]),
            "gluon_ms": last["ms"]["gluon"],
            "triton_ms": last["ms"]["triton"],
            "cublas_ms": last["ms"].get("library"),
            "triton_over_gluon_per_run": [round(g, 4) for g in gains],
        }
    stats["picked"] = len(chosen)
    return chosen, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench_gluon_gemm.py JSON, one card")
    ap.add_argument("--out", type=Path, required=True, help="the picks file to write")
    ap.add_argument("--replace", action="store_true", help="replace an existing picks file")
    args = ap.parse_args()
    if args.out.exists() and not args.replace:
        print(f"{args.out} exists: pass --replace to write over it", file=sys.stderr)
        return 2
    runs = [json.loads(p.read_text()) for p in args.runs]
    chosen, stats = picks(runs)
    doc = {
        "format": PICKS_FORMAT,
        "rule": "bf16 shapes where the Gluon kernel's time was at most the Triton kernel's "
        f"/ (1 + margin) in every run below that measured them, at least {MIN_RUNS}",
        "runs": [str(p) for p in args.runs],
        "margin": PICK_MARGIN,
        "picks": chosen,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {stats['picked']} of {stats['shapes']} shapes picked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
