"""The swap-AB partitions of the Gluon GEMM (`ficco.kernels.gluon_gemm`, its ``SWAP_AB``
launch): out^T [N, M] = b^T [N, K] @ a^T [K, M] for decode rows, the weight's columns in
wgmma's M and a's rows in its N, so the ring holds the weight's stream rather than 64-row A
tiles mostly past M (`GluonGemmConfig.swap_ab`)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ficco.kernels.gluon_ring import (
    A_BUFS,
    A_DESC,
    B_BUFS,
    B_DESC,
    C_DESC,
    _acc_layout,
    _free_slot,
    _landed_slot,
    _tile_grid,
    _tile_offsets,
)


@gluon.jit
def _swap_producer(descs, ring, bars, scales, tails):
    """Swap-AB: every TMA load of the program's tiles, the weight's [BLOCK_K, BLOCK_M] block
    (a_desc over b [K, N]) and a's rows [BLOCK_N, BLOCK_K] (b_desc over a [M, K])."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = ring[A_BUFS].type.shape[0]
    load_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    # the kernel's M is the weight's columns, its N the rows of a (out^T = b^T a^T)
    num_pid_m, num_pid_n, k_steps = _tile_grid(
        c_desc.shape[1], c_desc.shape[0], a_desc.shape[0], BLOCK_M, BLOCK_N, BLOCK_K
    )
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N)
        for ki in range(k_steps):
            slot, bar = _free_slot(bars, step, STAGES, load_bytes)
            tma.async_copy_global_to_shared(
                a_desc, [ki * BLOCK_K, off_m], bar, ring[A_BUFS].index(slot)
            )
            tma.async_copy_global_to_shared(
                b_desc, [off_n, ki * BLOCK_K], bar, ring[B_BUFS].index(slot)
            )
            step += 1


@gluon.jit
def _swap_consumer(descs, ring, bars, scales, tails):
    """Swap-AB: acc [BLOCK_M, BLOCK_N] = out^T's tile, from the weight's block read MN-major
    and a's rows read K-major, stored transposed into out [M, N] (c_desc's [BLOCK_N, BLOCK_M]
    blocks)."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    a_bufs = ring[A_BUFS]
    b_bufs = ring[B_BUFS]
    ready, empty, turns = bars
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    K_INSTR: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth
    acc_layout: gl.constexpr = _acc_layout(BLOCK_M, BLOCK_N, gl.num_warps(), K_INSTR)
    num_pid_m, num_pid_n, k_steps = _tile_grid(
        c_desc.shape[1], c_desc.shape[0], a_desc.shape[0], BLOCK_M, BLOCK_N, BLOCK_K
    )
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_N, BLOCK_M], c_desc.layout)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    step = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N)
        previous = 0
        for ki in range(k_steps):
            slot = _landed_slot(bars, step, STAGES)
            acc = warpgroup_mma(
                a_bufs.index(slot).permute((1, 0)),
                b_bufs.index(slot).permute((1, 0)),
                acc,
                use_acc=ki > 0,
                is_async=True,
            )
            # one wgmma in flight: the previous step's slot has been read
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if ki > 0:
                mbarrier.arrive(empty.index(previous), count=1)
            previous = slot
            step += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(previous), count=1)
        tma.store_wait(pendings=0)  # the previous tile's store has left c_smem
        c_smem.store(acc.to(c_desc.dtype).permute((1, 0)))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_n, off_m], c_smem)
    tma.store_wait(pendings=0)
