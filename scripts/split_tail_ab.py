#!/usr/bin/env python3
"""What the Gluon FP8 kernel's split tail (`GluonGemmConfig.split_tail`) costs and gains on one
GPU, per shape and tile: the tile without it (`whole`), the split-tail kernel over whole tiles
only (`split_kernel`: compiled with the split, every unit a whole tile: what carrying the
split costs the other tiles), the split as planned (`split`), and `_scaled_mm`; each checked
against the float64 product first, then timed in interleaved rounds (`LaunchTimer`). The
wave model's gain (`ideal`: whole waves over waves with the tail split) is printed beside.
JSON to --out.

    python scripts/split_tail_ab.py --out FILE [--shapes MxNxK,...] [--configs NAME,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

SHAPES = "16384x8192x4096,4096x4096x7168,4096x4096x2048,2048x8192x14336,1024x3072x4096"
CONFIGS = "ws_192x128x128_s4_coop3x4_split,ws_128x128x128_s6_coop2x4_split"


def ideal_gain(plan, programs: int) -> float:
    """Whole waves over the waves a split plan runs (the wave model, no fix-up cost)."""
    tiles = plan.dp_tiles + plan.tail_tiles
    return -(-tiles // programs) / (plan.dp_tiles / programs + 1 / plan.split)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    from bench_gemm import fingerprint, parse_dims
    from fused_gluon_ab import check_then_time, fp8_configs_named, library_case

    from ficco.kernels.configs import SplitPlan

    try:  # bad input refused before any GPU work
        shapes = parse_dims("--shapes", args.shapes, 3)
        configs = fp8_configs_named(
            args.configs, lambda c: c.split_tail, "split-tail tiles of the FP8 space"
        )
        if args.rounds < 1:
            raise ValueError(f"--rounds: at least 1, got {args.rounds}")
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        sys.exit("split_tail_ab: no CUDA device")

    from ficco.execute.timing import launch_timer
    from ficco.kernels import gluon_gemm as gg
    from ficco.kernels.persistent import default_sm_budget

    timer = launch_timer()
    programs = default_sm_budget("cuda")
    rows = []
    for m, n, k in shapes:
        a, b, sa, sb, ref, fns, outs = library_case(m, n, k)
        ideal = {}
        for name, cfg in configs.items():
            plan = gg.tail_plan(cfg, m, n, k, programs)
            if plan is None:
                continue
            ideal[name] = ideal_gain(plan, programs)
            whole = replace(cfg, split_tail=False)
            tiles = plan.dp_tiles + plan.tail_tiles
            k_steps = -(-k // cfg.block_k)
            for key, variant, forced in (
                (f"whole {name}", whole, None),
                (f"split_kernel {name}", cfg, SplitPlan(tiles, 0, 1, k_steps)),
                (f"split {name}", cfg, None),
            ):
                out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
                real = gg.tail_plan
                if forced is not None:  # the split kernel, every unit a whole tile
                    gg.tail_plan = lambda *_a, forced=forced: forced
                try:
                    fns[key] = gg.ws_gemm_launcher(
                        a, b, out, variant, a_scale=sa, b_scale=sb, programs=programs
                    )
                finally:
                    gg.tail_plan = real
                outs[key] = out
        row = {"M": m, "N": n, "K": k, "ideal": ideal}
        row.update(check_then_time(fns, outs, ref, timer, args.rounds))
        rows.append(row)
        print(
            f"{m}x{n}x{k}",
            {key: round(r, 3) for key, r in row["ratio"].items()},
            "ideal",
            {key: round(g, 3) for key, g in ideal.items()},
            "bad",
            row["bad"],
            flush=True,
        )
    doc = {"environment": fingerprint(None), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
