"""AG+GEMM and GEMM+RS on W GPUs: ficco's schedules against every baseline, in one run.

Protocol (ficco/execute/timing.py, measure.py and cuda.py state it in full): every candidate is verified against an
fp32 reference before it is timed; candidates are timed in interleaved rounds with the L2
flushed and the ranks aligned by a device-side barrier before each iteration; per iteration
the max across ranks; median and p90-p10 spread. Each shape is timed under both issue modes
(``--issue``): ``synced`` (the host waits for its GPU and the ranks meet at a host barrier
before each iteration, so launch and Python issue cost count, as in a host-bound step) and
``queued`` (the host runs ahead, so issue cost hides behind GPU work). The top-level
``summary`` and ``shapes`` are the first mode's; ``by_issue`` holds every mode's.

Baselines, side by side: serial NCCL + cuBLAS issued the eager way (``serial_eager``), ficco's
own serial schedules (``serial/nccl/cublas``, ``serial/nccl/triton``), PyTorch async-TP
(``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``), NCCL copy-engine collectives
where the build has them (``serial/nccl_ce/cublas``), and ``ideal`` = max(isolated cuBLAS
GEMM, isolated NCCL collective).

``--dtype fp8_e4m3`` (or ``fp8_e5m2``) makes every problem FP8, its A and B scaled per row and
per column as runtimes quantize them (``--a-scale`` / ``--b-scale`` for per-tensor scales):
the schedules run ficco's scaled GEMMs, and the baselines are the executor's FP8 ones
(``ficco.execute.scaled_baselines``: serial NCCL + ``torch._scaled_mm``, async-TP's
``fused_all_gather_scaled_matmul`` / ``fused_scaled_matmul_reduce_scatter`` where the torch
has them). ``--dry-run`` prices FP8 with the cost model's uncalibrated FP8 roof
(``ficco.model.fp8``).

Summary per pattern: ``best_vs_serial_geomean`` (serial_eager / best), ``best_vs_asynctp_geomean``
(async-TP / best), ``best_vs_ideal_geomean`` (best / ideal: lower is better), ``serial_wins``
(shapes where no overlapped schedule beats serial_eager), ``asynctp_wins`` (shapes where
async-TP beats ficco's best), ``relay_best`` (shapes whose best is a relay schedule) and
``best_relay_vs_ideal_geomean``. "best" is the oracle: the fastest verified ficco schedule of
the shape. Differences inside the spread are noise.

Usage (W GPUs): python scripts/bench_overlap.py [--world W] [--quick] [--dtype D] [--out FILE]
Writes $OUT/bench_overlap.json when $OUT is set. ``--dry-run`` needs no GPU: every candidate
of every shape is checked legal and lowered on every rank, and the cost model's predictions
(``ficco.model``, the smallest shipped machine of W or more GPUs) stand in for the timings (async-TP has no model: its
column is NaN), through the same summary; the JSON says ``"dry_run": true``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ficco.execute.pool import PoolFailure  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import RELAYS, Compute, Schedule  # noqa: E402
from ficco.verdict import Verdict  # noqa: E402

#: The suite: the tensor-parallel layers of these models (ficco.workloads), AG+GEMM (QKV, FC1)
#: and GEMM+RS (out-proj, FC2), at any W. At W = 2 these are the shapes of FACTS.md's table.
MODELS = ("llama3-8b", "llama3-70b")
PATTERNS = ("ag_gemm", "gemm_rs")
TOKENS = (1024, 2048, 4096, 8192, 16384)

#: The candidates of both patterns; those illegal for a problem (``is_legal``: NCCL's
#: copy-engine policy has no reduction, ``all_peers`` needs W >= 3) are dropped per problem.
CANDIDATES = [
    "serial/nccl/cublas",
    "serial/nccl/triton",
    "serial/ce/cublas",
    "serial/nccl_ce/cublas",  # AG+GEMM only; unavailable unless FICCO_NCCL_CE=1
    "shard/ce/cublas",
    "shard/ce/cublas+hi",
    "shard/ce/triton",
    "shard/ce/triton+hi",
    "finer-c2-m/ce/cublas",
    "finer-c2-m/ce/cublas+hi",
    "finer-c4-m/ce/cublas",
    "finer-c4-m/ce/cublas+hi",
    "finer-c8-m/ce/cublas",
    "finer-c2-m/ce/cublas+merged",
    "finer-c4-m/ce/cublas+merged",
    "finer-c2-m/ce/triton",
    "finer-c2-m/ce/triton+hi",
    "finer-c4-m/ce/triton",
    "shard/nccl/cublas",
    "shard/nccl/triton+sm16",
    "finer-c2-m/nccl/triton+sm16",
    "shard/ce/cublas+all_peers",
    "finer-c2-m/ce/cublas+all_peers",
    # one persistent Triton GEMM per rank: tiles wait on per-chunk arrival flags (AG+GEMM),
    # or the epilogue stores into the owner's staging buffer and flags it (GEMM+RS)
    "shard/ce/triton+fused",
    "finer-c2-m/ce/triton+fused",
    "finer-c4-m/ce/triton+fused",
    # relay rings (ficco.plan.relay): one hop per step to a neighbour, each arriving partial
    # reduced while the next GEMM chunk runs (GEMM+RS), or each shard forwarded (AG+GEMM);
    # birelay sends half the chunks each way; epilogue (GEMM+RS) adds the received sum in the
    # GEMM itself; sm moves the hops with a Triton kernel on SMs instead of the copy engine
    "shard/ce/cublas+relay",
    "shard/ce/cublas+relay+hi",
    "finer-c2-m/ce/cublas+relay",
    "finer-c4-m/ce/cublas+relay",
    "finer-c2-m/ce/cublas+birelay",
    "finer-c4-m/ce/cublas+birelay",
    "shard/ce/cublas+epilogue+relay",
    "finer-c2-m/ce/cublas+epilogue+relay",
    "finer-c4-m/ce/cublas+epilogue+birelay",
    "shard/sm/cublas+relay",
    "finer-c2-m/sm/cublas+relay",
    "finer-c4-m/sm/cublas+birelay",
    "finer-c2-m/sm/cublas+epilogue+birelay",
    "finer-c2-m/sm/triton+relay+sm16",
]


def geomean(values: list[float]) -> float:
    values = [v for v in values if v and not math.isnan(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def under(measured, issue: str | None) -> list:
    """The measurements with their median and spread taken from one issue mode."""
    if issue is None:
        return list(measured)
    out = []
    for m in measured:
        timed = m.extra.get("issue", {}).get(issue)
        m = dataclasses.replace(m, extra=dict(m.extra))
        if timed is not None:
            m.median_ms, m.spread_ms, m.samples = (
                timed["median_ms"],
                timed["spread_ms"],
                timed["samples"],
            )
        out.append(m)
    return out


def shape_row(problem: Problem, measured) -> dict:
    by = {m.name: m for m in measured}
    ok = {m.name: m for m in measured if m.verdict == "ok"}
    sched = [m for m in measured if m.kind == "schedule" and m.verdict == "ok"]
    best = min(sched, key=lambda m: m.median_ms) if sched else None
    overlapped = [m for m in sched if not m.name.startswith("serial/")]
    best_overlap = min(overlapped, key=lambda m: m.median_ms) if overlapped else None
    relays = [m for m in sched if Schedule.parse(m.name).order in RELAYS]
    best_relay = min(relays, key=lambda m: m.median_ms) if relays else None

    def t(name):
        return ok[name].median_ms if name in ok else math.nan

    ideal = max(t("gemm_alone"), t("comm_alone"))
    serial = t("serial_eager")
    return {
        "name": problem.name,
        "problem": problem.to_dict(),
        "key": problem.key,
        "ideal_ms": ideal,
        "serial_ms": serial,
        "serial_graph_ms": t("serial_graph"),
        "async_tp_ms": t("async_tp"),
        "best": best.name if best else None,
        "best_ms": best.median_ms if best else math.nan,
        "best_spread_ms": best.spread_ms if best else math.nan,
        "best_overlapped": best_overlap.name if best_overlap else None,
        "best_overlapped_ms": best_overlap.median_ms if best_overlap else math.nan,
        "best_vs_serial": serial / best.median_ms if best else math.nan,
        "best_vs_serial_graph": t("serial_graph") / best.median_ms if best else math.nan,
        "best_vs_asynctp": t("async_tp") / best.median_ms if best else math.nan,
        "best_vs_ideal": best.median_ms / ideal if best else math.nan,
        "serial_wins": bool(best_overlap is None or best_overlap.median_ms >= serial),
        # NaN (no async-TP measured) compares False: never counted as a win
        "asynctp_wins": bool(best is None or t("async_tp") < best.median_ms),
        "best_relay": best_relay.name if best_relay else None,
        "best_relay_ms": best_relay.median_ms if best_relay else math.nan,
        "best_relay_vs_ideal": best_relay.median_ms / ideal if best_relay else math.nan,
        "candidates": {
            name: {
                "kind": m.kind,
                "verdict": m.verdict,
                "median_ms": m.median_ms,
                "spread_ms": m.spread_ms,
                "samples": m.samples,
                "max_abs_err": m.max_abs_err,
                "tolerance": m.tolerance,
                "detail": m.detail,
                "graph": m.extra.get("graph", "eager"),
            }
            for name, m in by.items()
        },
    }


def summarize(rows: list[dict]) -> dict:
    out = {}
    for pattern in sorted({r["problem"]["pattern"] for r in rows}):
        mine = [r for r in rows if r["problem"]["pattern"] == pattern]
        if not mine:
            continue
        rel_spread = [
            r["best_spread_ms"] / r["best_ms"] for r in mine if r["best_ms"] == r["best_ms"]
        ]
        out[pattern] = {
            "shapes": len(mine),
            "best_vs_serial_geomean": geomean([r["best_vs_serial"] for r in mine]),
            "best_vs_asynctp_geomean": geomean([r["best_vs_asynctp"] for r in mine]),
            "best_vs_serial_graph_geomean": geomean([r["best_vs_serial_graph"] for r in mine]),
            "best_vs_ideal_geomean": geomean([r["best_vs_ideal"] for r in mine]),
            "serial_wins": sum(r["serial_wins"] for r in mine),
            "asynctp_wins": sum(r["asynctp_wins"] for r in mine),
            "relay_best": sum(
                r["best"] is not None and Schedule.parse(r["best"]).order in RELAYS for r in mine
            ),
            "best_relay_vs_ideal_geomean": geomean([r["best_relay_vs_ideal"] for r in mine]),
            "incorrect": sum(
                c["verdict"] == "incorrect" for r in mine for c in r["candidates"].values()
            ),
            "median_relative_spread_of_best": sorted(rel_spread)[len(rel_spread) // 2]
            if rel_spread
            else math.nan,
            "best_schedules": {
                name: sum(r["best"] == name for r in mine) for name in {r["best"] for r in mine}
            },
        }
    return out


def run_suite(jobs, opts, world: int, stall_timeout: float, progress, done):
    """Measure every (problem, schedules) job on one pool of ``world`` GPU ranks (set-up paid
    once). A problem that hangs with NCCL calls captured in graphs is retried once with
    copy-engine graphs only (``--graphs ce``), and the rest of the suite keeps that mode.
    Returns (results: measurements or a PoolFailure per job, graphs mode per job);
    ``done(index, measured, graphs)`` is called as each job completes."""
    from ficco.execute import RunOptions
    from ficco.execute.run import backend_pool, measure_in

    graphs = opts.graphs
    results: list = []
    graphs_of: dict[int, str] = {}
    pool_options = RunOptions(timeout_s=stall_timeout)
    pool = backend_pool("cuda", world, pool_options)
    try:
        for index, (problem, schedules) in enumerate(jobs):
            on_progress = lambda msg, i=index: progress(i, msg)  # noqa: E731
            res = measure_in(pool, problem, schedules, opts, on_progress)
            hung = isinstance(res, PoolFailure) and res.verdict is Verdict.TIMEOUT
            if hung and graphs == "all":
                print(
                    f"  {problem.name} m={problem.m}: {res}; retrying with --graphs ce", flush=True
                )
                pool.close(kill=True)
                graphs = "ce"
                opts = dataclasses.replace(opts, graphs=graphs)
                pool = backend_pool("cuda", world, pool_options)
                res = measure_in(pool, problem, schedules, opts, on_progress)
            graphs_of[index] = graphs
            results.append(res)
            if isinstance(res, PoolFailure):
                print(f"  {problem.name} m={problem.m}: FAILED {res}", flush=True)
            else:
                done(index, res, graphs)
    finally:
        pool.close()
    return results, graphs_of


def predicted(problem: Problem, schedules: list[Schedule], model) -> list:
    """Measurement-like rows of the cost model's predictions: the schedules, the GEMM and the
    collective alone, and serial_eager as ficco's serial NCCL schedule (async-TP: none)."""
    from types import SimpleNamespace

    from ficco.plan import build_plan

    for schedule in schedules:  # every rank's plan lowers (the executors' input)
        for rank in range(problem.world):
            build_plan(problem, schedule, rank)
    # fused GEMMs wait inside one kernel: the model has no cost for them (ficco.model.predict)
    priced = [s for s in schedules if s.compute is not Compute.FUSED]
    times = {t.schedule: t.ms for t in model.predict(problem, priced).times}
    gemm, comm = model.parts_ms(problem)

    def row(name: str, kind: str, ms: float, verdict: str = "ok", detail: str = "predicted"):
        return SimpleNamespace(
            name=name, kind=kind, verdict=verdict, median_ms=ms, spread_ms=0.0, samples=[],
            max_abs_err=0.0, tolerance=0.0, detail=detail, extra={},
        )  # fmt: skip

    rows = [row(name, "schedule", ms) for name, ms in times.items()]
    rows += [
        row(str(s), "schedule", math.nan, "unavailable", "the cost model has no fused GEMMs")
        for s in schedules
        if s not in priced
    ]
    serial = times.get("serial/nccl/cublas", math.nan)
    return rows + [
        row("gemm_alone", "baseline", gemm),
        row("comm_alone", "baseline", comm),
        row("serial_eager", "baseline", serial),
    ]


def dry_run(jobs, world: int, out: str, problem_dtype: dict) -> int:
    """The suite without a GPU: every candidate legal and lowered, predicted by the model."""
    from ficco.model.predict import predictor

    # the smallest shipped machine description with room for W ranks
    sizes = {"h200x2": 2, "h200x4": 4, "h200x8": 8, "h200x8n2": 16, "h200x8n4": 32, "h200x8n8": 64}
    fits = [name for name, gpus in sizes.items() if gpus >= world]
    if not fits:
        raise SystemExit(f"--world: no machine description holds {world} ranks (at most 64)")
    model = predictor(fits[0])
    if not jobs:
        print(f"no layer of {', '.join(MODELS)} shards over {world} ranks", flush=True)
    rows = []
    for problem, schedules in jobs:
        rows.append(shape_row(problem, predicted(problem, schedules, model)))
        r = rows[-1]
        print(
            f"{r['name']:14s} m={problem.m:<6d} {len(schedules):3d} candidates; predicted best "
            f"{r['best']} {r['best_ms']:.3f} ms, best relay {r['best_relay']} "
            f"{r['best_relay_ms']:.3f}, serial {r['serial_ms']:.3f}, ideal {r['ideal_ms']:.3f}",
            flush=True,
        )
    report = {
        "dry_run": True,
        "world": world,
        **problem_dtype,
        "summary": summarize(rows),
        "shapes": rows,
    }
    Path(out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps(report["summary"], indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, M 2048 and 8192, 5 rounds")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--signatures", action="store_true", help="also measure signatures")
    parser.add_argument(
        "--stall-timeout", type=float, default=120.0, help="seconds without progress = a hang"
    )
    parser.add_argument(
        "--graphs", choices=("all", "ce", "none"), default="all", help="CUDA-graph capture"
    )
    parser.add_argument(
        "--issue",
        action="append",
        choices=("synced", "queued"),
        help="issue mode(s), each timed in its own pass; the first fills 'summary' "
        "(default: synced, then queued)",
    )
    parser.add_argument("--out", default=None, help="output JSON (default $OUT/bench_overlap.json)")
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp8_e4m3", "fp8_e5m2"),
        default="bf16",
        help="the problems' input dtype (fp8: scaled inputs, bf16 outputs, FP8 baselines)",
    )
    parser.add_argument(
        "--a-scale",
        choices=("tensor", "row"),
        default=None,
        help="fp8 only: A's scales, per tensor or per row (default: row, as runtimes quantize)",
    )
    parser.add_argument(
        "--b-scale",
        choices=("tensor", "column"),
        default=None,
        help="fp8 only: B's scales, per tensor or per column (default: column)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: check and lower every candidate, and summarize the cost model's predictions",
    )
    args = parser.parse_args()
    if args.world < 2:
        parser.error(f"--world: must be >= 2, got {args.world}")
    scaled = args.dtype.startswith("fp8")
    if not scaled and (args.a_scale or args.b_scale):
        parser.error(f"--a-scale/--b-scale: only fp8 dtypes take scales, not {args.dtype}")
    # fp8: per-row A and per-column B unless told (what a runtime's dynamic quantization does)
    scales = {"a_scale": args.a_scale or "row", "b_scale": args.b_scale or "column"}
    problem_dtype = {"dtype": args.dtype, **(scales if scaled else {})}

    from ficco.execute import TimingOptions
    from ficco.execute.run import check_gpus
    from ficco.measure.fingerprint import fingerprint
    from ficco.space import is_legal
    from ficco.workloads import ParallelSetup, get_model, model_problems

    tokens = (2048, 8192) if args.quick else TOKENS
    setup = ParallelSetup(world=args.world, tokens=tokens, dtype=args.dtype)
    problems = [
        dataclasses.replace(p, **scales) if scaled else p
        for model in MODELS[: 1 if args.quick else None]
        for p in model_problems(get_model(model), setup)[0]
        if p.pattern.value in PATTERNS
    ]
    problems.sort(
        key=lambda p: (p.m, p.name)
    )  # small shapes first: a cut-short run covers all layers
    jobs = []
    for problem in problems:
        schedules = [Schedule.parse(s) for s in CANDIDATES]
        jobs.append((problem, [s for s in schedules if is_legal(problem, s)]))
    issues = tuple(args.issue or ("synced", "queued"))
    opts = TimingOptions(
        rounds=5 if args.quick else args.rounds,
        signatures=args.signatures,
        graphs=args.graphs,
        issue=issues,
    )
    started = time.time()

    def progress(index, msg):
        # the log is a file: every step, so a stall shows where it happened
        verdict = f" -> {msg['verdict']}" if msg.get("verdict") else ""
        print(
            f"    [{time.time() - started:6.1f}s] {jobs[index][0].name} m={jobs[index][0].m}: "
            f"{msg.get('phase')} {msg.get('name')}{verdict}",
            flush=True,
        )

    out = args.out or os.path.join(os.environ.get("OUT", "."), "bench_overlap.json")
    if args.dry_run:
        return dry_run(jobs, args.world, out, problem_dtype)
    partial: dict[int, dict] = {}
    graphs_of: dict[int, str] = {}

    def done(index, measured, graphs):
        graphs_of[index] = graphs
        p = jobs[index][0]
        partial[index] = {
            issue: shape_row(p, under(measured, issue)) | {"graphs": graphs_of.get(index)}
            for issue in issues
        }
        for issue, best in partial[index].items():
            print(
                f"[{time.time() - started:6.1f}s] {p.name:12s} m={p.m:<6d} {issue:6s} best "
                f"{best['best']} {best['best_ms']:.3f} ms, serial {best['serial_ms']:.3f}, "
                f"async-TP {best['async_tp_ms']:.3f}, ideal {best['ideal_ms']:.3f}",
                flush=True,
            )
        # a run cut short still leaves what it measured
        Path(out + ".partial").write_text(json.dumps(list(partial.values()), default=float))

    check_gpus(args.world)
    results, _ = run_suite(jobs, opts, args.world, args.stall_timeout, progress, done)
    rows_of: dict[str, list] = {issue: [] for issue in issues}
    failures = []
    for index, ((problem, _), res) in enumerate(zip(jobs, results, strict=True)):
        if isinstance(res, PoolFailure):
            failures.append({"key": problem.key, "name": problem.name, "error": str(res)})
        else:
            for issue in issues:
                rows_of[issue].append(partial[index][issue])
    rows = rows_of[issues[0]]
    report = {
        "fingerprint": fingerprint("cuda"),
        **problem_dtype,
        "protocol": {
            "rounds": opts.rounds,
            "warmup": opts.warmup,
            "flush_l2": opts.flush_l2,
            "graphs": args.graphs,
            "issue": list(issues),
            "issue_modes": {
                "synced": "before each iteration the host waits for its GPU and the ranks meet "
                "at a host (gloo) barrier, then a device barrier: launch and Python issue cost "
                "count",
                "queued": "the host runs ahead of the GPU inside a round: issue cost hides "
                "behind GPU work and counts only where it exceeds it",
            },
            "graphs_fallback": "a problem that hung with NCCL calls in graphs was retried with "
            "copy-engine graphs only, and later shapes kept that mode (per shape: 'graphs')",
            "statistic": "median over rounds of the per-iteration max across ranks; spread p90-p10",
        },
        "summary": summarize(rows),
        "summary_issue": issues[0],
        "failures": failures,
        "shapes": rows,
        "by_issue": {
            issue: {"summary": summarize(rows_of[issue]), "shapes": rows_of[issue]}
            for issue in issues[1:]
        },
        "wall_s": time.time() - started,
    }
    Path(out).write_text(json.dumps(report, indent=1, default=float))
    Path(out + ".partial").unlink(missing_ok=True)  # the full report holds all of it

    for issue in issues:
        print(f"\n--- issue: {issue}")
        print(
            f"{'shape':14s} {'M':>6s} {'serial':>8s} {'asyncTP':>8s} {'ideal':>8s} {'best':>8s}"
            "  best schedule"
        )
        for r in rows_of[issue]:
            print(
                f"{r['name']:14s} {r['problem']['m']:6d} {r['serial_ms']:8.3f} "
                f"{r['async_tp_ms']:8.3f} {r['ideal_ms']:8.3f} {r['best_ms']:8.3f}  {r['best']}"
            )
    for f in failures:
        print(f"FAILED {f['name']} {f['key']}: {f['error']}")
    for issue in issues:
        print(f"summary, issue {issue}:")
        print(json.dumps(summarize(rows_of[issue]), indent=1))
    return 1 if failures or any(s["incorrect"] for s in report["summary"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
