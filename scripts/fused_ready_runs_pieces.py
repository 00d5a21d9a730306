#!/usr/bin/env python3
"""The fused GEMM's ready runs (``FusedGemm(ready_runs=...)``) launch by launch on one GPU, to
find which launch hangs: six equal 256-row chunks of A [1536, 1024] against B [1024, 1536],
five waiting on flags, 128x128x64 tiles. A piece is ``KIND:PROGRAMS:CHUNK_GROUP:RUNS``:

  KIND   preset (every flag set), late (a side stream sets the flags 1 ms apart) or timeout
         (the third late chunk never arrives; 0.2 s budget)
  RUNS   true / false / none (``ready_runs``; none is the default: claims at cf4dd4e and
         f0b8306, ready runs at eaaae54, when ``ready_pieces_callR.log`` was written, and
         runs where the tiles outnumber the programs since)

By default the pieces run one after another in this process, as a test file runs them (a
launch that hangs there dumps every thread's stack after ``--hang-s``); ``--separate`` runs
each in a process of its own (``--hang-s`` then ends it). Prints each piece's grid, time,
status, NaN rows and relative error.

    python scripts/fused_ready_runs_pieces.py late:7:1:true late:120:2:true timeout:120:2:true
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("preset", "late", "timeout")
RUNS = {"true": True, "false": False, "none": None}


def parse(spec: str) -> tuple[str, int, int, bool | None]:
    parts = spec.split(":")
    if len(parts) != 4 or parts[0] not in KINDS or parts[3] not in RUNS:
        raise argparse.ArgumentTypeError(
            f"piece {spec!r}: expected KIND:PROGRAMS:CHUNK_GROUP:RUNS with KIND one of "
            f"{', '.join(KINDS)} and RUNS one of {', '.join(RUNS)}"
        )
    try:
        return parts[0], int(parts[1]), int(parts[2]), RUNS[parts[3]]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"piece {spec!r}: PROGRAMS and CHUNK_GROUP are ints"
        ) from None


def run_piece(kind: str, programs: int, group: int, ready_runs: bool | None) -> str:
    import torch  # here: argument errors need no torch

    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(7)
    a = torch.randn(1536, 1024, generator=gen, device=dev).bfloat16()
    b = torch.randn(1024, 1536, generator=gen, device=dev).bfloat16()
    out = torch.full((1536, 1536), float("nan"), device=dev, dtype=torch.bfloat16)
    flags = torch.zeros(5, dtype=torch.int32, device=dev)
    chunks = [FusedChunkViews(a[0:256], out[0:256])] + [
        FusedChunkViews(a[lo : lo + 256], out[lo : lo + 256], wait=flags[i : i + 1])
        for i, lo in enumerate(range(256, 1536, 256))
    ]
    if kind == "preset":
        flags.fill_(1)
    elif kind == "timeout":
        flags[[0, 1, 3, 4]] = 1
    kernel = FusedGemm(
        chunks, b, sm_budget=programs, timeout_s=0.2 if kind == "timeout" else 5.0,
        config=GemmConfig(128, 128, 64, 8, 4, 8, chunk_group=group), ready_runs=ready_runs,
    )  # fmt: skip
    kernel.compile()
    torch.cuda.synchronize()
    start = time.time()
    if kind == "late":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(5):
                torch.cuda._sleep(2_000_000)
                flags[i : i + 1].fill_(1)
    kernel()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    err = float((out.float() - ref).nan_to_num(0).norm() / ref.norm())
    return (
        f"grid {kernel.grid[0]} runs {kernel.ready_runs_refusal() or 'apply'}: done in "
        f"{time.time() - start:.3f} s, status {kernel.status.tolist()}, NaN rows "
        f"{int(out.isnan().any(1).sum())}, error {err:.2e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pieces", nargs="+", type=parse, metavar="KIND:PROGRAMS:GROUP:RUNS")
    parser.add_argument("--separate", action="store_true", help="each piece in its own process")
    parser.add_argument("--hang-s", type=float, default=25.0, help="when a piece counts as hung")
    parser.add_argument("--piece-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["CUDA_MODULE_LOADING"] = "EAGER"  # as ficco's ranks
    for piece in args.pieces:
        name = ":".join("none" if v is None else str(v).lower() for v in piece)
        if args.separate and not args.piece_only:
            cmd = [sys.executable, __file__, "--piece-only", name]
            try:
                got = subprocess.run(cmd, capture_output=True, text=True, timeout=args.hang_s)
                print(name, got.stdout.strip() or got.stderr.strip()[-400:], flush=True)
            except subprocess.TimeoutExpired:
                print(name, f"HUNG (over {args.hang_s:g} s)", flush=True)
            continue
        faulthandler.dump_traceback_later(args.hang_s, exit=True)
        print(name if not args.piece_only else "", run_piece(*piece), flush=True)
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
