#!/usr/bin/env python3
"""One FP8 shape through `torch._scaled_mm` and named Gluon configurations, each checked
against the float64 product and then launched a few times: a target for Nsight Compute, so
the library's kernel and ficco's can be read side by side (tensor-pipe activity, shared-memory
and L2 throughput, stall reasons).

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight \\
        --section WarpStateStats --csv \\
        python scripts/fp8_gemm_profile_target.py --shape 8192x8192x14336 \\
            --configs ws_128x128x128_s6_coop2x4

Per variant (the library's kernel first, then each configuration in the order given): one
launch checked against the product, one inside the NVTX range ``profile`` (what ncu
profiles with ``--nvtx-include "profile/"``), then `--launches` timed ones. Prints each
variant's relative error and its median time (CUDA events; under ncu the timed launches are
not profiled but run beside its work, so take times from a run without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gemm import parse_dims  # noqa: E402

LIMIT = 1e-2  # one bf16 rounding of the output plus accumulation order


def timed(fn, launches: int) -> float:
    times = []
    for _ in range(launches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="MxNxK")
    ap.add_argument("--configs", required=True, help="comma list of Gluon FP8 config names")
    ap.add_argument("--launches", type=int, default=3, help="launches after the checked one")
    args = ap.parse_args(argv)
    ((m, n, k),) = parse_dims("--shape", args.shape, 3)
    from ficco.kernels import gluon_gemm as gg
    from ficco.kernels.scaled import random_operands

    by_name = {c.name: c for c in gg.FP8_CONFIGS}
    names = args.configs.split(",")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        ap.error(f"--configs: not FP8 configurations: {unknown} (of {sorted(by_name)})")
    a, b, sa, sb, _ = random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=11)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)

    def library() -> None:
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=out)

    variants = [("_scaled_mm", library)]
    for name in names:
        variants.append(
            (name, gg.ws_gemm_launcher(a, b, out, by_name[name], a_scale=sa, b_scale=sb))
        )
    failed = 0
    for name, fn in variants:
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        error = float((out.double() - ref).norm() / ref.norm())
        ok = error <= LIMIT
        failed += not ok
        with torch.cuda.nvtx.range("profile"):
            fn()
        torch.cuda.synchronize()
        ms = timed(fn, args.launches) if ok else float("nan")
        tflops = 2 * m * n * k / ms / 1e9 if ok else float("nan")
        print(
            f"{name:32s} error {error:.2e} {'ok' if ok else 'WRONG'}  {ms:.3f} ms  {tflops:.0f} TFLOP/s"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
