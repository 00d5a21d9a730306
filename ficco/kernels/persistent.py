"""Persistent Triton GEMM kernels for Hopper, with a pointer-based fallback.

One launch starts `min(sm_budget, tiles)` programs; each walks the output tiles
`pid, pid + grid, pid + 2 * grid, ...` in grouped order (`group_m` tiles down M before moving
along N, so consecutive tiles share B's columns in L2). The SM budget is the grid size, a
runtime value: changing it never recompiles.

Two kernels compute the same function, `out (+)= a @ b` with fp32 accumulation:

- `_matmul_tma_kernel` reads A and B and writes C through host-built TMA tensor descriptors
  (`triton.tools.tensor_descriptor.TensorDescriptor`, Triton >= 3.4). The descriptor clips
  out-of-bounds loads to zero and drops out-of-bounds stores, so ragged M, N, K need no masks,
  and a C that is a row or column slice of a larger tensor is written only inside the slice.
  TMA needs 16-byte aligned base addresses and leading strides and a unit inner stride.
- `_matmul_ptr_kernel` uses masked pointer loads/stores with arbitrary strides: for GPUs
  before Hopper, misaligned views, and Tritons without host descriptors.

Both run under the CPU interpreter (`TRITON_INTERPRET=1`; Triton 3.9 interprets descriptors).
The outer tile loop is `tl.range(..., flatten=True)`, as in Triton's persistent-matmul tutorial:
the compiler flattens tile and K loops into one pipelined loop, so the next tile's first loads
are in flight during this tile's epilogue. The epilogue recomputes its tile coordinates from a
separate counter (`tile_id_c`), which the tutorial does to keep prologue and epilogue
independent in the flattened loop.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import Literal

import torch
import triton
import triton.language as tl

from ficco.kernels.configs import FALLBACK_CONFIG, GemmConfig

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Tritons take the pointer path
    TensorDescriptor = None

# Triton reads this when kernels are decorated: it must be set before this module is imported.
INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"

Path = Literal["tma", "ptr"]

# Launches per kernel path in this process, and the last compiled kernel of each: lets tests
# and benchmarks assert which path actually ran (a silent fallback looks like success).
LAUNCH_COUNTS: Counter[str] = Counter()
LAST_COMPILED: dict[str, object] = {}

_TORCH_TO_TL_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M tile-rows share each B column block while it sits in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _matmul_tma_kernel(
    a_desc,  # A [M, K], or A^T [K, M] when A_COL_MAJOR
    b_desc,  # B [K, N], or B^T [N, K] when B_COL_MAJOR
    c_desc,  # C [M, N] (any row stride), blocks [BLOCK_M, BLOCK_N or BLOCK_N / 2]
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_COL_MAJOR: tl.constexpr,
    B_COL_MAJOR: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_pid = tl.program_id(axis=0)
    num_programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - num_programs

    for tile_id in tl.range(start_pid, num_tiles, num_programs, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M
        offs_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_K
            a = a_desc.load([offs_k, offs_m]).T if A_COL_MAJOR else a_desc.load([offs_m, offs_k])
            b = b_desc.load([offs_n, offs_k]).T if B_COL_MAJOR else b_desc.load([offs_k, offs_n])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

        tile_id_c += num_programs
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_cm = pid_m * BLOCK_M
        offs_cn = pid_n * BLOCK_N
        if EPILOGUE_SUBTILE:
            # Two [BLOCK_M, BLOCK_N / 2] stores: half the staging buffer, one more A/B stage.
            acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            acc0, acc1 = tl.split(acc3)
            if ACCUMULATE:
                acc0 += c_desc.load([offs_cm, offs_cn]).to(tl.float32)
                acc1 += c_desc.load([offs_cm, offs_cn + BLOCK_N // 2]).to(tl.float32)
            c_desc.store([offs_cm, offs_cn], acc0.to(c_desc.dtype))
            c_desc.store([offs_cm, offs_cn + BLOCK_N // 2], acc1.to(c_desc.dtype))
        else:
            if ACCUMULATE:
                acc += c_desc.load([offs_cm, offs_cn]).to(tl.float32)
            c_desc.store([offs_cm, offs_cn], acc.to(c_desc.dtype))


@triton.jit
def _matmul_ptr_kernel(
    a_ptr,  # A [M, K], strides (stride_am, stride_ak)
    b_ptr,  # B [K, N], strides (stride_bk, stride_bn)
    c_ptr,  # C [M, N], strides (stride_cm, stride_cn)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_pid = tl.program_id(axis=0)
    num_programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - num_programs
    offs_k0 = tl.arange(0, BLOCK_K)

    for tile_id in tl.range(start_pid, num_tiles, num_programs, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        # int64 row/column offsets: M * stride can pass 2**31 elements on large operands.
        offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask_am = offs_am < M
        mask_bn = offs_bn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_K + offs_k0
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
            a = tl.load(a_ptrs, mask=mask_am[:, None] & (offs_k[None, :] < K), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K) & mask_bn[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

        tile_id_c += num_programs
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_cm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_cn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        if ACCUMULATE:
            acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


# ---------------------------------------------------------------------------------------------
# Path selection


def default_sm_budget(device: torch.device | str) -> int:
    """Persistent programs per launch when none is given: the device's SM count.

    Under the CPU interpreter programs run one after another, so any small number works; 4
    keeps several programs (and so the persistent tile loop) exercised.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _tma_operand(t: torch.Tensor) -> tuple[list[int], list[int], bool] | None:
    """How TMA sees a 2-D view `t [R, C]`: (shape, strides, col_major), or None if it cannot.

    Row-major views are described as [R, C] with strides [s0, 1]; column-major ones (a
    transposed view) as their transpose [C, R] with strides [s1, 1]. TMA needs a 16-byte
    aligned base address and leading stride. A size-1 dimension's stride is never used, so it
    is replaced by an aligned one.
    """
    rows, cols = t.shape
    elem = t.element_size()
    if t.data_ptr() % 16:
        return None
    align = 16 // elem
    s0, s1 = t.stride()
    if rows == 1:
        s0 = -(-max(cols, 1) // align) * align if s1 == 1 else s0
    if cols == 1:
        s1 = -(-max(rows, 1) // align) * align if s0 == 1 else s1
    if s1 == 1 and (s0 * elem) % 16 == 0:
        return [rows, cols], [s0, 1], False
    if s0 == 1 and (s1 * elem) % 16 == 0:
        return [cols, rows], [s1, 1], True
    return None


def tma_available(device: torch.device) -> bool:
    """This Triton builds host tensor descriptors, and the device (or interpreter) runs them."""
    if TensorDescriptor is None:
        return False
    if INTERPRETER:
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def select_path(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Path:
    """The kernel `matmul` uses for these operands: 'tma' where every view allows it, else 'ptr'."""
    if not tma_available(a.device):
        return "ptr"
    a_ok = _tma_operand(a) is not None
    b_ok = _tma_operand(b) is not None
    c = _tma_operand(out)
    if a_ok and b_ok and c is not None and not c[2]:
        return "tma"
    if not INTERPRETER:
        _warn_once(
            "ficco.kernels.matmul: an operand view is not TMA-compatible (16-byte aligned base "
            "and leading stride, unit inner stride; out must be row-major): using the slower "
            "pointer kernel"
        )
    return "ptr"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # A silent fallback would be indistinguishable from the feature working.
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Launch


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    accumulate: bool,
    sm_budget: int,
    config: GemmConfig,
    path: Path,
) -> torch.Tensor:
    """Run one kernel on validated operands: `out (+)= a @ b`, a [M, K], b [K, N], out [M, N]."""
    m, k = a.shape
    n = b.shape[1]
    num_tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = (max(1, min(sm_budget, num_tiles)),)
    precision = _TORCH_TO_TL_PRECISION[a.dtype]
    if path == "tma":
        a_shape, a_strides, a_col = _tma_operand(a)
        b_shape, b_strides, b_col = _tma_operand(b)
        c_shape, c_strides, _ = _tma_operand(out)
        a_block = [config.block_k, config.block_m] if a_col else [config.block_m, config.block_k]
        b_block = [config.block_n, config.block_k] if b_col else [config.block_k, config.block_n]
        c_cols = config.block_n // 2 if config.epilogue_subtile else config.block_n
        LAST_COMPILED["tma"] = _matmul_tma_kernel[grid](
            TensorDescriptor(a, a_shape, a_strides, a_block),
            TensorDescriptor(b, b_shape, b_strides, b_block),
            TensorDescriptor(out, c_shape, c_strides, [config.block_m, c_cols]),
            m,
            n,
            k,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            GROUP_M=config.group_m,
            A_COL_MAJOR=a_col,
            B_COL_MAJOR=b_col,
            ACCUMULATE=accumulate,
            EPILOGUE_SUBTILE=config.epilogue_subtile,
            INPUT_PRECISION=precision,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        LAUNCH_COUNTS["tma"] += 1
        return out
    try:
        _launch_ptr(a, b, out, accumulate, grid, config, precision)
    except triton.runtime.errors.OutOfResources:
        # A config tuned for the TMA kernel may not fit the pointer kernel's shared memory.
        _warn_once(
            f"config {config.name} does not fit the pointer kernel; using {FALLBACK_CONFIG.name}"
        )
        fb = FALLBACK_CONFIG
        tiles = triton.cdiv(m, fb.block_m) * triton.cdiv(n, fb.block_n)
        _launch_ptr(a, b, out, accumulate, (max(1, min(sm_budget, tiles)),), fb, precision)
    LAUNCH_COUNTS["ptr"] += 1
    return out


def _launch_ptr(a, b, out, accumulate, grid, config: GemmConfig, precision: str) -> None:
    m, k = a.shape
    n = b.shape[1]
    LAST_COMPILED["ptr"] = _matmul_ptr_kernel[grid](
        a,
        b,
        out,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        ACCUMULATE=accumulate,
        INPUT_PRECISION=precision,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
