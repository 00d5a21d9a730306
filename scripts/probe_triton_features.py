#!/usr/bin/env python3
"""Which Triton GEMM features this GPU image has, and whether warp specialization compiles
and pays on this card: a non-persistent TMA GEMM with and without
``tl.range(..., warp_specialize=True)`` on 8192^3 bf16, both checked against cuBLAS, then
timed (``triton.testing.do_bench`` median) beside it.

    python scripts/probe_triton_features.py     # JSON to $OUT/triton_features.json

The JSON is rewritten after every variant, so a time cap keeps what was answered.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _tma_gemm(a_desc, b_desc, c_desc, K, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
        a = a_desc.load([pid_m * BM, ki * BK])
        b = b_desc.load([ki * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def main() -> int:
    from triton.tools.tensor_descriptor import TensorDescriptor

    report: dict = {
        "triton": triton.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "tl.range parameters": list(inspect.signature(tl.range.__init__).parameters)[1:],
        "triton.Config parameters": list(inspect.signature(triton.Config.__init__).parameters)[1:],
        "tl.make_tensor_descriptor": hasattr(tl, "make_tensor_descriptor"),
        "host TensorDescriptor": True,
    }
    out = Path(os.environ.get("OUT", ".")) / "triton_features.json"
    out.write_text(json.dumps(report, indent=1))  # what is known before any compile
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    ref = a.float() @ b.float()
    bm, bn, bk = 128, 256, 64
    runs = {}
    # the warp-specialized variants first: they are the question
    for ws in (True, False):
        for stages, warps in ((3, 8), (4, 8)):
            name = f"{bm}x{bn}x{bk}_s{stages}_w{warps}{'_ws' if ws else ''}"
            c = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            args = (
                TensorDescriptor.from_tensor(a, [bm, bk]),
                TensorDescriptor.from_tensor(b, [bk, bn]),
                TensorDescriptor.from_tensor(c, [bm, bn]),
                n,
            )

            def run(args=args, ws=ws, stages=stages, warps=warps):
                _tma_gemm[(n // bm, n // bn)](
                    *args, WS=ws, BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=warps
                )

            try:
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                err = float((c.float() - ref).norm() / ref.norm())
                ms = triton.testing.do_bench(run, warmup=10, rep=60, return_mode="median")
                runs[name] = {"ok": err < 1e-2, "rel_err": err, "ms": ms, "compile_s": compile_s}
            except Exception as exc:
                runs[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400],
                              "trace": traceback.format_exc()[-800:]}  # fmt: skip
            print(name, {k: v for k, v in runs[name].items() if k != "trace"}, flush=True)
            report["gemm_8192^3"] = {"runs": runs}
            out.write_text(json.dumps(report, indent=1))  # after every variant: a cap keeps it
    cublas = triton.testing.do_bench(lambda: a @ b, warmup=10, rep=60, return_mode="median")
    report["gemm_8192^3"] = {"cublas_ms": cublas, "runs": runs}
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "gemm_8192^3"}))
    for name, r in runs.items():
        print(name, {k: v for k, v in r.items() if k != "trace"}, f"cublas {cublas:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
