"""Compile ficco's all-reduce kernels with epoch-valued flags for an H100/H200 (sm_90) on a
machine without a GPU.

Run without TRITON_INTERPRET (the interpreter never compiles), it lowers the GPU code of the
one-shot, two-shot and fused RMSNorm kernels (the one-shot's with FP8 output, the
two-shot's with and without it) (``ON_GPU``: ``%globaltimer``, the system-scope
acquire loads and release stores of the flags) through PTX to cubins with Triton's bundled
ptxas, and prints, per kernel, the flag instructions it found, as JSON. Exit status 3: this
Triton has no offline compile entry point (the caller skips).

    python tests/compile_lamport_sm90.py
"""

from __future__ import annotations

import json
import os
import re
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_lamport_sm90: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as err:  # pragma: no cover - another Triton's layout
    print(f"no offline compile here: {err}", file=sys.stderr)
    sys.exit(3)

from ficco.kernels import allreduce_lamport as lam  # noqa: E402

_I32 = {"epochs_ptr", "status_ptr", "flag_ref"}
_I64 = {"scratch_offs", "flag_offs", "budget_ns"}


def compile_kernel(kernel, dtype: str, constants: dict, pointers: dict) -> str:
    names = kernel.arg_names
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        elif name in _I32:
            signature[name] = "*i32"
        elif name in ("scratch_offs", "flag_offs"):
            signature[name] = "*i64"
        elif name == "budget_ns":
            signature[name] = "i64"
        elif name == "eps":
            signature[name] = "fp32"
        elif name.endswith("_ptr") or name == "data_ref":
            signature[name] = "*" + dtype
        else:
            signature[name] = "i32"
    source = ASTSource(
        kernel, signature, constexprs={(names.index(k),): v for k, v in constants.items()}
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    if not compiled.asm.get("cubin"):
        raise RuntimeError("ptxas produced no cubin")
    return compiled.asm["ptx"]


def main() -> None:
    flat = dict(MAXP=lam.MAX_PROGRAMS, BLOCK=lam.BLOCK, ON_GPU=True)
    found = {}
    for name, kernel, constants, pointers in (
        ("one_shot", lam._one_shot_kernel, dict(WORLD=8, PHASES=3, **flat), {}),
        ("two_shot", lam._two_shot_kernel, dict(WORLD=4, PHASES=7, **flat), {}),
        (
            "rms_norm_fp8",
            lam._one_shot_rms_norm_kernel,
            dict(WORLD=2, MAXP=lam.MAX_PROGRAMS, BLOCK_N=8192, PHASES=3, FP8=True, ON_GPU=True),
            {"normed_ptr": "fp8e4nv", "scale_ptr": "fp32"},
        ),
        (
            "rms_norm_two_shot",
            lam._two_shot_rms_norm_kernel,
            dict(WORLD=8, MAXP=lam.MAX_PROGRAMS, BLOCK_N=8192, PHASES=7, FP8=False, ON_GPU=True),
            {},
        ),
        (
            "rms_norm_two_shot_fp8",
            lam._two_shot_rms_norm_kernel,
            dict(WORLD=4, MAXP=lam.MAX_PROGRAMS, BLOCK_N=8192, PHASES=7, FP8=True, ON_GPU=True),
            {"normed_ptr": "fp8e4nv", "scale_ptr": "fp32"},
        ),
    ):
        ptx = compile_kernel(kernel, "bf16", constants, pointers)
        found[name] = sorted(set(re.findall(r"(?:st\.release|ld\.acquire)[\w.]*", ptx)))
    print(json.dumps({"triton": triton.__version__, "flags": found}))


if __name__ == "__main__":
    main()
