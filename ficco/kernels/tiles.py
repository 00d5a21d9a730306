"""Which output tile, and which K range of it, a persistent program's work unit is.

The persistent kernels walk work units `pid, pid + grid, pid + 2 * grid, ...`. A unit is a
whole tile (`_tile_coords`: the tile's grouped-order coordinates), one of the K ranges of a
split-tail tile (`_unit_coords`), or one of a program's K ranges in a stream-K region
(`_stream_k_coords`). The plans behind them are `configs.split_plan` and
`configs.stream_k_plan`. Pure index arithmetic, shared by every kernel that walks tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
def _stream_k_coords(unit, dp_tiles, num_tiles, num_programs, segments, iters_per_program, k_tiles):
    # Units [0, dp_tiles) are whole tiles (full waves: dp_tiles is a multiple of the grid).
    # The remaining tiles' K steps, tile after tile, are dealt out in runs of
    # `iters_per_program` to the programs; program p's run touches at most `segments` tiles,
    # and its j-th is unit dp_tiles + j * num_programs + p (so program p walks it). Returns
    # the unit's tile, whether it is in the stream-K region, its program and segment (the
    # partial's slot), and its K range [k_lo, k_hi) within the tile: empty where the run
    # ends before its j-th tile.
    is_sk = unit >= dp_tiles
    s = tl.maximum(unit - dp_tiles, 0)
    p = s % num_programs
    j = s // num_programs
    sk_iters = (num_tiles - dp_tiles) * k_tiles
    it_lo = p * iters_per_program
    it_hi = tl.minimum(it_lo + iters_per_program, sk_iters)
    local = it_lo // k_tiles + j
    t_lo = local * k_tiles
    k_lo = tl.maximum(it_lo, t_lo) - t_lo
    k_hi = tl.minimum(it_hi, t_lo + k_tiles) - t_lo
    k_hi = tl.where(k_hi > k_lo, k_hi, k_lo)  # an empty range: nothing left of the run
    tile_id = tl.where(is_sk, dp_tiles + local, unit)
    k_lo = tl.where(is_sk, k_lo, 0)
    k_hi = tl.where(is_sk, k_hi, k_tiles)
    return tile_id, is_sk, p, j, k_lo, k_hi
