#!/usr/bin/env python3
"""Compile ficco's GEMM tuning space ahead of a tuning run, in parallel processes.

Tuning compiles every candidate once per process (~1-2 s each, one after another): with the
widened space and the decode kernel that is minutes of a GPU lease. Compiled kernels land in
Triton's on-disk cache ($TRITON_CACHE_DIR, default ~/.triton/cache), keyed by source, options
and argument specialisation, so a pool of processes that launches each config once on a small
problem of the same specialisation (dimensions multiples of 16, contiguous operands; M = 1 and
M = 2 for the small-row configs) leaves the later run only cache loads.

    python scripts/prewarm_kernels.py [--workers 14] [--no-fused]

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


def tasks(fused: bool) -> list[tuple[str, dict, int]]:
    """(kind, config fields, rows) per compile: every persistent config with and without its
    split tail, the decode kernel's tiles at each row block, the fused kernel's space."""
    from ficco.kernels.configs import DECODE_TILES, GPU_CONFIGS, GemmConfig

    out = []
    for cfg in GPU_CONFIGS:
        rows = [cfg.block_m * 4] + ([1, 2] if cfg.block_m <= 64 else [])
        for split_tail in (False, True):
            for m in rows:
                out.append(("gemm", replace(cfg, split_tail=split_tail).to_dict(), m))
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
    args = parser.parse_args()
    t0 = time.perf_counter()
    todo = tasks(not args.no_fused)
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
