"""Which output tile, and which K range of it, a persistent program's work unit is.

The persistent kernels walk work units `pid, pid + grid, pid + 2 * grid, ...` over the grid
that `_program_grid` states once for all of them (this program, the grid, the tile counts).
A unit is a whole tile (`_tile_coords`: the tile's grouped-order coordinates) or one of the K
ranges of a split-tail tile (`_unit_coords`, the plan of `configs.split_plan`). Pure index
arithmetic, shared by every kernel that walks tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _program_grid(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # This program, the grid, and the tiles of C [M, N] in [BLOCK_M, BLOCK_N] blocks with
    # their K steps of BLOCK_K: (start_pid, num_programs, num_pid_m, num_pid_n, k_tiles,
    # num_tiles), the prologue of every persistent kernel.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    return (
        tl.program_id(axis=0),
        tl.num_programs(axis=0),
        num_pid_m,
        num_pid_n,
        tl.cdiv(K, BLOCK_K),
        num_pid_m * num_pid_n,
    )


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
def _unit_coords(unit, dp_tiles, split, k_per_split, k_tiles):
    # Units [0, dp_tiles) are whole tiles; each later tile is `split` units, one K range each.
    is_split = unit >= dp_tiles
    split_unit = tl.maximum(unit - dp_tiles, 0)
    tile_id = tl.where(is_split, dp_tiles + split_unit // split, unit)
    part = split_unit % split
    k_lo = tl.where(is_split, part * k_per_split, 0)
    k_hi = tl.where(is_split, tl.minimum(k_lo + k_per_split, k_tiles), k_tiles)
    return tile_id, is_split, part, k_lo, k_hi


@triton.jit
def _tile_offsets(pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The rows and columns of tile (pid_m, pid_n) and which are inside C [M, N], as int64
    # (M * stride can pass 2**31 elements on large operands): for pointer loads and stores.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    return offs_m, offs_n, offs_m < M, offs_n < N
