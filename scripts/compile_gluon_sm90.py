#!/usr/bin/env python3
"""Compile the warp-specialized Gluon GEMM (`ficco.kernels.gluon_gemm`) for sm_90 on a
machine without a GPU, through PTX to a cubin with Triton's bundled ptxas, and print per
configuration as JSON: the wgmma instructions, setmaxnreg counts, registers, spills and
shared memory (or the compile error), and a digest of its PTX without debug lines and
labels: two trees whose digests agree compile to the same instructions (a refactor's check
on a machine without a GPU). Needs Triton's Gluon (3.6 on the GPU image; a later one compiles
through `_renamed_since_36`).

    python scripts/compile_gluon_sm90.py [--fp8] [--digests FILE [--against FILE]]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_gluon_sm90: unset TRITON_INTERPRET (the interpreter compiles nothing)")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import triton  # noqa: E402
from compile_scaled_sm90 import _ptxas  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import tma  # noqa: E402

from ficco.kernels import gluon_gemm as gg  # noqa: E402


def _renamed_since_36() -> list[str]:
    """Gluon names the kernels use (the GPU image's, Triton 3.6) that a later Triton renamed
    (3.9: the old names only raise, or are gone): each bound here to its successor, the same
    op with its defaults (no multicast, no cache policy, no cluster); the names bound."""
    renames = []
    old = inspect.signature(tma.async_copy_global_to_shared).parameters
    if hasattr(tma, "async_load") and "tensor_desc" not in old:
        tma.async_copy_global_to_shared = tma.async_load
        tma.async_copy_shared_to_global = tma.async_store
        renames += ["tma.async_copy_global_to_shared", "tma.async_copy_shared_to_global"]
    if not hasattr(gl, "thread_barrier"):
        gl.thread_barrier = gl.barrier
        renames.append("gl.thread_barrier")
    return renames


RENAMED = _renamed_since_36()

DTYPES = {"bf16": gl.bfloat16, "fp8e4nv": gl.float8e4nv}


def desc(dtype: str, block: list[int]) -> str:
    layout = gl.NVMMASharedLayout.get_default_for(block, DTYPES[dtype])
    return f"tensordesc<{dtype}[{block[0]}, {block[1]}],{layout!r}>"


def compile_config(
    cfg: gg.GluonGemmConfig, dtype: str, fast: bool = False, fused: bool = False
) -> dict:
    """One configuration compiled for sm_90: `ws_gemm_kernel`, or (``fused``, FP8) the
    fused launch's `ws_fused_kernel`."""
    t0 = time.perf_counter()
    fp8 = dtype != "bf16"
    b_block = [cfg.block_n, cfg.block_k] if fp8 or cfg.swap_ab else [cfg.block_k, cfg.main_n]
    # swap-AB: A is the weight's [block_k, block_m] blocks, C out's [block_n, block_m]
    a_rows = cfg.rows_per_consumer if cfg.consumers == 3 else cfg.block_m
    a_block = [cfg.block_k, cfg.block_m] if cfg.swap_ab else [a_rows, cfg.block_k]
    c_cols = cfg.main_n // (2 if cfg.split_epilogue else 1)
    c_rows = cfg.rows_per_consumer
    c_block = [cfg.block_n, cfg.block_m] if cfg.swap_ab else [c_rows, c_cols]
    signature = {
        "a_desc": desc(dtype, a_block),
        "b_desc": desc(dtype, b_block),
        "c_desc": desc("bf16", c_block),
        # without a tail the kernel never reads these two (the launcher passes b's and c's)
        "b_tail_desc": desc(dtype, [cfg.block_k, cfg.tail_n or cfg.main_n]),
        "c_tail_desc": desc("bf16", [c_rows, cfg.tail_n or cfg.main_n]),
        "a_scale_ptr": "*fp32",
        "b_scale_ptr": "*fp32",
        # the fused launch's own (`ficco.kernels.gluon_fused`)
        "a_scale_ref": "*fp32",
        "chunk_table": "*i64",
        "flag_ref": "*i32",
        "status_ptr": "*i32",
        "chunk_rows": "i32",
        "chunks": "i32",
        "budget_ns": "i64",
        "chunk_multiplier": "i32",
        "first_a_row": "i32",
        "first_flag": "*i32",
        "first_waits": "i32",
        "a2_desc": desc(dtype, a_block),
        # a split tail's (`gluon_gemm.SplitTail`)
        "ws_ptr": "*fp32",
        "lock_ptr": "*i32",
        "dp_tiles": "i32",
        "split": "i32",
        "k_per_split": "i32",
    }
    constants = dict(
        STAGES=cfg.stages, CONSUMERS=cfg.consumers,
        PRODUCER_REGS=gg.PRODUCER_REGS, CONSUMER_REGS=gg.CONSUMER_REGS, FAST_ACCUM=fast,
        TAIL=cfg.tail_n > 0, SWAP_AB=cfg.swap_ab, SPLIT_TAIL=cfg.split_tail,
    )  # fmt: skip
    fn = gg.ws_fused_kernel if fused else gg.ws_gemm_kernel
    names = fn.arg_names
    if fused:
        constants = {k: v for k, v in constants.items() if k in names}
    for name in constants:
        signature[name] = "constexpr"
    signature = {name: signature[name] for name in names}
    source = GluonASTSource(
        fn, signature, constexprs={(names.index(k),): v for k, v in constants.items()}
    )
    max_regs = gg.THIRDS_MAX_REGS if cfg.consumers == 3 else gg.MAX_REGS
    options = dict(num_warps=cfg.consumer_warps, maxnreg=max_regs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = kernel.asm["ptx"]
    return {
        "config": cfg.name,
        "dtype": dtype,
        "fast_accum": fast,
        "fused": fused,
        "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w.]+", ptx))),
        "setmaxnreg": sorted(
            set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))
        ),
        "ptxas": _ptxas(ptx),
        "ptx_digest": ptx_digest(ptx),
        "shared": getattr(kernel.metadata, "shared", None),
        "compile_s": round(time.perf_counter() - t0, 2),
    }


def ptx_digest(ptx: str) -> str:
    """sha256 of the PTX's instructions: debug sections, comments (whole lines and trailing),
    .loc/.file lines and the debug labels ($L__tmpN, numbered by inlined calls) left out,
    and virtual registers
    renumbered in order of first use (%r38 <-> %r40 where two values were created in
    another order: the same instructions on the same data)."""
    code = re.split(r"\.section\s+\.debug", ptx)[0]
    kept = "\n".join(
        re.sub(r"\s*//.*$", "", line)  # a line's trailing comment (LLVM's loop notes)
        for line in code.splitlines()
        if not re.match(r"\s*(//|\.loc|\.file)|\$L__tmp\d+:$", line)
    )
    names: dict[str, str] = {}
    used: Counter = Counter()

    def renumber(reg: re.Match) -> str:
        if reg.group(0) not in names:
            kind = reg.group(1)
            names[reg.group(0)] = f"%{kind}#{used[kind]}"
            used[kind] += 1
        return names[reg.group(0)]

    # register declarations (`.reg .b32 %r<489>;`) keep their counts: the same registers
    kept = re.sub(r"%(rd|rs|r|fd|f|p|hh|h)(\d+)\b", renumber, kept)
    return hashlib.sha256(kept.encode()).hexdigest()


CONFIGS = list(gg.BF16_CONFIGS)
FP8_CONFIGS = list(gg.FP8_CONFIGS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp8", action="store_true", help="the FP8 configurations too")
    ap.add_argument(
        "--fused",
        action="store_true",
        help="the FP8 configurations' fused kernel instead (ws_fused_kernel; no digests)",
    )
    ap.add_argument("--digests", type=Path, help="write {config|dtype|fast: ptx digest} here")
    ap.add_argument("--against", type=Path, help="another tree's --digests file: list what differs")
    ap.add_argument("--only", default=None, help="configurations whose name contains this text")
    args = ap.parse_args()
    if args.only and args.digests:
        ap.error("--only compiles part of the space: its digests would not be the tree's")
    if args.against and not args.digests:
        ap.error("--against needs --digests")
    digests = {}
    if args.fused and args.digests:
        ap.error("--fused compiles another kernel: its digests are not the measured trees'")
    todo = [(c, "bf16", False) for c in CONFIGS] + (
        [(c, "fp8e4nv", fast) for fast in (False, True) for c in FP8_CONFIGS] if args.fp8 else []
    )
    if args.fused:
        todo = [(c, "fp8e4nv", fast) for fast in (False, True) for c in FP8_CONFIGS]
    if args.only:
        todo = [t for t in todo if args.only in t[0].name]
    failed = 0
    for cfg, dtype, fast in todo:
        try:
            row = compile_config(cfg, dtype, fast, fused=args.fused)
            digests[f"{cfg.name}|{dtype}|{fast}"] = row["ptx_digest"]
            print(json.dumps(row))
        except Exception as exc:  # reported per configuration
            failed += 1
            print(
                json.dumps(
                    {
                        "config": cfg.name,
                        "dtype": dtype,
                        "error": f"{type(exc).__name__}: {exc}"[:3000],
                    }
                )
            )
    if args.digests:
        args.digests.write_text(json.dumps(digests, indent=1))
    if args.against:
        before = json.loads(args.against.read_text())
        differ = sorted(
            k for k in digests.keys() | before.keys() if digests.get(k) != before.get(k)
        )
        print(json.dumps({"compared": len(digests), "differ": differ, "renamed": RENAMED}))
        failed += len(differ)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
