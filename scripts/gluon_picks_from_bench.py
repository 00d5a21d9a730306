#!/usr/bin/env python3
"""Make a card's shipped Gluon GEMM picks (`schedules/<card>/gluon_gemm_picks.json`, read by
`ficco.kernels.gluon_configs.shipped_picks`) from `scripts/bench_gluon_gemm.py` runs of one card.

A shape is picked (per dtype: bf16 for `matmul`, fp8 for `scaled_matmul`) when, in every run
given that measured it (at least `MIN_RUNS`: runs
of bench_gemm's shapes and of the decode set can be given together), the Gluon kernel's pick
ran faster than ficco's Triton kernel (by at least `PICK_MARGIN`) in the same interleaved
rounds (both checked against an fp32 product first); the configuration is the last such
run's pick (`--config-from last`, the rule of the shipped files), or (`--config-from all`) the
one ranked fastest over every run: the lowest geomean of its ranking-round median over that
run's fastest, among the configurations ranked in every run. Keys are the tuning cache's (card, Triton version, dtype, shape, SM budget), so
only the card and Triton that measured them match. An existing file is not replaced without
--replace.

    python scripts/gluon_picks_from_bench.py RUN.json [RUN2.json ...] --out FILE [--replace]
        [--judge OTHER_RUN.json]

``--judge`` prints the picks judged on a run they were not made from: per shape of that
run, cuBLAS's time over the time the picks would give (the picked configuration's median in
the run's ranking rounds, else the Triton kernel's), as a geomean, overall and by M. A derived
figure (ranking and final rounds differ), not a measurement of `matmul`; without --out it
only judges.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.dtypes import dtype_of  # noqa: E402
from ficco.kernels.gluon_configs import (  # noqa: E402
    BF16_CONFIGS,
    FP8_CONFIGS,
    PICK_MARGIN,
    PICKS_FORMAT,
    GluonGemmConfig,
    config_to_dict,
)
from ficco.kernels.tuning import TuningKey  # noqa: E402

#: the runs a shape must have been measured in to be picked
MIN_RUNS = 2


#: a bench row's dtype -> (the tuning cache's dtype name: torch's, the Gluon space it was
#: ranked in); bench_gluon_gemm's fp8 is e4m3
DTYPES = {
    "bf16": (dtype_of("bf16").torch_name, BF16_CONFIGS),
    "fp8": (dtype_of("fp8_e4m3").torch_name, FP8_CONFIGS),
}


def key_of(env: dict, m: int, n: int, k: int, dtype: str = "bf16") -> str:
    """The tuning cache's key of a shape measured in ``env`` (a bench fingerprint)."""
    name = DTYPES[dtype][0]
    return str(TuningKey(env["gpu"], env["triton"], name, m, n, k, env["sm_count"]))


#: where a picked shape's configuration comes from (`picks`)
CONFIG_FROM = ("last", "all")


def fastest_over_runs(rows: list[dict]) -> str | None:
    """The configuration ranked fastest over ``rows`` (one shape's bench rows, one a run):
    the lowest geomean of its ranking-round median over that run's fastest, among those
    ranked in every run; None where no configuration was."""
    ranked = [r.get("rank_ms") or {} for r in rows]
    common = set.intersection(*(set(ms) for ms in ranked)) if ranked else set()
    if not common:
        return None

    def score(name: str) -> float:
        return sum(math.log(ms[name] / min(ms.values())) for ms in ranked)

    return min(sorted(common), key=score)


def check_config_dtypes(config_dtypes: tuple[str, ...] | None) -> None:
    """ValueError where ``config_dtypes`` (None: every dtype) names none or one not picked
    here."""
    if config_dtypes is None:
        return
    unknown = sorted(set(config_dtypes) - set(DTYPES))
    if unknown or not config_dtypes:
        raise ValueError(f"config_dtypes: {unknown or 'none'} (one or more of {sorted(DTYPES)})")


def picks(
    runs: list[dict],
    min_runs: int = MIN_RUNS,
    config_from: str = "last",
    config_dtypes: tuple[str, ...] | None = None,
) -> tuple[dict, dict]:
    """``config_dtypes``: the dtypes ``config_from`` applies to (None: every one); the others
    take the last run's pick, so a file can take FP8's configurations over all the runs and
    keep bf16's as they were measured."""
    if config_from not in CONFIG_FROM:
        raise ValueError(f"config_from: one of {CONFIG_FROM}, got {config_from!r}")
    check_config_dtypes(config_dtypes)
    envs = {(r["environment"]["gpu"], r["environment"]["triton"]) for r in runs}
    if len(envs) != 1:
        raise SystemExit(f"runs of different cards or Tritons: {sorted(envs)}")
    by_name = {dtype: {c.name: c for c in space} for dtype, (_, space) in DTYPES.items()}
    per_run = []
    for run in runs:
        rows = {}
        for row in run["rows"]:
            if row.get("dtype") in DTYPES:
                rows[(row["dtype"], row["M"], row["N"], row["K"])] = row
        per_run.append(rows)
    shapes = sorted({shape for rows in per_run for shape in rows})
    chosen, stats = {}, {"shapes": len(shapes), "picked": 0}
    env = runs[-1]["environment"]
    for shape in shapes:
        # every run that measured the shape (runs of other sets did not), at least two; a
        # run where either kernel was not timed there (failed, wrong) rules the shape out
        rows = [r[shape] for r in per_run if shape in r]
        timed = all("gluon" in r.get("ms", {}) and "triton" in r.get("ms", {}) for r in rows)
        if len(rows) < min_runs or not timed:
            continue
        last = rows[-1]
        gains = [r["ms"]["triton"] / r["ms"]["gluon"] for r in rows]
        dtype, m, n, k = shape
        over_all = config_from == "all" and (config_dtypes is None or dtype in config_dtypes)
        name = fastest_over_runs(rows) if over_all else last["pick"]
        if min(gains) < 1 + PICK_MARGIN or name not in by_name[dtype]:
            continue
        chosen[key_of(env, m, n, k, dtype)] = {
            "config": config_to_dict(by_name[dtype][name]),
            "gluon_ms": last["ms"]["gluon"],
            "triton_ms": last["ms"]["triton"],
            "cublas_ms": last["ms"].get("library"),
            "triton_over_gluon_per_run": [round(g, 4) for g in gains],
        }
        if over_all:
            chosen[key_of(env, m, n, k, dtype)]["rank_ms_per_run"] = [
                r["rank_ms"][name] for r in rows
            ]
    stats["picked"] = len(chosen)
    return chosen, stats


def judge(chosen: dict, run: dict, dtype: str = "bf16") -> dict:
    """``chosen`` (picks) on ``run``: the library's ms / the picks' ms per shape of ``dtype``
    (see the module's --judge), geomean, lowest and shapes below 0.90, overall and by M."""
    env = run["environment"]
    ratios: dict[int, list[float]] = {}
    for row in run["rows"]:
        if row.get("dtype") != dtype or "library" not in row.get("ms", {}):
            continue
        pick = chosen.get(key_of(env, row["M"], row["N"], row["K"], dtype))
        ms = None
        if pick is not None:
            ms = row.get("rank_ms", {}).get(GluonGemmConfig(**pick["config"]).name)
        ms = ms if ms is not None else row["ms"].get("triton")
        if ms:
            ratios.setdefault(row["M"], []).append(row["ms"]["library"] / ms)

    def summary(xs: list[float]) -> dict:
        return {
            "shapes": len(xs),
            "geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4),
            "lowest": round(min(xs), 3),
            "below_0.90": sum(x < 0.90 for x in xs),
        }

    every = [x for xs in ratios.values() for x in xs]
    if not every:
        return {"shapes": 0}
    return {**summary(every), "by_m": {str(m): summary(ratios[m]) for m in sorted(ratios)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench_gluon_gemm.py JSON, one card")
    ap.add_argument("--out", type=Path, help="the picks file to write")
    ap.add_argument("--replace", action="store_true", help="replace an existing picks file")
    ap.add_argument("--judge", type=Path, help="a run the picks were not made from: judge them")
    ap.add_argument(
        "--min-runs",
        type=int,
        default=MIN_RUNS,
        help=f"runs a shape must have been measured in (default {MIN_RUNS}; 1 to judge one run's "
        "picks on another, never for a shipped file)",
    )
    ap.add_argument(
        "--config-from",
        choices=CONFIG_FROM,
        default="last",
        help="a picked shape's configuration: the last run's pick (default; the shipped files) "
        "or the one ranked fastest over all the runs",
    )
    ap.add_argument(
        "--config-from-dtypes",
        default=None,
        help="comma list of the dtypes --config-from all applies to (bf16, fp8; default every "
        "one): the others take the last run's pick",
    )
    args = ap.parse_args(argv)
    config_dtypes = None
    if args.config_from_dtypes is not None:
        config_dtypes = tuple(d.strip() for d in args.config_from_dtypes.split(",") if d.strip())
        try:
            check_config_dtypes(config_dtypes)
        except ValueError as exc:
            ap.error(f"--{exc}".replace("config_dtypes", "config-from-dtypes", 1))
        if args.config_from != "all":
            ap.error("--config-from-dtypes takes --config-from all")
    if args.min_runs < 1:
        ap.error(f"--min-runs: at least 1, got {args.min_runs}")
    if args.out is not None and args.min_runs < MIN_RUNS:
        ap.error(f"--min-runs below {MIN_RUNS} only judges (no --out): picks stand on two runs")
    if args.out is None and args.judge is None:
        ap.error("give --out (write the picks), --judge (judge them), or both")
    if args.judge is not None and args.judge in args.runs:
        ap.error(f"--judge: {args.judge} is one of the runs the picks are made from")
    if args.out is not None and args.out.exists() and not args.replace:
        print(f"{args.out} exists: pass --replace to write over it", file=sys.stderr)
        return 2
    runs = [json.loads(p.read_text()) for p in args.runs]
    chosen, stats = picks(runs, args.min_runs, args.config_from, config_dtypes)
    doc = {
        "format": PICKS_FORMAT,
        "rule": "shapes where the Gluon kernel's time was at most the Triton kernel's "
        f"/ (1 + margin) in every run below that measured them, at least {args.min_runs}"
        + (
            ""
            if args.config_from == "last"
            else "; the configuration ranked fastest over them"
            + (f" ({', '.join(config_dtypes)}; else the last run's pick)" if config_dtypes else "")
        ),
        "runs": [str(p) for p in args.runs],
        "margin": PICK_MARGIN,
        "picks": chosen,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{args.out}: {stats['picked']} of {stats['shapes']} shapes picked")
    if args.judge is not None:
        judged = json.loads(args.judge.read_text())
        # bf16 at the top level; FP8, where the run has it, under "fp8"
        doc = {"judged_on": str(args.judge), **judge(chosen, judged)}
        if any(row.get("dtype") == "fp8" for row in judged["rows"]):
            doc["fp8"] = judge(chosen, judged, "fp8")
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
