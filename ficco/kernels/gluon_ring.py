"""The pieces every partition of the Gluon GEMM (`ficco.kernels.gluon_gemm`, its swap-AB
form `ficco.kernels.gluon_swap`) shares: the accumulator's register layout, the tile order,
and the ring's slot handshake (a slot's ``empty`` barrier completes when its consumer has
read it, its ``ready`` barrier when its TMA loads have landed)."""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

# rows of tiles a group visits before moving along N (L2 reuse of the B columns)
GROUP_M = gl.constexpr(8)


@gluon.constexpr_function
def _acc_layout(block_m, block_n, num_warps, k_instr):
    """The wgmma accumulator's register layout for a [block_m, block_n] tile on num_warps."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    n_reps = triton.cdiv(num_warps, triton.cdiv(block_m, 16))
    most_n = max(block_n // n_reps, 8)
    instr_n = 256
    while instr_n > most_n or block_n % instr_n != 0:
        instr_n -= 8
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=warps, instr_shape=[16, instr_n, k_instr]
    )


@gluon.jit
def _tile_grid(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """An M x N x K product in these tiles: (row tiles, column tiles, K steps)."""
    return gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), gl.cdiv(K, BLOCK_K)


@gluon.jit
def _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _free_slot(bars, step, STAGES: gl.constexpr, nbytes: gl.constexpr):
    """Load step `step`'s ring slot, once its consumer has released it, armed for `nbytes` of
    TMA loads: (slot, its ready barrier)."""
    ready, empty, turns = bars
    slot = step % STAGES
    # a fresh mbarrier reads as if phase 1 completed: the first pass does not wait
    mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
    bar = ready.index(slot)
    mbarrier.expect(bar, nbytes)
    return slot, bar


@gluon.jit
def _landed_slot(bars, step, STAGES: gl.constexpr):
    """Load step `step`'s ring slot, once its loads have landed."""
    ready, empty, turns = bars
    slot = step % STAGES
    mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
    return slot
