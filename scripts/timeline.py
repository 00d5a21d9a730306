"""Timelines of one shape per pattern on W GPUs: where each schedule's time goes, as a picture.

    python scripts/timeline.py --world 2 [--model llama3-70b --tokens 8192] [--out DIR]
    python scripts/timeline.py --from-json DIR/timeline.json --out DIR   # redraw, no GPU

For the ag_gemm and gemm_rs problems of one model's layer at one token count (the first of
each pattern in the catalog's order), every schedule of ``--schedules`` that is legal is
verified, timed (``--rounds``, queued issue, CUDA graphs as ``bench_overlap.py`` does) and
its signature pass records one held run's per-task GPU spans (``TimingOptions(timeline=
True)``, ``ficco.measure.timeline``). Writes ``timeline.json`` (spans, breakdowns, the
baselines, the environment fingerprint) and ``timeline.png``: one panel per (problem,
schedule), lanes (compute, comm, signal) against time, the ideal ``max(GEMM alone,
collective alone)`` as a dashed line, and the makespan split into exposed communication
before the first GEMM (head), the GEMMs, the compute stream's stalls between them, and the
tail after the last GEMM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from ficco.measure.timeline import breakdown, check_timeline, plot  # noqa: E402

DEFAULT_SCHEDULES = (
    "serial/nccl/cublas",
    "shard/ce/cublas+hi",
    "finer-c4-m/ce/cublas+hi",
    "finer-c4-m/ce/triton+fused",
    "shard/nccl/cublas",
)


def rows_of(report: dict) -> list[dict]:
    """The drawing's rows: every schedule with a timeline, problem by problem."""
    rows = []
    for shape in report["shapes"]:
        for entry in shape["schedules"]:
            if entry.get("timeline"):
                rows.append(
                    {
                        "title": f"{shape['problem_key']} {entry['schedule']}",
                        "timeline": entry["timeline"],
                        "ideal_ms": shape.get("ideal_ms"),
                        "gemm_alone_ms": shape.get("gemm_alone_ms"),
                    }
                )
    return rows


def shape_report(problem, measured) -> dict:
    """One problem's schedules (median, verdict, timeline, its breakdown) and baselines."""
    ok = {m.name: m for m in measured if m.verdict == "ok"}
    gemm_alone = ok["gemm_alone"].median_ms if "gemm_alone" in ok else math.nan
    comm_alone = ok["comm_alone"].median_ms if "comm_alone" in ok else math.nan
    schedules = []
    for m in measured:
        if m.kind != "schedule":
            continue
        timeline = m.extra.get("timeline")
        entry = {"schedule": m.name, "verdict": m.verdict, "median_ms": m.median_ms}
        if timeline is not None:
            entry["timeline"] = check_timeline(timeline, where=f"{m.name} timeline")
            entry["breakdown"] = breakdown(timeline).to_dict()
        schedules.append(entry)
    return {
        "problem_key": problem.key,
        "problem": problem.to_dict(),
        "gemm_alone_ms": gemm_alone,
        "comm_alone_ms": comm_alone,
        "ideal_ms": max(gemm_alone, comm_alone),
        "schedules": schedules,
    }


def measure(args) -> dict:
    import dataclasses

    from bench_overlap import run_suite

    from ficco.execute import TimingOptions
    from ficco.execute.run import check_gpus
    from ficco.measure.fingerprint import fingerprint
    from ficco.space import Schedule, is_legal
    from ficco.workloads import ParallelSetup, get_model, model_problems

    check_gpus(args.world)
    setup = ParallelSetup(world=args.world, tokens=(args.tokens,))
    jobs = []
    for pattern in ("ag_gemm", "gemm_rs"):
        problem = next(
            p for p in model_problems(get_model(args.model), setup)[0] if p.pattern.value == pattern
        )
        schedules = [Schedule.parse(s) for s in args.schedules]
        jobs.append((problem, [s for s in schedules if is_legal(problem, s)]))
    opts = TimingOptions(
        rounds=args.rounds, signatures=True, timeline=True, graphs="all", issue=("queued",)
    )
    started = time.time()

    def progress(index, msg):
        print(
            f"  [{time.time() - started:6.1f}s] {jobs[index][0].key} {msg.get('phase')} "
            f"{msg.get('name')}",
            flush=True,
        )

    results, _ = run_suite(jobs, opts, args.world, 120.0, progress, lambda *a: None)
    shapes = []
    for (problem, _), measured in zip(jobs, results, strict=True):
        if isinstance(measured, str):
            shapes.append({"problem_key": problem.key, "error": measured, "schedules": []})
            continue
        shapes.append(shape_report(problem, measured))
    return {
        "script": "scripts/timeline.py",
        "fingerprint": fingerprint("cuda"),
        "options": dataclasses.asdict(opts) | {"model": args.model, "tokens": args.tokens},
        "shapes": shapes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--schedules", nargs="+", default=list(DEFAULT_SCHEDULES))
    parser.add_argument("--from-json", help="redraw from a timeline.json (no GPU)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder")
    args = parser.parse_args()
    out = Path(args.out)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
    else:
        report = measure(args)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timeline.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = rows_of(report)
    for row in rows:
        parts = breakdown(row["timeline"])
        print(
            f"{row['title']}: {parts.makespan_ms:.3f} ms = head {parts.head_ms:.3f} + GEMM "
            f"{parts.gemm_ms:.3f} + stalls {parts.stall_ms:.3f} + tail {parts.tail_ms:.3f} "
            f"(ideal {row['ideal_ms']:.3f})"
        )
    print(plot(rows, out / "timeline.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
