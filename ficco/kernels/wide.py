"""Three-part tiles: output tiles 3 x 2^k columns wide (48, 96, 192) in the persistent kernel.

Triton tensors have power-of-two shapes, so a 128x192 tile is three [BLOCK_M, BLOCK_N / 3]
accumulators: each K step loads A's [BLOCK_M, BLOCK_K] block once and B's three
[BLOCK_K, BLOCK_N / 3] blocks, and runs three dots against the one A block. The tile counts
are why: on 132 SMs, 1024x3072 is 96 tiles of 128x256 (one wave, 73% of the SMs busy) or 192
of 128x128 (1.45 waves), but 128 of 128x192 (97%); 512x3072 is 128 tiles of 128x96 or 64x192.
`GemmConfig.n_parts` is 3 for such a width; `persistent.launch` runs them here (TMA path only).

Row- or column-major A and B as in `persistent._matmul_tma_kernel`; C row-major, stored one
part at a time ([BLOCK_M, BLOCK_N / 3] staging tile). No split tail, swap-AB or split-K.

The tile loop is not flattened: flattened (as the persistent kernel's is), ptxas serializes
the three dots' wgmmas (C7515: the per-tile zeroing of the accumulators lands inside the
pipeline stage), and on one H100 every such tile ran 1.04-2.7x the time of the best
power-of-two tile (`profiles/h100/NOTES_gemm.md`). Unflattened, the sm_90 compile has no
such note (`tests/compile_kernels_sm90.py`); the next tile's loads then wait for this tile's
stores, which costs little where the tiles make about one wave, as these do.

Three 64-column dots read A's block from shared memory once each: at 64 columns a wgmma
moves as many bytes of A as of B, and shared-memory bandwidth, not the tensor cores, sets the
pace. `GemmConfig.a_in_registers` passes A through registers first (an opaque copy), so the
dots take wgmma's register-A form and A is read once per K step.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ficco.kernels.tiles import _program_grid, _tile_coords


@triton.jit
def _load_b_part(b_desc, offs_k, offs_n, B_COL_MAJOR: tl.constexpr):
    # B's [BLOCK_K, BLOCK_N / 3] block at (offs_k, offs_n).
    return b_desc.load([offs_n, offs_k]).T if B_COL_MAJOR else b_desc.load([offs_k, offs_n])


@triton.jit
def _store_part(c_desc, acc, offs_m, offs_n, ACCUMULATE: tl.constexpr):
    if ACCUMULATE:
        acc += c_desc.load([offs_m, offs_n]).to(tl.float32)
    c_desc.store([offs_m, offs_n], acc.to(c_desc.dtype))


@triton.jit(do_not_specialize=["M", "N", "K"])
def _matmul_tma_wide_kernel(
    a_desc,  # A [M, K], or A^T [K, M] when A_COL_MAJOR; blocks [BLOCK_M, BLOCK_K]
    b_desc,  # B [K, N], or B^T [N, K] when B_COL_MAJOR; blocks [BLOCK_K, PART_N]
    c_desc,  # C [M, N] (any row stride), blocks [BLOCK_M, PART_N]
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    PART_N: tl.constexpr,  # BLOCK_N / 3
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_COL_MAJOR: tl.constexpr,
    B_COL_MAJOR: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    A_IN_REGISTERS: tl.constexpr,
):
    start_pid, num_programs, num_pid_m, num_pid_n, k_tiles, num_tiles = _program_grid(
        M, N, K, BLOCK_M, 3 * PART_N, BLOCK_K
    )
    for tile_id in tl.range(start_pid, num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M
        offs_n = pid_n * (3 * PART_N)
        acc0 = tl.zeros((BLOCK_M, PART_N), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, PART_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, PART_N), dtype=tl.float32)
        for ki in tl.range(0, k_tiles):
            offs_k = ki * BLOCK_K
            a = a_desc.load([offs_k, offs_m]).T if A_COL_MAJOR else a_desc.load([offs_m, offs_k])
            if A_IN_REGISTERS:  # an opaque copy: the dots then take A from registers
                a = tl.inline_asm_elementwise(
                    "mov.b32 $0, $1;", "=r,r", [a], dtype=a.dtype, is_pure=True, pack=2
                )
            b0 = _load_b_part(b_desc, offs_k, offs_n, B_COL_MAJOR)
            b1 = _load_b_part(b_desc, offs_k, offs_n + PART_N, B_COL_MAJOR)
            b2 = _load_b_part(b_desc, offs_k, offs_n + 2 * PART_N, B_COL_MAJOR)
            acc0 = tl.dot(a, b0, acc0, input_precision=INPUT_PRECISION)
            acc1 = tl.dot(a, b1, acc1, input_precision=INPUT_PRECISION)
            acc2 = tl.dot(a, b2, acc2, input_precision=INPUT_PRECISION)
        _store_part(c_desc, acc0, offs_m, offs_n, ACCUMULATE)
        _store_part(c_desc, acc1, offs_m, offs_n + PART_N, ACCUMULATE)
        _store_part(c_desc, acc2, offs_m, offs_n + 2 * PART_N, ACCUMULATE)
