#!/usr/bin/env python3
"""Compile ficco's GEMM tuning space ahead of a tuning run, in parallel processes.

Tuning compiles every candidate once per process (~1-2 s each, one after another): with the
widened space and the decode kernel that is minutes of a GPU lease. Compiled kernels land in
Triton's on-disk cache ($TRITON_CACHE_DIR, default ~/.triton/cache), keyed by source, options
and argument specialisation, so a pool of processes that launches each config once on a small
problem of the same specialisation (dimensions multiples of 16, contiguous operands; M = 1 and
M = 2 for the small-row configs) leaves the later run only cache loads.

    python scripts/prewarm_kernels.py [--workers 14] [--no-fused] [--split-k] [--dry-run]

Prints one line per task and rewrites $OUT/prewarm_kernels.json after each when $OUT is set. A
task that fails is reported, never fatal (the run that follows compiles it itself).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tasks(fused: bool, split_k: bool) -> list[tuple[str, dict, int]]:
    """(kind, config fields, rows) per compile, in the order the sweep's phases use them:
    every persistent config with and without its split tail (bench_gemm's shapes), then the
    swap-AB tiles and the persistent configs at decode rows (bench_decode_gemm's: M = 1 and an
    unaligned M are their own specialisations), the split-K decode kernel's tiles only with
    ``split_k`` (it lost at 189 of 190 decode shapes on an H100), then the fused kernel's
    space. Rows: M = 1, an M that is not a multiple of 16 and one that is are the three
    specialisations a launch can meet (N and K of every benchmarked shape are multiples of
    16); the decode benchmark's M = 1, 2, 4, ... puts only M <= 16 on the first two."""
    from ficco.kernels.configs import (
        DECODE_TILES,
        GPU_CONFIGS,
        SWAP_TILES,
        GemmConfig,
    )

    out = []
    for cfg in GPU_CONFIGS:
        for split_tail in (False, True):
            out.append(("gemm", replace(cfg, split_tail=split_tail).to_dict(), cfg.block_m * 4))
    for rows in (16, 32, 64):
        for bn, bk, stages, warps in SWAP_TILES:
            cfg = GemmConfig(rows, bn, bk, 8, stages, warps, swap_ab=True)
            for split_tail in (True, False):
                for m in (1, rows - 1, rows) if rows == 16 else (rows,):
                    out.append(("gemm", replace(cfg, split_tail=split_tail).to_dict(), m))
    for cfg in GPU_CONFIGS:
        if cfg.block_m <= 64:
            for split_tail in (True, False):
                for m in (1, 2):
                    out.append(("gemm", replace(cfg, split_tail=split_tail).to_dict(), m))
    if split_k:
        for bm in (16, 32, 64, 128):
            for bn, bk, stages, warps in DECODE_TILES:
                cfg = GemmConfig(bm, bn, bk, 8, stages, warps, split_k=2)
                out.append(("gemm", cfg.to_dict(), 2))
    if fused:
        for cfg in GPU_CONFIGS:
            out.append(("fused", cfg.to_dict(), cfg.block_m * 4))
    return out


def _compile(task: tuple[str, dict, int]) -> dict:
    kind, fields, m = task
    t0 = time.perf_counter()
    try:
        import torch

        from ficco.kernels.configs import GemmConfig
        from ficco.kernels.persistent import device_info, launch, select_path

        cfg = GemmConfig.from_dict(fields)
        device = torch.device("cuda", 0)
        sms = device_info(device).sm_count
        n = cfg.block_n * 8
        k = cfg.block_k * (16 if not cfg.decode else 4 * cfg.split_k)
        a = torch.randn(m, k, device=device).to(torch.bfloat16)
        b = torch.randn(k, n, device=device).to(torch.bfloat16)
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        if kind == "gemm":
            launch(
                a, b, out, accumulate=False, sm_budget=sms, config=cfg, path=select_path(a, b, out)
            )
        else:
            from ficco.kernels.fused import FusedChunkViews, FusedGemm

            views = [FusedChunkViews(x, o) for x, o in zip(a.chunk(2), out.chunk(2), strict=True)]
            FusedGemm(views, b, sm_budget=sms, timeout_s=10.0, config=cfg, path="tma")()
        torch.cuda.synchronize()
        ok = bool(torch.allclose(out.float(), a.float() @ b.float(), rtol=5e-2, atol=5e-1))
        return {"task": [kind, cfg.name, m], "ok": ok, "s": round(time.perf_counter() - t0, 2)}
    except Exception as exc:  # reported, never fatal
        return {
            "task": [kind, fields, m],
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:300],
            "s": round(time.perf_counter() - t0, 2),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--no-fused", action="store_true")
    parser.add_argument("--split-k", action="store_true", help="also the split-K decode kernel")
    parser.add_argument("--dry-run", action="store_true", help="list the tasks, compile nothing")
    args = parser.parse_args()
    t0 = time.perf_counter()
    todo = tasks(not args.no_fused, args.split_k)
    if args.dry_run:
        for task in todo:
            print(task[0], task[2], json.dumps(task[1], sort_keys=True))
        print(f"{len(todo)} tasks")
        return 0
    results = []
    record = Path(os.environ["OUT"]) / "prewarm_kernels.json" if "OUT" in os.environ else None
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for r in pool.imap_unordered(_compile, todo):
            results.append(r)
            wall = round(time.perf_counter() - t0, 1)
            print(f"[{wall:6.1f}s] {len(results)}/{len(todo)} {r['task']} ok={r['ok']}", flush=True)
            if record is not None:  # after every task: a time cap keeps what was done
                report = {"wall_s": wall, "workers": args.workers, "tasks": len(todo)}
                record.write_text(json.dumps({**report, "results": results}, indent=1))
    bad = [r for r in results if not r["ok"]]
    wall = round(time.perf_counter() - t0, 1)
    print(f"prewarm: {len(results)} compiles, {len(bad)} failed, {wall} s, {args.workers} workers")
    for r in bad[:10]:
        print("  failed:", r["task"], r.get("error"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
