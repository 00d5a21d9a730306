"""Compile ficco's fused GEMM kernel for an H100/H200 (sm_90) on a machine without a GPU.

Run without TRITON_INTERPRET (the interpreter never compiles), it lowers the kernel's GPU
code (``ON_GPU``: ``%globaltimer``, the proxy fences, the multi-destination epilogue and its
system-scope release of every destination's flag) through PTX to a cubin with Triton's
bundled ptxas, and prints, per load path, the PTX atomics it found, as JSON. Exit status 3:
this Triton has no offline compile entry point (the caller skips).

    python tests/compile_fused_sm90.py
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_fused_sm90: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as err:  # pragma: no cover - another Triton's layout
    print(f"no offline compile here: {err}", file=sys.stderr)
    sys.exit(3)

from ficco.kernels.fused_kernel import _TABLE_COLS, _fused_gemm_kernel  # noqa: E402


def compile_path(use_tma: bool, dtype: str = "bf16", block=(128, 128, 64)) -> str:
    """The PTX of one configuration of the fused kernel for sm_90."""
    bm, bn, bk = block
    pointers = {
        **dict.fromkeys(("a_ref", "b_ptr", "c_ref"), dtype),
        **dict.fromkeys(
            ("flag_ref", "tile_chunk_ptr", "work_ptr", "lock_ptr", "status_ptr"), "i32"
        ),
        "ws_ptr": "fp32",
        **dict.fromkeys(("table_ptr", "copy_ptr"), "i64"),
        **dict.fromkeys(("a_scale_ref", "b_scale_ptr"), "fp32"),
    }
    # every constexpr the launch leaves at its default (e.g. HOST_DESCS) stays a constexpr
    defaults = {
        p.name: p.default
        for p in _fused_gemm_kernel.params
        if p.is_constexpr and p.default is not inspect.Parameter.empty
    }
    constants = defaults | dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, A_ALIGN=8, C_ALIGN=8,
        USE_TMA=use_tma, B_COL_MAJOR=False, EPILOGUE_SUBTILE=False, ON_GPU=True,
        INPUT_PRECISION="tf32", TABLE_COLS=_TABLE_COLS,
        POINTER_STORES=True, SCALED=False, A_ROWWISE=False, B_COLWISE=False,
        IMPRECISE_ACC=None,
    )  # fmt: skip
    names = _fused_gemm_kernel.arg_names
    signature = {}
    for name in names:
        if name in pointers:
            signature[name] = "*" + pointers[name]
        elif name == "b_desc":  # the pointer path passes B itself
            signature[name] = f"tensordesc<{dtype}[{bk}, {bn}]>" if use_tma else "*" + dtype
        elif name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = "i64" if name == "budget_ns" else "i32"
    source = ASTSource(
        _fused_gemm_kernel,
        signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
    )
    target = GPUTarget("cuda", 90, 32)
    kernel = triton.compile(source, target=target, options=dict(num_warps=8, num_stages=3))
    if not kernel.asm.get("cubin"):
        raise RuntimeError("ptxas produced no cubin")
    return kernel.asm["ptx"]


def main() -> None:
    found = {}
    for path, use_tma in (("ptr", False), ("tma", True)):
        ptx = compile_path(use_tma)
        found[path] = sorted(set(re.findall(r"atom\.[\w.]+", ptx)))
    print(json.dumps({"triton": triton.__version__, "atomics": found}))


if __name__ == "__main__":
    main()
