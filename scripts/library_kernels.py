#!/usr/bin/env python3
"""Which kernels cuBLAS (`torch.matmul`, bf16) and cuBLASLt (`torch._scaled_mm`, FP8 e4m3 with
per-row / per-column scales, promoted and fast accumulation) launch for `scripts/bench_gemm.py`'s
shapes on this GPU: per shape and call, each kernel's name, grid, block, registers, shared
memory and duration, from one profiled call (`torch.profiler`, CUPTI) after a warm call.
`--set decode` takes bench_decode_gemm's shapes (bf16 only) and profiles ficco's `matmul` as
shipped beside cuBLAS: kernel durations without launch and timing overhead, to tell a slower
kernel from a costlier launch.

The names carry the library's tile shape, cluster, schedule (warp-specialized cooperative or
ping-pong, split-K, stream-K) and stages: what a ficco kernel would have to match.

    python scripts/library_kernels.py --out DIR    (writes DIR/library_kernels.json)
    python scripts/library_kernels.py --out DIR --set decode --shapes 1x2880x2048,...
        (writes DIR/library_kernels_decode.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gemm import fingerprint  # noqa: E402
from bench_gluon_gemm import add_shape_arguments, select_shapes  # noqa: E402

TRACE_FIELDS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM")


def profiled_kernels(fn) -> list[dict]:
    """The GPU kernels of one call of ``fn`` (after a warm call): name, launch shape, time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    out = []
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel":
            continue
        args = event.get("args", {})
        row = {"name": event.get("name"), "us": event.get("dur")}
        row.update({k: args[k] for k in TRACE_FIELDS if k in args})
        out.append(row)
    return out


def shape_calls(m: int, n: int, k: int) -> dict[str, list[dict]]:
    from ficco.kernels import scaled

    a = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda").to(torch.bfloat16)
    calls = {"matmul_bf16": profiled_kernels(lambda: torch.matmul(a, b))}
    fa, fb, sa, sb, _ = scaled.random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=1)
    for fast in (False, True):
        calls["scaled_mm_fast" if fast else "scaled_mm"] = profiled_kernels(
            lambda fast=fast: torch._scaled_mm(
                fa, fb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
            )
        )
    return calls


def decode_calls(m: int, n: int, k: int) -> dict[str, list[dict]]:
    """cuBLAS bf16 and ficco's `matmul` as shipped (the Gluon kernel where picked): their kernels
    in one profiled call each, every kernel of the call listed (a split-K reduce among them)."""
    from ficco.kernels import matmul

    a = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda").to(torch.bfloat16)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    return {
        "matmul_bf16": profiled_kernels(lambda: torch.matmul(a, b)),
        "ficco_matmul": profiled_kernels(lambda: matmul(a, b, out)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for library_kernels.json")
    ap.add_argument("--commit", default=None, help="the tree's commit, for the fingerprint")
    add_shape_arguments(
        ap, "bench_gemm's full and chunk shapes, or bench_decode_gemm's (bf16, with ficco's matmul)"
    )
    args = ap.parse_args(argv)

    try:
        shapes = select_shapes(args.shape_set, args.shapes)
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("library_kernels: no CUDA device", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    calls_of = decode_calls if args.shape_set == "decode" else shape_calls
    rows = []
    for (m, n, k), sets in shapes:
        row = {"M": m, "N": n, "K": k, "sets": sorted(sets)}
        row["calls"] = calls_of(m, n, k)
        rows.append(row)
        first = {c: (v[0]["name"] if v else None) for c, v in row["calls"].items()}
        print(f"{m}x{n}x{k}: {json.dumps(first)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "library_kernels",
        "environment": fingerprint(args.commit),
        "rows": rows,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    name = (
        "library_kernels.json" if args.shape_set == "bench_gemm" else "library_kernels_decode.json"
    )
    (args.out / name).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
