#!/usr/bin/env python3
"""Decode GEMMs on one GPU: the persistent Triton GEMM, its swap-AB tiles and (with
``--split-k``) the split-K decode kernel beside cuBLAS (`torch.matmul`), per (M, N, K).

Shapes (bf16): M in 1, 2, 4, ..., 512 (``ficco.workloads.PHASE_TOKENS["decode"]``) against every
catalog model's decode (N, K) at W ranks (``--world``, default 2): the gemm_ar problems of
``ficco workloads --phase decode``, deduplicated by shape.

Protocol, per shape:
  1. tune: ``ficco.kernels.tune`` over the space ``matmul`` tunes over (``candidate_configs``:
     the persistent tiles and, up to 64 rows, the swap-AB tiles) and, with ``--split-k``, the
     decode kernel's split-K configs (``configs.decode_candidate_configs``), each candidate
     checked against ``torch.matmul`` before it is timed (the tuner's own timer: interleaved
     rounds, L2 flushed, host launch cost hidden; ``--rep-ms``: do_bench instead); the winner
     ("space") is written to the tuning cache ($FICCO_CACHE_DIR), and the record's timings
     give the fastest persistent, swap-AB and split-K config as well;
  2. verify on fresh random inputs, output poisoned with NaN: relative Frobenius error of each
     of space / persistent / swap / decode and of cuBLAS against an fp32 reference (TF32
     off); a variant above 1e-2 is not timed;
  3. time cuBLAS, the space's choice, the fastest of each kernel, and the space's choice
     again (noise floor), interleaved round by round, order rotated, an L2 flush before every
     launch, host launch cost hidden (``ficco.execute.timing.LaunchTimer``); median over
     rounds. ratio = cuBLAS ms / variant ms (above 1: faster than cuBLAS).

Writes JSON (with the machine's fingerprint) to $OUT/bench_decode_gemm.json when $OUT is set,
else to --out, after every shape; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gemm import fingerprint, parse_dims  # noqa: E402

from ficco.execute.timing import LaunchTimer  # noqa: E402
from ficco.kernels import matmul, tune  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    GemmConfig,
    candidate_configs,
    decode_candidate_configs,
)
from ficco.kernels.persistent import device_info  # noqa: E402
from ficco.kernels.tuning import TuningKey, cache_entry  # noqa: E402
from ficco.measure.fingerprint import fingerprint as ficco_fingerprint  # noqa: E402
from ficco.workloads import PHASE_TOKENS, ParallelSetup, catalog_problems  # noqa: E402

REL_ERROR_LIMIT = 1e-2
ROUNDS = 30
KINDS = ("persistent", "swap", "decode")


def kind_of(cfg: GemmConfig) -> str:
    """Which kernel a config runs: the split-K decode kernel, a swap-AB tile, or a persistent
    tile."""
    return "decode" if cfg.decode else "swap" if cfg.swap_ab else "persistent"


def decode_shapes(world: int) -> dict[tuple[int, int], list[str]]:
    """{(N, K): [layer names]} of the catalog's decode gemm_ar problems at ``world`` ranks."""
    problems, _ = catalog_problems(setup=ParallelSetup(world=world, tokens=(1,), phase="decode"))
    shapes: dict[tuple[int, int], list[str]] = {}
    for p in problems:
        shapes.setdefault((p.n, p.k), []).append(p.name)
    return shapes


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def _fastest(entry: dict, space: list[GemmConfig], kind: str) -> GemmConfig | None:
    """The fastest correct config of the tuning record among ``space``'s configs of one
    kernel (``kind_of``)."""
    timings = entry.get("timings_ms", {})
    kept = [c for c in space if kind_of(c) == kind and c.name in timings]
    return min(kept, key=lambda c: timings[c.name]) if kept else None


def bench_shape(m, n, k, timer, gen, budget, rep_ms, split_k) -> dict:
    import triton

    dtype = torch.bfloat16
    smem = device_info(torch.device("cuda", 0)).shared_memory_bytes
    t0 = time.perf_counter()
    offered = candidate_configs(m, n, k, 2, 2, sm_budget=budget, shared_memory_bytes=smem)
    if split_k:
        offered += decode_candidate_configs(
            m, n, k, 2, 2, sm_budget=budget, shared_memory_bytes=smem
        )
    tune_timer = None
    if rep_ms is not None:

        def tune_timer(fn):
            return triton.testing.do_bench(fn, warmup=2, rep=rep_ms, return_mode="median")

    space = tune(
        m, n, k, dtype, budget, "cuda", configs=offered, read_cache=False, timer=tune_timer
    )
    tune_s = time.perf_counter() - t0
    entry = cache_entry(TuningKey.for_problem(m, n, k, dtype, budget, torch.device("cuda", 0)))
    entry = entry or {}
    variants = {"space": space, **{kind: _fastest(entry, offered, kind) for kind in KINDS}}
    variants = {name: cfg for name, cfg in variants.items() if cfg is not None}

    a = torch.randn((m, k), device="cuda", generator=gen).to(dtype)
    b = torch.randn((k, n), device="cuda", generator=gen).to(dtype)
    ref = a.float() @ b.float()
    errors = {"cublas": _rel_error(torch.matmul(a, b), ref)}
    outs = {}
    for name, cfg in variants.items():
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        matmul(a, b, out, sm_budget=budget, config=cfg)
        errors[name] = _rel_error(out, ref)
        outs[name] = out
    fns = {"cublas": lambda: torch.matmul(a, b, out=outs["space"])}
    for name, cfg in variants.items():
        if errors[name] <= REL_ERROR_LIMIT:
            fns[name] = lambda cfg=cfg, out=outs[name]: matmul(
                a, b, out, sm_budget=budget, config=cfg
            )
    if "space" in fns:
        fns["space2"] = fns["space"]
    for fn in fns.values():
        fn()
    times = timer.interleaved(fns, ROUNDS)
    ms = {name: statistics.median(ts) for name, ts in times.items()}
    weight_bytes = k * n * 2
    return {
        "M": m,
        "N": n,
        "K": k,
        "sm_budget": budget,
        "ms": ms,
        "ratio": {name: ms["cublas"] / t for name, t in ms.items() if name != "cublas"},
        "configs": {name: cfg.name for name, cfg in variants.items()},
        "rel_error": errors,
        "weight_tb_per_s": {name: weight_bytes / (t * 1e-3) / 1e12 for name, t in ms.items()},
        "tune_s": round(tune_s, 2),
        "tune_candidates": len(entry.get("timings_ms", {})),
        "tune_failures": entry.get("failures", {}),
        "rounds": ROUNDS,
    }


def summarize(rows: list[dict]) -> dict:
    def ratios(name, subset=None):
        return [r["ratio"][name] for r in (subset or rows) if name in r["ratio"]]

    summary = {"shapes": len(rows)}
    for name in ("space", *KINDS):
        got = ratios(name)
        summary[f"{name}_vs_cublas_geomean"] = _geomean(got)
        summary[f"{name}_vs_cublas_min"] = min(got, default=math.nan)
        summary[f"{name}_shapes"] = len(got)
    by_m = {}
    for m in sorted({r["M"] for r in rows}):
        subset = [r for r in rows if r["M"] == m]
        by_m[str(m)] = {name: _geomean(ratios(name, subset)) for name in ("space", *KINDS)}
    summary["by_m"] = by_m
    summary["space_picks_decode"] = sum("_splitk" in r["configs"].get("space", "") for r in rows)
    summary["space_picks_swap"] = sum("_swap" in r["configs"].get("space", "") for r in rows)
    # the better of the tuner's pick and cuBLAS per shape: what a space that may pick either
    # (gemm_ar's GEMM choice) gets
    best = [max(1.0, r["ratio"].get("space", 0.0)) for r in rows]
    summary["best_of_space_and_cublas_geomean"] = _geomean(best)
    summary["cublas_faster_than_space"] = [
        [r["M"], r["N"], r["K"]] for r in rows if r["ratio"].get("space", 0) < 1.0
    ]
    summary["max_rel_error"] = max(
        (v for r in rows for n, v in r["rel_error"].items() if n != "cublas"), default=math.nan
    )
    summary["targets"] = {
        "space_geomean>=1.00": summary["space_vs_cublas_geomean"] >= 1.0,
        "space_min>=0.90": summary["space_vs_cublas_min"] >= 0.9,
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="JSON path (default: $OUT/bench_decode_gemm.json)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument(
        "--m", type=int, nargs="*", help="rows, in the order to run (default: the decode phase's)"
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="only these decode weights, NxK,NxK,... (default: every catalog decode (N, K))",
    )
    parser.add_argument(
        "--rep-ms",
        type=int,
        help="tune with do_bench, this many ms per candidate (default: the tuner's timer)",
    )
    parser.add_argument(
        "--split-k", action="store_true", help="also offer the split-K decode kernel's configs"
    )
    parser.add_argument("--budget-s", type=float, help="skip the shapes left after this long")
    parser.add_argument("--commit", help="git commit to record when the tree has no .git")
    args = parser.parse_args(argv)
    shapes = decode_shapes(args.world)
    if args.weights:
        try:
            wanted = parse_dims("--weights", args.weights, 2)
        except ValueError as exc:
            parser.error(str(exc))
        unknown = sorted(wanted - set(shapes))
        if unknown:
            parser.error(
                f"--weights: {unknown} not among the decode weights at W = {args.world}: "
                f"{sorted(shapes)}"
            )
        shapes = {nk: names for nk, names in shapes.items() if nk in wanted}
    if not torch.cuda.is_available():
        print("bench_decode_gemm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out_path = args.out or (
        Path(os.environ["OUT"]) / "bench_decode_gemm.json" if "OUT" in os.environ else None
    )
    if out_path is None:
        parser.error("give --out, or set $OUT")
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(20261125)
    timer = LaunchTimer()
    budget = torch.cuda.get_device_properties(0).multi_processor_count
    m_values = list(dict.fromkeys(args.m)) if args.m else sorted(PHASE_TOKENS["decode"])
    result = {
        "benchmark": "decode gemm: ficco.kernels.matmul (persistent / swap-AB / split-K) vs cuBLAS",
        "protocol": __doc__.split("Protocol, per shape:")[1].split("Writes JSON")[0].strip(),
        "environment": fingerprint(args.commit),
        "fingerprint": ficco_fingerprint("cuda"),
        "world": args.world,
        "layers": {f"{n}x{k}": names for (n, k), names in shapes.items()},
        "rows": [],
        "skipped": [],
    }

    def save() -> None:
        result["summary"] = summarize(result["rows"])
        result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=lambda x: None))
        tmp.replace(out_path)

    # rows outermost, in the order given (default: ascending): a time budget that runs out
    # leaves the last rows, so a short lease gives --m a spread of rows first
    todo = [(m, n, k) for m in m_values for (n, k) in sorted(shapes)]
    for i, (m, n, k) in enumerate(todo):
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            result["skipped"].append([m, n, k])
            continue
        try:
            row = bench_shape(m, n, k, timer, gen, budget, args.rep_ms, args.split_k)
        except Exception as exc:  # recorded, and the sweep goes on
            row = {"M": m, "N": n, "K": k, "error": f"{type(exc).__name__}: {exc}"[:400]}
            result.setdefault("errors", []).append(row)
            print(f"{m}x{n}x{k}: {row['error']}", flush=True)
            continue
        result["rows"].append(row)
        print(
            f"[{time.perf_counter() - t_start:6.1f}s] {i + 1}/{len(todo)} {m}x{n}x{k} "
            + " ".join(f"{name} {v:.3f}" for name, v in row["ratio"].items())
            + f" [{row['configs'].get('space')}]",
            flush=True,
        )
        save()
    save()
    s = result["summary"]
    print(
        "  ".join(
            f"{name} {s[f'{name}_vs_cublas_geomean']:.4f} (min {s[f'{name}_vs_cublas_min']:.3f}, "
            f"{s[f'{name}_shapes']} shapes)"
            for name in ("space", *KINDS)
        )
        + f"  skipped {len(result['skipped'])}  picked swap {s['space_picks_swap']} "
        f"split-K {s['space_picks_decode']}  best of space and cuBLAS "
        f"{s['best_of_space_and_cublas_geomean']:.4f}"
    )
    print("by M", json.dumps(s["by_m"]))
    print("targets", s["targets"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
