"""Embedding pooling + all-to-all (emb_a2a, DLRM's model-parallel embeddings) on W GPUs:
every schedule beside the serial baseline and the ideal, in one run.

Problems: the catalog's MLPerf DLRM-DCNv2 embeddings (``ficco.workloads_dlrm``: 26 Criteo-1TB
tables, dim 128, MLPerf's multi-hot bag size per table; rows capped at ``--row-cap``, 0 for
none) dealt out table-wise to W ranks, at ``--batch`` samples per rank (global batch = W x
that), bf16 (``--dtype``), pooled by sum. Every legal emb_a2a schedule of ficco's space
(serial, shard and finer chunks as table groups or batch cuts; ``ce``, ``seg``, ``nccl``
transports; pooling by torch's EmbeddingBag (``cublas``) or ficco's Triton kernel (``triton``);
``merged``; ``+fused``, the pool-and-store into peers' receive buffers with per-chunk flags) is
verified against the reference, then timed beside ``serial_eager`` (the serial plan issued
eagerly: pool everything, then NCCL's all-to-all) and ``ideal`` = max(pooling alone, all-to-all
alone), with the protocol of ``scripts/bench_overlap.py`` (whose runner and summary it uses):
interleaved rounds, L2 flush, ranks aligned before each iteration, max across ranks, median.

Usage (2+ GPUs): python scripts/bench_embedding.py --world 2 [--quick] [--out FILE]
  --dry-run      list the problems and their schedule counts, run nothing (no GPU needed).
  --verify-only  verify every schedule against the reference, time nothing; the JSON holds
                 each schedule's verdict (and why, where it is not ok).
  --backend cuda_shared --verify-only   W ranks on one GPU (``ficco.execute.cuda_shared``):
                 the same schedules verified where one GPU is all there is; ``+fused`` (flag
                 waits across ranks inside a kernel) comes back unavailable, saying why. Its
                 timings would mean nothing (the ranks' kernels take turns on the GPU), so it
                 refuses to time. ``--backend cpu --verify-only``: the same on CPU processes.
Writes ``$OUT/bench_embedding.json`` when ``$OUT`` is set (a verify-only run rewrites it after
every problem); exits 2, saying why, on a machine with fewer GPUs than the backend needs for
``--world``; exits 1 when a schedule failed (a verdict other than ok or unavailable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

BATCH_PER_RANK = (2048, 8192, 32768)
#: where it runs: a GPU per rank (timed); ranks that share one GPU, or CPU processes (both
#: verify only)
BACKENDS = ("cuda", "cuda_shared", "cpu")


def problems(world: int, batches, row_cap: int, quick: bool, dtype: str = "bf16"):
    """The emb_a2a problems of the run, small first (a cut-short run covers every batch):
    the catalog's DLRM-DCNv2 embeddings (its per-table bag sizes), in ``dtype``, at each batch
    per rank, rows capped at ``row_cap`` (0: none)."""
    import dataclasses

    from ficco.workloads_dlrm import EMBEDDING_MODELS, embedding_problems

    (base,), _ = embedding_problems(EMBEDDING_MODELS["dlrm-dcnv2"], world, dtype)
    rows = tuple(min(r, row_cap) if row_cap else r for r in base.tables)
    return [
        dataclasses.replace(base, m=b * world, tables=rows)
        for b in (batches[:2] if quick else batches)
    ]


def schedules_of(problem, quick: bool):
    from ficco.space import Schedule, SpaceOptions, enumerate_schedules

    if quick:
        names = (
            "serial/nccl/cublas", "serial/nccl/triton", "shard/ce/triton", "finer-c4-m/seg/triton",
            "finer-c4-m/ce/triton+fused", "shard/ce/triton+fused",
        )  # fmt: skip
        return [Schedule.parse(n) for n in names]
    return list(enumerate_schedules(problem, SpaceOptions(chunk_counts=(2, 4, 8))))


def timing_refusal(backend: str, verify_only: bool) -> str | None:
    """Why ``backend`` cannot time (its spec's ``run_timed``), unless only verifying."""
    from ficco.backends import backend_spec

    spec = backend_spec(backend)
    if spec.run_timed or verify_only:
        return None
    return (
        f"--backend {backend} cannot time: {spec.summary} Add --verify-only, or time with "
        "--backend cuda (a GPU per rank)"
    )


def refusals(backend: str, problem, schedules) -> dict[str, str]:
    """The schedules ``backend`` refuses, with why (``ficco.backends``' check)."""
    from ficco.backends import backend_spec

    check = backend_spec(backend).check
    return {str(s): why for s in schedules if (why := check(problem, s))}


def verify(jobs, args) -> int:
    """Verify every job's schedules on ``args.backend``, time nothing; write the verdicts
    after every problem. Returns 1 if a schedule failed (not ok, not unavailable)."""
    from ficco.execute import RunOptions
    from ficco.execute.pool import PoolFailure
    from ficco.execute.run import backend_pool, measure_in
    from ficco.measure.fingerprint import fingerprint

    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "bench_embedding.json")
    started, rows = time.time(), []
    report = {
        "benchmark": "emb_a2a: every schedule verified against the reference (nothing timed)",
        "fingerprint": fingerprint(args.backend),
        "config": {
            "world": args.world,
            "backend": args.backend,
            "batch_per_rank": args.batch,
            "row_cap": args.row_cap,
            "quick": args.quick,
            "dtype": args.dtype,
            "verify_only": True,
        },
        "problems": rows,
    }
    failed = 0
    with backend_pool(args.backend, args.world, RunOptions(timeout_s=args.stall_timeout)) as pool:
        for p, scheds in jobs:
            got = measure_in(pool, p, scheds, None, baselines=False)
            if isinstance(got, PoolFailure):
                verdicts = [{"name": str(s), "verdict": got.verdict.value, "detail": str(got)}
                            for s in scheds]  # fmt: skip
            else:
                verdicts = [{"name": m.name, "verdict": m.verdict, "detail": m.detail} for m in got]
            counts: dict[str, int] = {}
            for v in verdicts:
                counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
            bad = [v for v in verdicts if v["verdict"] not in ("ok", "unavailable")]
            failed += len(bad)
            rows.append({"key": p.key, "problem": p.to_dict(), "counts": counts,
                         "verdicts": verdicts})  # fmt: skip
            report["wall_s"] = time.time() - started
            out.write_text(json.dumps(report, indent=1))
            print(f"[{time.time() - started:6.1f}s] m={p.m}: {counts}", flush=True)
            for v in bad:
                print(f"    {v['name']}: {v['verdict']}: {v['detail']}", flush=True)
    print(f"wrote {out}: {sum(len(r['verdicts']) for r in rows)} schedules verified on "
          f"{args.backend} at W = {args.world}, {failed} failed")  # fmt: skip
    return 1 if failed else 0


def main(argv=None) -> int:
    from ficco.space.transports import GRAPH_MODES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch", type=int, nargs="+", default=list(BATCH_PER_RANK))
    parser.add_argument("--row-cap", type=int, default=4_000_000, help="0: MLPerf's full rows")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 batches, 6 schedules, 5 rounds")
    parser.add_argument("--dry-run", action="store_true", help="list the jobs, run nothing")
    parser.add_argument("--stall-timeout", type=float, default=300.0)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--backend", choices=BACKENDS, default="cuda",
        help="cuda: a GPU per rank; cuda_shared (W ranks on one GPU) and cpu: --verify-only",
    )  # fmt: skip
    parser.add_argument("--verify-only", action="store_true", help="verify, time nothing")
    parser.add_argument(
        "--graphs", choices=GRAPH_MODES, default="all",
        help="which verified schedules are captured and timed as CUDA graphs (TimingOptions)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
        help="the tables' dtype (the cpu backend's Triton interpreter refuses bf16)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.world < 2:
        parser.error(f"--world: an all-to-all needs >= 2 ranks, got {args.world}")
    refusal = timing_refusal(args.backend, args.verify_only)
    if refusal:
        parser.error(refusal)
    jobs = [
        (p, schedules_of(p, args.quick))
        for p in problems(args.world, args.batch, args.row_cap, args.quick, args.dtype)
    ]
    if args.dry_run:
        for p, scheds in jobs:
            refused = refusals(args.backend, p, scheds)
            why = f" ({len(refused)} refused by {args.backend})" if refused else ""
            print(f"{p.name} m={p.m} tables={len(p.tables)}: {len(scheds)} schedules{why}")
        return 0
    from ficco.execute.run import check_gpus

    try:
        check_gpus(args.world, args.backend)
    except RuntimeError as err:
        print(f"bench_embedding: {err}", file=sys.stderr)
        return 2
    if args.verify_only:
        return verify(jobs, args)
    import bench_overlap as bo

    from ficco.execute import TimingOptions
    from ficco.execute.pool import PoolFailure
    from ficco.measure.fingerprint import fingerprint

    opts = TimingOptions(rounds=5 if args.quick else args.rounds, graphs=args.graphs)
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "bench_embedding.json")
    started, rows = time.time(), {}

    def progress(index, msg):
        verdict = f" -> {msg['verdict']}" if msg.get("verdict") else ""
        m = msg.get("measurement")
        if m is not None and m.verdict != "ok":  # why, and whether a graph replay said so
            verdict += f" ({m.extra.get('graph', 'eager')}: {m.detail[:300]})"
        print(f"    [{time.time() - started:6.1f}s] m={jobs[index][0].m}: {msg.get('phase')} "
              f"{msg.get('name')}{verdict}", flush=True)  # fmt: skip

    def done(index, measured, graphs):
        p = jobs[index][0]
        rows[index] = bo.shape_row(p, measured) | {"graphs": graphs}
        r = rows[index]
        print(f"[{time.time() - started:6.1f}s] m={p.m}: best {r['best']} {r['best_ms']:.3f} ms, "
              f"serial {r['serial_ms']:.3f}, ideal {r['ideal_ms']:.3f}", flush=True)  # fmt: skip
        Path(str(out) + ".partial").write_text(json.dumps(list(rows.values()), default=float))

    results, _ = bo.run_suite(jobs, opts, args.world, args.stall_timeout, progress, done)
    failures = [
        {"key": p.key, "error": str(res)}
        for (p, _), res in zip(jobs, results, strict=True)
        if isinstance(res, PoolFailure)
    ]
    shapes = [rows[i] for i in sorted(rows)]
    report = {
        "benchmark": "emb_a2a: embedding pooling + all-to-all schedules vs serial and ideal",
        "fingerprint": fingerprint("cuda"),
        "config": {
            "world": args.world,
            "batch_per_rank": args.batch,
            "row_cap": args.row_cap,
            "rounds": opts.rounds,
            "quick": args.quick,
            "dtype": args.dtype,
            "graphs": args.graphs,
        },  # fmt: skip
        "summary": bo.summarize(shapes),
        "failures": failures,
        "shapes": shapes,
        "wall_s": time.time() - started,
    }
    out.write_text(json.dumps(report, indent=1, default=float))
    print(f"wrote {out}")
    for r in shapes:
        print(f"m={r['problem']['m']:>7} best {r['best']:34} {r['best_ms']:8.3f} ms  serial "
              f"{r['serial_ms']:8.3f}  ideal {r['ideal_ms']:8.3f}  x serial "
              f"{r['best_vs_serial']:.3f}")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
