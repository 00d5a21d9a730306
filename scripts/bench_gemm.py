#!/usr/bin/env python3
"""Triton persistent GEMM (`ficco.kernels.matmul`) against cuBLAS (`torch.matmul`) on one GPU.

Shapes (bf16 by default):
  full   the suite's GEMMs as written: ag_gemm layers (N, K) = (3072, 4096), (14336, 4096),
         (5120, 8192), (28672, 8192) and gemm_rs layers (4096, 2048), (4096, 7168),
         (8192, 4096), (8192, 14336), each with M in {1024, 2048, 4096, 8192, 16384};
  chunk  the per-chunk GEMMs of finer-grain schedules: rows M / W / c for W = 2 and
         c in {1, 2, 4, 8}, rows >= 256, deduplicated;
  budget throughput at SM budgets 132, 128, 120, 112, 96 on 8192x8192x8192 and
         16384x14336x4096 (each budget tuned on its own).

Protocol, per shape:
  1. tune: every configuration kept for the shape, checked, then timed by the tuner's timer
     (`ficco.kernels.tune`: interleaved rounds, L2 flushed, host launch cost hidden) or, with
     --tune-rep-ms, `triton.testing.do_bench` median, on random inputs (the tuning cache is
     written but not read unless --reuse-tuning); with --compare-do-bench, on shapes whose
     pick runs under DO_BENCH_COMPARE_MS, do_bench (8 ms a candidate, median) ranks the same
     correct candidates too, and its pick is verified and timed in the rounds below where it
     differs (the pick the tuner made before its timer changed);
  2. verify on fresh random inputs, output poisoned with NaN: relative Frobenius error of
     Triton and of cuBLAS against an fp32 cuBLAS reference (TF32 off); Triton must be <= 1e-2;
  3. time Triton (T), cuBLAS (C) and Triton again (T2) interleaved round by round, the order
     rotated each round; each launch between its own CUDA events, an L2 flush (a write of
     max(2 x L2, 128 MB)) before every launch; each batch of rounds starts with a GPU sleep as
     long as the host's enqueue of the batch (250 us a launch, at least 3 ms) so the host
     queues the batch ahead and host launch overhead stays out of the events; median
     over rounds. Spread = IQR / median. T / T2 is the noise floor of the T / C ratio.
     With --compare-before, the fastest config of the space before it was widened (from the
     same tuning record) is verified and timed in the same rounds where it differs.
  ratio = Triton TFLOP/s / cuBLAS TFLOP/s = cuBLAS ms / Triton ms.

Traps this protocol avoids (each once produced a wrong conclusion somewhere):
  - zeros as inputs run faster than random data (seen on an H200: +13%);
  - repeated runs over one buffer measure the 50-60 MB L2, not HBM, on small shapes;
  - with an idle GPU, host launch overhead lands between the events (also when a batch's
    enqueue outlasts its head start: a Triton launch costs ~130 us of host time);
  - do_bench's default return mode is the mean;
  - one run's difference smaller than the spread of repeated timings is noise.

Writes JSON to $OUT/bench_gemm.json when $OUT is set, else to --out; prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.execute.timing import LaunchTimer as Timer  # noqa: E402
from ficco.execute.timing import warm_then_rounds  # noqa: E402
from ficco.kernels import matmul, tune  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    GPU_CONFIGS,
    GPU_CONFIGS_BEFORE_WIDENING,
    GemmConfig,
    candidate_configs,
    split_plan,
)
from ficco.kernels.tuning import TuningKey, cache_entry  # noqa: E402
from ficco.measure.fingerprint import fingerprint as ficco_fingerprint  # noqa: E402

LAYERS = [
    ("ag_gemm", "l3-8b.qkv", 3072, 4096),
    ("ag_gemm", "l3-8b.fc1", 14336, 4096),
    ("ag_gemm", "l3-70b.qkv", 5120, 8192),
    ("ag_gemm", "l3-70b.fc1", 28672, 8192),
    ("gemm_rs", "l3-8b.out", 4096, 2048),
    ("gemm_rs", "l3-8b.fc2", 4096, 7168),
    ("gemm_rs", "l3-70b.out", 8192, 4096),
    ("gemm_rs", "l3-70b.fc2", 8192, 14336),
]
M_VALUES = [1024, 2048, 4096, 8192, 16384]
WORLD = 2
CHUNKS = [1, 2, 4, 8]
MIN_CHUNK_ROWS = 256
BUDGET_SHAPES = [(8192, 8192, 8192), (16384, 14336, 4096)]
BUDGETS = [132, 128, 120, 112, 96]
REL_ERROR_LIMIT = 1e-2
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DO_BENCH_COMPARE_MS = 0.2


def shape_sets(quick: bool) -> tuple[dict, list, list]:
    """{(M, N, K): {"sets": [...], "layers": [...]}} plus the budget shapes and budgets."""
    layers = [LAYERS[0], LAYERS[6]] if quick else LAYERS
    m_values = [1024, 8192] if quick else M_VALUES
    shapes: dict[tuple[int, int, int], dict] = {}
    for _pattern, layer, n, k in layers:
        for m in m_values:
            rec = shapes.setdefault((m, n, k), {"sets": set(), "layers": set()})
            rec["sets"].add("full")
            rec["layers"].add(layer)
            for c in CHUNKS:
                rows = m // (WORLD * c)
                if rows >= MIN_CHUNK_ROWS:
                    rec = shapes.setdefault((rows, n, k), {"sets": set(), "layers": set()})
                    rec["sets"].add("chunk")
                    rec["layers"].add(layer)
    budget_shapes = BUDGET_SHAPES[:1] if quick else BUDGET_SHAPES
    budgets = [132, 120] if quick else BUDGETS
    return shapes, budget_shapes, budgets


# ---------------------------------------------------------------------------------------------
# Environment


def parse_dims(option: str, text: str, count: int) -> set[tuple[int, ...]]:
    """The shapes a comma list names ("AxB[xC],..."), each of ``count`` non-negative integers;
    ValueError names ``option`` and the bad item."""
    names = "x".join("MNK"[3 - count :])
    found = set()
    for item in text.split(","):
        dims = item.strip().split("x")
        if len(dims) != count or not all(d.isdigit() for d in dims):
            raise ValueError(f"{option}: {item.strip()!r} is not {names}")
        found.add(tuple(int(d) for d in dims))
    return found


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def fingerprint(commit: str | None) -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    clocks = _run(
        ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.limit", "--format=csv,noheader"]
    )
    git = commit or _run(["git", "-C", str(REPO), "rev-parse", "HEAD"]) or "unknown"
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "driver": driver.splitlines()[0] if driver else "unknown",
        "nvidia_smi_clocks_sm_max_power": clocks.splitlines()[0] if clocks else "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git_commit": git,
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _spread(xs: list[float]) -> float:
    """Interquartile range over the median."""
    if len(xs) < 4:
        return math.nan
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def _tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(
        torch.linalg.vector_norm((out.float() - ref).flatten())
        / torch.linalg.vector_norm(ref.flatten())
    )


def _finite(obj):
    """NaN/inf as null: the JSON stays strict."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _rounds_for(est_ms: float, quick: bool) -> int:
    # About 0.25 s of GEMM time per method, 20-120 rounds (8-20 in quick mode).
    lo, hi = (8, 20) if quick else (20, 120)
    return int(min(hi, max(lo, 250.0 / max(est_ms, 1e-3))))


# ---------------------------------------------------------------------------------------------
# One shape


def _tune(m, n, k, dtype, budget, reuse, rep_ms=None):
    t0 = time.perf_counter()
    timer = None
    if rep_ms is not None:
        import triton

        def timer(fn):
            return triton.testing.do_bench(fn, warmup=2, rep=rep_ms, return_mode="median")

    cfg = tune(m, n, k, dtype, budget, "cuda", read_cache=reuse, timer=timer)
    key = TuningKey.for_problem(m, n, k, dtype, budget, torch.device("cuda", 0))
    entry = cache_entry(key) or {}
    return cfg, entry, time.perf_counter() - t0


def _verify(m, n, k, dtype, cfg, budget, gen) -> tuple[float, float, str]:
    a = torch.randn((m, k), device="cuda", dtype=torch.float32, generator=gen)
    b = torch.randn((k, n), device="cuda", dtype=torch.float32, generator=gen)
    a, b = a.to(dtype), b.to(dtype)
    ref = a.float() @ b.float()  # fp32 cuBLAS (TF32 off) on the rounded inputs
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    before = dict(kernel_paths.LAUNCH_COUNTS)
    matmul(a, b, out, sm_budget=budget, config=cfg)
    path = next(
        p for p in ("tma", "ptr", "decode") if kernel_paths.LAUNCH_COUNTS[p] > before.get(p, 0)
    )
    err_triton = _rel_error(out, ref)
    err_cublas = _rel_error(torch.matmul(a, b), ref)
    del a, b, ref, out
    return err_triton, err_cublas, path


def _plan_of(cfg, m, n, k, budget) -> dict | None:
    if not cfg.split_tail:
        return None
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    plan = split_plan(tiles, budget, -(-k // cfg.block_k))
    return None if plan is None else {**asdict(plan), "units": plan.units}


def best_before_widening(entry: dict, m: int, n: int, k: int, budget: int) -> GemmConfig | None:
    """The fastest correct config of the tuning record among those the space offered before it
    was widened (`GPU_CONFIGS[:GPU_CONFIGS_BEFORE_WIDENING]`, with their split tails; no
    decode kernel): today's choice."""
    before = {c.name for c in GPU_CONFIGS[:GPU_CONFIGS_BEFORE_WIDENING]}
    smem = kernel_paths.device_info(torch.device("cuda", 0)).shared_memory_bytes
    timings = entry.get("timings_ms", {})
    kept = [
        c
        for c in candidate_configs(m, n, k, 2, 2, sm_budget=budget, shared_memory_bytes=smem)
        if replace(c, split_tail=False).name in before and c.name in timings
    ]
    return min(kept, key=lambda c: timings[c.name]) if kept else None


def do_bench_pick(entry: dict, m, n, k, dtype, budget) -> GemmConfig | None:
    """The config do_bench (8 ms a candidate, median, L2 flushed) ranks first among the
    tuning record's correct candidates: the tuner's pick before its timer changed."""
    import triton

    smem = kernel_paths.device_info(torch.device("cuda", 0)).shared_memory_bytes
    timings = entry.get("timings_ms", {})
    offered = candidate_configs(m, n, k, 2, 2, sm_budget=budget, shared_memory_bytes=smem)
    kept = [c for c in offered if c.name in timings]
    if not kept:
        return None
    a = torch.randn((m, k), device="cuda").to(dtype)
    b = torch.randn((k, n), device="cuda").to(dtype)
    c = torch.empty((m, n), device="cuda", dtype=dtype)
    ms = {
        cfg: triton.testing.do_bench(
            lambda cfg=cfg: matmul(a, b, c, sm_budget=budget, config=cfg),
            warmup=2,
            rep=8,
            return_mode="median",
        )
        for cfg in kept
    }
    return min(ms, key=ms.__getitem__)


def bench_shape(m, n, k, dtype, timer, args, gen, budget) -> dict:
    cfg, entry, tune_s = _tune(m, n, k, dtype, budget, args.reuse_tuning, args.tune_rep_ms)
    before = best_before_widening(entry, m, n, k, budget) if args.compare_before else None
    if args.compare_do_bench and (entry.get("ms") or 1e9) < DO_BENCH_COMPARE_MS:
        before = do_bench_pick(entry, m, n, k, dtype, budget)
    err_t, err_c, path = _verify(m, n, k, dtype, cfg, budget, gen)
    err_before = _verify(m, n, k, dtype, before, budget, gen)[0] if before else None
    a = torch.randn((m, k), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn((k, n), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    c_t = torch.empty((m, n), device="cuda", dtype=dtype)
    c_c = torch.empty((m, n), device="cuda", dtype=dtype)
    fns = {
        "triton": lambda: matmul(a, b, c_t, sm_budget=budget, config=cfg),
        "cublas": lambda: torch.matmul(a, b, out=c_c),
        "triton2": lambda: matmul(a, b, c_t, sm_budget=budget, config=cfg),
    }
    if before is not None and before != cfg and err_before <= REL_ERROR_LIMIT:
        fns["triton_before"] = lambda: matmul(a, b, c_t, sm_budget=budget, config=before)
    times, rounds = warm_then_rounds(
        fns, timer.interleaved, lambda ms: _rounds_for(ms, args.quick), "cublas"
    )
    t_ms, c_ms, t2_ms = (_median(times[x]) for x in ("triton", "cublas", "triton2"))
    # the other pick: its own timing where it differs, the same kernel's where it does not,
    # none where it failed its check
    tb_ms = (
        _median(times["triton_before"])
        if "triton_before" in times
        else t_ms
        if before == cfg
        else math.nan
    )
    return {
        "M": m,
        "N": n,
        "K": k,
        "dtype": str(dtype).removeprefix("torch."),
        "sm_budget": budget,
        "triton_ms": t_ms,
        "cublas_ms": c_ms,
        "triton_tflops": _tflops(m, n, k, t_ms),
        "cublas_tflops": _tflops(m, n, k, c_ms),
        "ratio": c_ms / t_ms,
        "self_ratio": t2_ms / t_ms,
        "before_widening" if args.compare_before else "do_bench_pick": None
        if before is None
        else {"config": before.name, "ms": tb_ms, "ratio": c_ms / tb_ms, "rel_error": err_before},
        "config": cfg.name,
        "config_fields": cfg.to_dict(),
        "split_plan": _plan_of(cfg, m, n, k, budget),
        "path": path,
        "rel_error": err_t,
        "cublas_rel_error": err_c,
        "spread": {"triton": _spread(times["triton"]), "cublas": _spread(times["cublas"])},
        "rounds": rounds,
        "tune_s": round(tune_s, 2),
        "tune_candidates": len(entry.get("timings_ms", {})),
        "tune_failures": entry.get("failures", {}),
        "tune_best_ms_do_bench": entry.get("ms"),
    }


def bench_budgets(m, n, k, dtype, budgets, timer, args, gen) -> dict:
    cfgs = {}
    tune_s = 0.0
    for budget in budgets:
        cfg, _entry, s = _tune(m, n, k, dtype, budget, args.reuse_tuning, args.tune_rep_ms)
        cfgs[budget] = cfg
        tune_s += s
    errors = {b: _verify(m, n, k, dtype, cfgs[b], b, gen)[0] for b in budgets}
    a = torch.randn((m, k), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    b_ = torch.randn((k, n), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    c = torch.empty((m, n), device="cuda", dtype=dtype)
    fns = {
        f"triton@{b}": (lambda b=b: matmul(a, b_, c, sm_budget=b, config=cfgs[b])) for b in budgets
    }
    fns["cublas"] = lambda: torch.matmul(a, b_, out=c)
    for fn in fns.values():
        fn()
    rounds = 8 if args.quick else 20
    times = timer.interleaved(fns, rounds)
    ms = {name: _median(t) for name, t in times.items()}
    full = max(budgets)
    rows = {
        str(b): {
            "ms": ms[f"triton@{b}"],
            "tflops": _tflops(m, n, k, ms[f"triton@{b}"]),
            "vs_full_budget": ms[f"triton@{full}"] / ms[f"triton@{b}"],
            "vs_cublas": ms["cublas"] / ms[f"triton@{b}"],
            "config": cfgs[b].name,
            "rel_error": errors[b],
            "spread": _spread(times[f"triton@{b}"]),
        }
        for b in budgets
    }
    return {
        "M": m,
        "N": n,
        "K": k,
        "cublas_ms": ms["cublas"],
        "cublas_tflops": _tflops(m, n, k, ms["cublas"]),
        "budgets": rows,
        "rounds": rounds,
        "tune_s": round(tune_s, 2),
    }


def host_launch_us(dtype, timer) -> dict:
    """Host time to enqueue one call (GPU kept busy by a sleep): the overhead a schedule pays."""
    m, n, k = 1024, 3072, 4096
    a = torch.randn((m, k), device="cuda").to(dtype)
    b = torch.randn((k, n), device="cuda").to(dtype)
    c = torch.empty((m, n), device="cuda", dtype=dtype)
    result = {}
    for name, fn in (
        ("triton", lambda: matmul(a, b, c)),
        ("cublas", lambda: torch.matmul(a, b, out=c)),
    ):
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(timer.sleep_cycles * 4)
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        result[name] = (time.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
    return result


def host_profile(dtype, calls: int = 300, top: int = 18) -> str:
    """Where the host time of `matmul` goes (cProfile, by own time), GPU kept busy meanwhile."""
    import cProfile
    import io
    import pstats

    m, n, k = 1024, 3072, 4096
    a = torch.randn((m, k), device="cuda").to(dtype)
    b = torch.randn((k, n), device="cuda").to(dtype)
    c = torch.empty((m, n), device="cuda", dtype=dtype)
    matmul(a, b, c)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s: the launch queue never blocks the host
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        matmul(a, b, c)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


# ---------------------------------------------------------------------------------------------
# Main


def summarize(rows: list[dict], budget_rows: list[dict], budgets: list[int]) -> dict:
    full = [r for r in rows if "full" in r["sets"]]
    chunk = [r for r in rows if "chunk" in r["sets"]]
    summary = {
        "triton_vs_cublas_full_geomean": _geomean([r["ratio"] for r in full]),
        "triton_vs_cublas_chunk_geomean": _geomean([r["ratio"] for r in chunk]),
        "full_shapes": len(full),
        "chunk_shapes": len(chunk),
        "full_min_ratio": min((r["ratio"] for r in full), default=math.nan),
        "chunk_min_ratio": min((r["ratio"] for r in chunk), default=math.nan),
        "max_rel_error": max((r["rel_error"] for r in rows), default=math.nan),
        "max_cublas_rel_error": max((r["cublas_rel_error"] for r in rows), default=math.nan),
        "median_spread_triton": _median([r["spread"]["triton"] for r in rows])
        if rows
        else math.nan,
        "median_spread_cublas": _median([r["spread"]["cublas"] for r in rows])
        if rows
        else math.nan,
        "self_ratio_geomean": _geomean([r["self_ratio"] for r in rows]),
        "self_ratio_min": min((r["self_ratio"] for r in rows), default=math.nan),
        "self_ratio_max": max((r["self_ratio"] for r in rows), default=math.nan),
        "paths": sorted({r["path"] for r in rows}),
    }
    compared = [r for r in rows if r.get("before_widening")]
    if compared:
        for name, subset in (("full", full), ("chunk", chunk)):
            got = [r["before_widening"]["ratio"] for r in subset if r.get("before_widening")]
            summary[f"before_widening_{name}_geomean"] = _geomean(got)
            summary[f"before_widening_{name}_min_ratio"] = min(got, default=math.nan)
    compared = [r for r in rows if r.get("do_bench_pick")]
    if compared:
        summary["do_bench_pick"] = {
            "shapes": len(compared),
            "differs": sum(r["do_bench_pick"]["config"] != r["config"] for r in compared),
            "tuner_geomean": _geomean([r["ratio"] for r in compared]),
            "do_bench_geomean": _geomean([r["do_bench_pick"]["ratio"] for r in compared]),
        }
    if 120 in budgets and 132 in budgets:
        summary["sm_budget_120_vs_132"] = {
            f"{r['M']}x{r['N']}x{r['K']}": r["budgets"]["132"]["ms"] / r["budgets"]["120"]["ms"]
            for r in budget_rows
        }
    summary["targets"] = {
        "full_geomean>=0.98": summary["triton_vs_cublas_full_geomean"] >= 0.98,
        "chunk_geomean>=0.95": summary["triton_vs_cublas_chunk_geomean"] >= 0.95,
        "budget120>=0.85": all(v >= 0.85 for v in summary.get("sm_budget_120_vs_132", {}).values())
        and bool(summary.get("sm_budget_120_vs_132")),
        "rel_error<=1e-2": summary["max_rel_error"] <= REL_ERROR_LIMIT,
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="JSON path (default: $OUT/bench_gemm.json)")
    parser.add_argument("--quick", action="store_true", help="a few shapes, few rounds")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--commit", help="git commit to record when the tree has no .git")
    parser.add_argument("--reuse-tuning", action="store_true", help="read the tuning cache")
    parser.add_argument("--skip-budgets", action="store_true")
    parser.add_argument(
        "--compare-before",
        action="store_true",
        help="also time the best config of the space before it was widened, beside the best",
    )
    parser.add_argument(
        "--compare-do-bench",
        action="store_true",
        help="also time do_bench's pick of the same candidates, on shapes under 0.2 ms",
    )
    parser.add_argument(
        "--tune-rep-ms",
        type=int,
        help="tune with do_bench, this many ms per candidate (default: the tuner's timer)",
    )
    parser.add_argument(
        "--budget-s", type=float, help="skip the shapes left once this many seconds are spent"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out_path = args.out or (
        Path(os.environ["OUT"]) / "bench_gemm.json" if "OUT" in os.environ else None
    )
    if out_path is None:
        parser.error("give --out, or set $OUT")
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = DTYPES[args.dtype]
    t_start = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(20261122)
    timer = Timer()
    shapes, budget_shapes, budgets = shape_sets(args.quick)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    result = {
        "benchmark": "gemm: ficco.kernels.matmul (persistent Triton) vs torch.matmul (cuBLAS)",
        "protocol": __doc__.split("Protocol, per shape:")[1].split("Traps")[0].strip(),
        "environment": fingerprint(args.commit),
        "fingerprint": ficco_fingerprint("cuda"),
        "quick": args.quick,
        "rows": [],
        "sm_budget": [],
    }

    def save() -> None:
        result["summary"] = summarize(result["rows"], result["sm_budget"], budgets)
        result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_finite(result), indent=1, allow_nan=False))
        tmp.replace(out_path)

    order = sorted(shapes, key=lambda s: s[0] * s[1] * s[2])
    result["skipped"] = []
    for i, (m, n, k) in enumerate(order):
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            result["skipped"].append([m, n, k])
            continue
        row = bench_shape(m, n, k, dtype, timer, args, gen, sm_count)
        row["sets"] = sorted(shapes[(m, n, k)]["sets"])
        row["layers"] = sorted(shapes[(m, n, k)]["layers"])
        result["rows"].append(row)
        print(
            f"[{time.perf_counter() - t_start:6.1f}s] {i + 1}/{len(order)} {m}x{n}x{k} "
            f"ratio {row['ratio']:.3f} ({row['config']}, tune {row['tune_s']:.1f}s)",
            flush=True,
        )
        save()
    if not args.skip_budgets and not result["skipped"]:
        for m, n, k in budget_shapes:
            brow = bench_budgets(m, n, k, dtype, budgets, timer, args, gen)
            result["sm_budget"].append(brow)
            print(f"[{time.perf_counter() - t_start:6.1f}s] budgets {m}x{n}x{k} done", flush=True)
            save()
    result["host_launch_us"] = host_launch_us(dtype, timer)
    result["host_profile"] = host_profile(dtype)
    save()
    print("\n".join(line[:150] for line in result["host_profile"].splitlines()[:40]))
    print_table(result)
    return 0


def print_table(result: dict) -> None:
    print()
    print(
        f"{'M':>6} {'N':>6} {'K':>6} {'set':<10} {'config':<26} {'triton':>8} {'cublas':>8} "
        f"{'ratio':>6} {'T/T2':>5} {'spread':>6} {'relerr':>8}"
    )
    for r in result["rows"]:
        print(
            f"{r['M']:>6} {r['N']:>6} {r['K']:>6} {'+'.join(r['sets']):<10} {r['config']:<26} "
            f"{r['triton_ms']:8.4f} {r['cublas_ms']:8.4f} {r['ratio']:6.3f} {r['self_ratio']:5.3f} "
            f"{r['spread']['triton']:6.3f} {r['rel_error']:8.2e}"
        )
    for b in result["sm_budget"]:
        cells = " ".join(
            f"{k}:{v['tflops']:.0f}TF({v['vs_full_budget']:.3f})" for k, v in b["budgets"].items()
        )
        print(f"budgets {b['M']}x{b['N']}x{b['K']} cublas {b['cublas_tflops']:.0f}TF  {cells}")
    s = result["summary"]
    print(
        f"full geomean {s['triton_vs_cublas_full_geomean']:.4f}  "
        f"chunk geomean {s['triton_vs_cublas_chunk_geomean']:.4f}  "
        f"budget120/132 {s.get('sm_budget_120_vs_132')}  max relerr {s['max_rel_error']:.2e}  "
        f"spread T {s['median_spread_triton']:.3f} C {s['median_spread_cublas']:.3f}  "
        f"T/T2 {s['self_ratio_min']:.3f}-{s['self_ratio_max']:.3f}  "
        f"host us {result.get('host_launch_us')}  elapsed {result.get('elapsed_s')}s"
    )
    if "do_bench_pick" in s:
        print("do_bench's pick, where it was asked:", s["do_bench_pick"])
    if "before_widening_full_geomean" in s:
        print(
            f"before widening: full {s['before_widening_full_geomean']:.4f} "
            f"(min {s['before_widening_full_min_ratio']:.3f})  chunk "
            f"{s['before_widening_chunk_geomean']:.4f} (min {s['before_widening_chunk_min_ratio']:.3f})"
        )
    print("targets", s["targets"])


if __name__ == "__main__":
    sys.exit(main())
