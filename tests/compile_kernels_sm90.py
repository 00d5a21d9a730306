"""Compile ficco's bf16 GEMM kernels for an H100/H200 (sm_90) on a machine without a GPU.

Run without TRITON_INTERPRET (the interpreter compiles nothing), it lowers the persistent TMA
kernel (whole tiles and the split tail, plain and swap-AB) and the fused kernel (TMA loads;
host-built or in-kernel descriptors; tiles in ready runs); ``--flag-waits``: the CTA barriers
inside the flag waits' spins (there must be none)
through PTX to a cubin with Triton's bundled ptxas, for each configuration named (default:
the first three of the bf16 space), and prints per kernel as JSON: the wgmma instructions in
the PTX, registers, spills, shared memory. Exit status 3: no offline compile entry point.

    python tests/compile_kernels_sm90.py [--all]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_kernels_sm90: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import triton  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the FP8 script's offline compile (it exits 3 where this Triton has none)
from compile_scaled_sm90 import _compile, _report  # noqa: E402

from ficco.kernels.configs import GPU_CONFIGS, GemmConfig  # noqa: E402
from ficco.kernels.fused_kernel import _TABLE_COLS, _fused_gemm_kernel  # noqa: E402
from ficco.kernels.persistent import _matmul_tma_kernel  # noqa: E402


def compile_persistent(cfg: GemmConfig, split_tail: bool, swap_ab: bool = False) -> dict:
    t0 = time.perf_counter()
    c_cols = cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
    c_block = [c_cols, cfg.block_m] if swap_ab else [cfg.block_m, c_cols]
    descs = {
        "a_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_k}]>",
        "b_desc": f"tensordesc<bf16[{cfg.block_k}, {cfg.block_n}]>",
        "c_desc": f"tensordesc<bf16[{c_block[0]}, {c_block[1]}]>",
    }
    pointers = {"ws_ptr": "fp32", "lock_ptr": "i32"}
    constants = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        A_COL_MAJOR=False, B_COL_MAJOR=False, ACCUMULATE=False,
        EPILOGUE_SUBTILE=cfg.epilogue_subtile, SPLIT_TAIL=split_tail, TRANSPOSE_C=swap_ab,
        INPUT_PRECISION="tf32",
    )  # fmt: skip
    return _report(_compile(_matmul_tma_kernel, pointers, descs, constants, cfg), t0)


def compile_fused(cfg: GemmConfig, pointer_stores: bool, **options: bool) -> dict:
    """`fused_kernel`'s compile (``options``: its keyword flags), reported."""
    t0 = time.perf_counter()
    return _report(fused_kernel(cfg, pointer_stores, **options), t0)


def fused_kernel(
    cfg: GemmConfig,
    pointer_stores: bool,
    host_descs: bool = True,
    split_tail: bool = False,
    offsets_32: bool = False,
    ready_runs: bool = False,
):
    """The fused kernel compiled for sm_90 (`compile_fused` reports on it)."""
    # pointer stores come with reset_waits here; without them the claim-only exit compiles
    pointers = {
        **dict.fromkeys(("a_ref", "b_ptr", "c_ref"), "bf16"),
        **dict.fromkeys(
            ("flag_ref", "tile_chunk_ptr", "work_ptr", "lock_ptr", "status_ptr"), "i32"
        ),
        "ws_ptr": "fp32",
        **dict.fromkeys(("table_ptr", "copy_ptr"), "i64"),
        **dict.fromkeys(("a_scale_ref", "b_scale_ptr"), "i32"),
    }
    c_cols = cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
    descs = {
        "b_desc": f"tensordesc<bf16[{cfg.block_k}, {cfg.block_n}]>",
        "a_host_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_k}]>",
        "c_host_desc": f"tensordesc<bf16[{cfg.block_m}, {c_cols}]>",
    }
    constants = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        A_ALIGN=8, C_ALIGN=8, USE_TMA=True, B_COL_MAJOR=False,
        EPILOGUE_SUBTILE=cfg.epilogue_subtile, ON_GPU=True, INPUT_PRECISION="tf32",
        TABLE_COLS=_TABLE_COLS, POINTER_STORES=pointer_stores, SCALED=False, A_ROWWISE=False,
        B_COLWISE=False, IMPRECISE_ACC=None, RESET_WAITS=pointer_stores, HOST_DESCS=host_descs,
        SPLIT_TAIL=split_tail, OFFSETS_32=offsets_32, READY_RUNS=ready_runs,
    )  # fmt: skip
    return _compile(_fused_gemm_kernel, pointers, descs, constants, cfg)


def spin_barriers(ptx: str) -> int | None:
    """CTA barriers (``bar.sync``) inside a flag wait's spin: from the first ``%globaltimer``
    read to the first ``ld.acquire.sys`` after the last one (the read that ends a give-up).
    Threads leave the spin on their own reads, so a barrier there waits for warps that have
    gone (a hang). None: no spin in the PTX."""
    lines = ptx.splitlines()
    reads = [i for i, line in enumerate(lines) if "%globaltimer" in line]
    if not reads:
        return None
    end = next(
        (i for i in range(reads[-1], len(lines)) if "ld.acquire.sys" in lines[i]), len(lines)
    )
    return sum("bar.sync" in line for line in lines[reads[0] : end])


def compile_flag_waits() -> dict:
    """The one-program flag wait (``flags._wait_flags_kernel``, four warps) and the fused
    kernel in ready runs: their spins' barriers (`spin_barriers`), and the wait kernel's in all."""
    from ficco.kernels.flags import _wait_flags_kernel

    wait = _compile(
        _wait_flags_kernel,
        {"flag_ref": "i32", "offsets_ptr": "i64", "status_ptr": "i32"},
        {},
        {"USE_CLOCK": True},
        GemmConfig(64, 64, 64, 8, 1, 4),
    ).asm["ptx"]
    fused = fused_kernel(GemmConfig(128, 128, 64, 8, 4, 8), False, ready_runs=True).asm["ptx"]
    return {
        "wait_flags": {"spin_barriers": spin_barriers(wait), "barriers": wait.count("bar.sync")},
        "fused_ready_runs": {"spin_barriers": spin_barriers(fused)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every configuration of the space")
    parser.add_argument(
        "--flag-waits",
        action="store_true",
        help="only the flag waits' spins (`compile_flag_waits`)",
    )
    args = parser.parse_args()
    if args.flag_waits:
        print(json.dumps({"triton": triton.__version__, "flag_waits": compile_flag_waits()}))
        return
    configs = GPU_CONFIGS if args.all else GPU_CONFIGS[:3]
    found = {}
    for cfg in configs:
        found[cfg.name] = {
            "whole": compile_persistent(cfg, False),
            "split_tail": compile_persistent(cfg, True),
            "fused": compile_fused(cfg, False),
            "fused_pointer_stores": compile_fused(cfg, True),
            "fused_pointer_stores_offsets_32": compile_fused(cfg, True, offsets_32=True),
            "fused_device_descriptors": compile_fused(cfg, True, host_descs=False),
            "fused_split_tail": compile_fused(cfg, False, split_tail=True),
            "fused_ready_runs": compile_fused(cfg, False, ready_runs=True),
        }
    swap = GemmConfig(16, 128, 128, 8, 5, 4, swap_ab=True)
    found[swap.name] = {
        "split_tail": compile_persistent(GemmConfig(128, 16, 128, 8, 5, 4), True, swap_ab=True)
    }
    print(json.dumps({"triton": triton.__version__, "kernels": found}))


if __name__ == "__main__":
    main()
