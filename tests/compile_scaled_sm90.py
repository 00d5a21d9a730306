"""Compile ficco's FP8 GEMM kernels for an H100/H200 (sm_90) on a machine without a GPU.

Run without TRITON_INTERPRET (the interpreter compiles nothing), it lowers the persistent
FP8 kernel (``ficco.kernels.scaled``) and the fused kernel with FP8 operands through PTX to a
cubin with Triton's bundled ptxas, for each configuration named (default: the first of the
FP8 space), and prints per kernel as JSON: the FP8 wgmma instructions and wgmma waits in the
PTX, ptxas's performance notes (C7514/C7515: wgmmas serialized), registers, spills, shared
memory. Exit status 3: this Triton has no offline compile entry point.

    python tests/compile_scaled_sm90.py [--all | --config NAME ...] [--fast-accum] [--no-fused]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_scaled_sm90: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as err:  # pragma: no cover - another Triton's layout
    print(f"no offline compile here: {err}", file=sys.stderr)
    sys.exit(3)

from ficco.kernels.configs import GemmConfig  # noqa: E402
from ficco.kernels.fused_kernel import _TABLE_COLS, _fused_gemm_kernel  # noqa: E402
from ficco.kernels.scaled_configs import FP8_GPU_CONFIGS  # noqa: E402
from ficco.kernels.scaled_kernel import (  # noqa: E402
    _scaled_mm_tma_kernel,
    imprecise_acc,
    lagged,
    split_rows,
)


def _compile(fn, pointers: dict, descs: dict, constants: dict, cfg: GemmConfig):
    names = fn.arg_names
    # a constexpr left out takes its default (not a runtime argument)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constants = {**defaults, **constants}
    signature = {}
    for name in names:
        if name in pointers:
            signature[name] = "*" + pointers[name]
        elif name in descs:
            signature[name] = descs[name]
        elif name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = "i64" if name == "budget_ns" else "i32"
    source = ASTSource(
        fn, signature, constexprs={(names.index(k),): v for k, v in constants.items()}
    )
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    if not kernel.asm.get("cubin"):
        raise RuntimeError("ptxas produced no cubin")
    return kernel


def _ptxas(ptx: str) -> dict | None:
    """ptxas's performance notes on the PTX (wgmma serialization C7514/C7515, waits it
    injects C7517), registers and spill bytes, from Triton's bundled ptxas run again
    verbosely; None where it cannot be found."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except Exception:  # pragma: no cover - another Triton's layout
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        got = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
        )
    text = got.stdout + got.stderr
    used = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    return {
        "notes": sorted(set(re.findall(r"\((C75\d\d)\)", text))),
        "registers": int(used.group(1)) if used else None,
        "spill_bytes": int(spills.group(1)) if spills else None,
    }


def _report(kernel, t0: float) -> dict:
    ptx = kernel.asm["ptx"]
    meta = kernel.metadata
    return {
        "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w.]+", ptx))),
        "waits": re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx),
        "ptxas": _ptxas(ptx),
        "shared": getattr(meta, "shared", None),
        "compile_s": round(time.perf_counter() - t0, 2),
    }


def compile_scaled(
    cfg: GemmConfig, fast_accum: bool, dtype: str = "fp8e4nv", b_k_major: bool = True
) -> dict:
    """The persistent FP8 kernel for one configuration (per-row and per-column scales; B
    column-major, or row-major where not ``b_k_major``)."""
    t0 = time.perf_counter()
    c_cols = cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
    b_block = [cfg.block_n, cfg.block_k] if b_k_major else [cfg.block_k, cfg.block_n]
    split = split_rows(cfg, fast_accum)
    descs = {
        "a_desc": f"tensordesc<{dtype}[{cfg.block_m // (2 if split else 1)}, {cfg.block_k}]>",
        "b_desc": f"tensordesc<{dtype}[{b_block[0]}, {b_block[1]}]>",
        "c_desc": f"tensordesc<bf16[{cfg.block_m}, {c_cols}]>",
    }
    pointers = dict.fromkeys(("a_scale_ptr", "b_scale_ptr"), "fp32")
    constants = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        B_K_MAJOR=b_k_major, A_ROWWISE=True, B_COLWISE=True, EPILOGUE_SUBTILE=cfg.epilogue_subtile,
        IMPRECISE_ACC=imprecise_acc(cfg, fast_accum),
        PROMOTE_EVERY=1 if fast_accum else cfg.promote_every,
        WARP_SPECIALIZE=cfg.warp_specialize, LAGGED=lagged(cfg, fast_accum),
        FLATTEN=not lagged(cfg, fast_accum), SPLIT_ROWS=split,
    )  # fmt: skip
    return _report(_compile(_scaled_mm_tma_kernel, pointers, descs, constants, cfg), t0)


def compile_fused(cfg: GemmConfig, fast_accum: bool, dtype: str = "fp8e4nv") -> dict:
    """The fused kernel with FP8 operands (TMA loads, B column-major) for one configuration."""
    t0 = time.perf_counter()
    pointers = {
        **dict.fromkeys(("a_ref", "b_ptr"), dtype),
        "c_ref": "bf16",
        **dict.fromkeys(
            ("flag_ref", "tile_chunk_ptr", "work_ptr", "lock_ptr", "status_ptr"), "i32"
        ),
        "ws_ptr": "fp32",
        **dict.fromkeys(("table_ptr", "copy_ptr"), "i64"),
        **dict.fromkeys(("a_scale_ref", "b_scale_ptr"), "fp32"),
    }
    descs = {"b_desc": f"tensordesc<{dtype}[{cfg.block_n}, {cfg.block_k}]>"}
    constants = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        A_ALIGN=16, C_ALIGN=8, USE_TMA=True, B_COL_MAJOR=True,
        EPILOGUE_SUBTILE=cfg.epilogue_subtile, ON_GPU=True, INPUT_PRECISION="tf32",
        TABLE_COLS=_TABLE_COLS, POINTER_STORES=False, SCALED=True, A_ROWWISE=True, B_COLWISE=True,
        IMPRECISE_ACC=imprecise_acc(cfg, fast_accum),
    )  # fmt: skip
    return _report(_compile(_fused_gemm_kernel, pointers, descs, constants, cfg), t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every configuration of the space")
    parser.add_argument("--fast-accum", action="store_true")
    parser.add_argument("--no-fused", action="store_true")
    parser.add_argument("--config", action="append", help="a configuration's name (repeatable)")
    args = parser.parse_args()
    configs = FP8_GPU_CONFIGS if args.all else FP8_GPU_CONFIGS[:1]
    if args.config:
        by_name = {c.name: c for c in FP8_GPU_CONFIGS}
        configs = [by_name[name] for name in args.config]
    found = {}
    for cfg in configs:
        found[cfg.name] = {
            "scaled": compile_scaled(cfg, args.fast_accum),
            "scaled_b_row_major": compile_scaled(cfg, args.fast_accum, b_k_major=False),
        }
        if not args.no_fused:
            found[cfg.name]["fused"] = compile_fused(cfg, args.fast_accum)
    print(json.dumps({"triton": triton.__version__, "kernels": found}))


if __name__ == "__main__":
    main()
