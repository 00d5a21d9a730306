#!/usr/bin/env python3
"""The fused GEMM's ready runs (``FusedGemm(ready_runs=...)``) piece by piece on one GPU, each
piece in its own process with a 25 s limit, to find which launch hangs: six equal 256-row
chunks, 128x128 tiles; a piece is ``kind:programs:chunk_group:ready_runs`` with kind
``preset`` (every flag set), ``late`` (a side stream sets the flags 1 ms apart) or
``timeout`` (one chunk never arrives, 0.2 s budget), ready_runs ``none``/``true``/``false``.
Prints each piece's grid, time, status, NaN rows and relative error (or TIMEOUT).

    python scripts/fused_ready_runs_pieces.py preset:120:2:true timeout:120:2:true ...
"""

import os
import subprocess
import sys
import time

PIECE = r"""
import sys, time, torch
sys.path.insert(0, ".")
from ficco.kernels.configs import GemmConfig
from ficco.kernels.fused import FusedChunkViews, FusedGemm
piece, programs, group, rr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rr = None if rr == "none" else rr == "true"
DEV = torch.device("cuda", 0)
g = torch.Generator(device=DEV).manual_seed(7)
k, n = 1024, 1536
a = torch.randn(1536, k, generator=g, device=DEV).bfloat16()
b = torch.randn(k, n, generator=g, device=DEV).bfloat16()
out = torch.full((1536, n), float("nan"), device=DEV, dtype=torch.bfloat16)
flags = torch.zeros(5, dtype=torch.int32, device=DEV)
chunks = [FusedChunkViews(a[0:256], out[0:256])] + [FusedChunkViews(a[lo:lo+256], out[lo:lo+256], wait=flags[i:i+1]) for i, lo in enumerate(range(256, 1536, 256))]
cfg = GemmConfig(128, 128, 64, 8, 4, 8, chunk_group=group)
if piece == "preset":
    flags.fill_(1)
elif piece == "timeout":
    flags[[0, 1, 3, 4]] = 1
kern = FusedGemm(chunks, b, sm_budget=programs, timeout_s=(0.2 if piece == "timeout" else 5.0), config=cfg, ready_runs=rr)
kern.compile(); torch.cuda.synchronize()
print("grid", kern.grid, "tiles", kern.tiles, "tpc", kern.tiles_per_chunk, "group", kern.chunk_group, "refusal", repr(kern.ready_runs_refusal()), flush=True)
t = time.time()
if piece == "late":
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(5):
            torch.cuda._sleep(2_000_000); flags[i:i+1].fill_(1)
kern(); torch.cuda.synchronize()
print("done", round(time.time() - t, 3), "status", kern.status.tolist(), "nan rows", int(out.isnan().any(1).sum()), "err", float(((out.float() - a.float() @ b.float()).nan_to_num(0).norm() / (a.float()@b.float()).norm())), flush=True)
"""
os.environ["CUDA_MODULE_LOADING"] = "EAGER"
for args in sys.argv[1:]:
    piece, programs, group, rr = args.split(":")
    t = time.time()
    try:
        r = subprocess.run(
            [sys.executable, "-c", PIECE, piece, programs, group, rr],
            capture_output=True,
            text=True,
            timeout=25,
        )
        print(
            args,
            "rc",
            r.returncode,
            round(time.time() - t, 1),
            r.stdout.strip().replace("\n", " | "),
            r.stderr.strip()[-300:],
            flush=True,
        )
    except subprocess.TimeoutExpired as e:
        print(args, "TIMEOUT", (e.stdout or b"")[-300:], flush=True)
