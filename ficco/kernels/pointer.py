"""The pointer-based persistent GEMM: the fallback of `ficco.kernels.persistent`.

`out (+)= a @ b` with masked pointer loads and stores and arbitrary strides, for GPUs before
Hopper, views TMA cannot describe (misaligned bases or leading strides), and Tritons without
host tensor descriptors. Same grid and tile walk as the TMA kernel (grouped order over
`min(sm_budget, tiles)` programs, `flatten=True`), no split tail. A swap-AB config runs as
out^T = b^T a^T through transposed views.
"""

from __future__ import annotations

from dataclasses import replace

import triton
import triton.language as tl

from ficco.kernels.configs import GemmConfig
from ficco.kernels.tiles import _program_grid, _tile_coords, _tile_offsets


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
    start_pid, num_programs, num_pid_m, num_pid_n, k_tiles, num_tiles = _program_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    tile_id_c = start_pid - num_programs
    offs_k0 = tl.arange(0, BLOCK_K)

    for tile_id in tl.range(start_pid, num_tiles, num_programs, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_am, offs_bn, mask_am, mask_bn = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
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
        offs_cm, offs_cn, mask_cm, mask_cn = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        c_mask = mask_cm[:, None] & mask_cn[None, :]
        if ACCUMULATE:
            acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def launch_ptr(a, b, out, accumulate, sm_budget, config: GemmConfig, precision: str) -> object:
    """One launch of the pointer kernel on validated operands; returns the compiled kernel
    (raises triton's OutOfResources where the config does not fit)."""
    if config.swap_ab:  # out^T = b^T a^T: the pointer kernel takes any strides
        a, b, out = b.t(), a.t(), out.t()
        config = replace(config, block_m=config.block_n, block_n=config.block_m, swap_ab=False)
    m, k = a.shape
    n = b.shape[1]
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    return _matmul_ptr_kernel[(max(1, min(sm_budget, tiles)),)](
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
