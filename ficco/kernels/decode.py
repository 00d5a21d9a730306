"""The split-K decode GEMM: `out (+)= a @ b` for few rows (decode, M = 1 ... 512).

A decode GEMM reads a weight b [K, N] far larger than a [M, K] and out [M, N]: it is a stream
of the weight through memory, and whole output tiles are too few to keep every SM reading
(N = 8192 in 128-column tiles is 64 tiles for 132 SMs). So every tile's K is cut into
`GemmConfig.split_k` ranges, and `min(sm_budget, tiles x split_k)` persistent programs walk the
(tile, K range) units `pid, pid + grid, ...`; the ranges of one tile are consecutive units, so
they run side by side and share a's rows in L2. Each range stores its fp32 partial to a
workspace, takes a ticket (CTA barrier, then a gpu-scope acq_rel atomic, as the persistent
kernel's split tail does), and the tile's last arriver sums the partials in range order
(deterministic: the same bits every run) and writes C.

Loads are masked pointer loads with arbitrary strides (any view: row or column slices of a
larger output, a transposed weight), pipelined `num_stages` deep; the dot runs on
`block_m` >= 16 rows, so M = 1 computes padding rows that cost no memory traffic. M, N, K and
the split are runtime values (never specialised), so one compiled kernel per tile shape serves
every decode shape of a model. `ficco.kernels.persistent.launch` runs it for any config whose
`split_k` >= 2; the tuner offers such configs for M <= `configs.DECODE_MAX_ROWS`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ficco.kernels.configs import GemmConfig
from ficco.kernels.tiles import _program_grid, _tile_offsets


@triton.jit(do_not_specialize=["M", "N", "K", "num_units", "split", "k_per_split"])
def _decode_kernel(
    a_ptr,  # A [M, K], strides (stride_am, stride_ak)
    b_ptr,  # B [K, N], strides (stride_bk, stride_bn)
    c_ptr,  # C [M, N], strides (stride_cm, stride_cn)
    ws_ptr,  # fp32 partials [tiles, split, BLOCK_M, BLOCK_N]
    lock_ptr,  # int32 arrival counters [tiles], zero on entry and left zero
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    num_units,
    split,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_pid, num_programs, _, num_pid_n, k_tiles, _ = _program_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    offs_k0 = tl.arange(0, BLOCK_K)
    offs_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for unit in range(start_pid, num_units, num_programs):
        tile_id = unit // split
        part = unit % split
        pid_m = tile_id // num_pid_n
        pid_n = tile_id % num_pid_n
        offs_am, offs_bn, mask_am, mask_bn = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
        k_lo = part * k_per_split
        k_hi = tl.minimum(k_lo + k_per_split, k_tiles)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_lo, k_hi):
            offs_k = ki * BLOCK_K + offs_k0
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
            a = tl.load(a_ptrs, mask=mask_am[:, None] & (offs_k[None, :] < K), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K) & mask_bn[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

        c_ptrs = c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn
        c_mask = mask_am[:, None] & mask_bn[None, :]
        if split == 1:
            if ACCUMULATE:
                acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
        else:
            # Every K range stores its partial; the last to arrive sums them in range order
            # and writes C. Stores, a CTA barrier, then a gpu-scope release: the partials are
            # visible to whoever takes the last ticket.
            slots = ws_ptr + (tile_id * split).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs_tile
            tl.store(slots + part * (BLOCK_M * BLOCK_N), acc)
            tl.debug_barrier()
            ticket = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
            if ticket == split - 1:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for p in range(split):
                    acc += tl.load(slots + p * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
                tl.store(lock_ptr + tile_id, 0)  # ready for the next launch on this stream
                if ACCUMULATE:
                    acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
                tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def decode_split(config: GemmConfig, k: int) -> tuple[int, int]:
    """(K ranges, BLOCK_K steps per range) for `config` at depth `k`: `config.split_k` ranges,
    fewer where K has fewer steps, and never an empty range."""
    k_tiles = triton.cdiv(k, config.block_k)
    split = max(1, min(config.split_k, k_tiles))
    k_per_split = triton.cdiv(k_tiles, split)
    return triton.cdiv(k_tiles, k_per_split), k_per_split


def launch_decode(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    accumulate: bool,
    sm_budget: int,
    config: GemmConfig,
    precision: str,
    locks: torch.Tensor,
) -> object:
    """One launch on validated operands (a [M, K], b [K, N], out [M, N]; `locks`: int32
    arrival counters, zero, at least one per output tile); returns the compiled kernel."""
    m, k = a.shape
    n = b.shape[1]
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if locks.numel() < tiles:
        raise ValueError(f"locks: needs {tiles} counters (one per tile), got {locks.numel()}")
    split, k_per_split = decode_split(config, k)
    units = tiles * split
    ws = torch.empty(
        tiles * split * config.block_m * config.block_n if split > 1 else 1,
        dtype=torch.float32,
        device=out.device,
    )
    return _decode_kernel[(max(1, min(sm_budget, units)),)](
        a,
        b,
        out,
        ws,
        locks,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        units,
        split,
        k_per_split,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        ACCUMULATE=accumulate,
        INPUT_PRECISION=precision,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
