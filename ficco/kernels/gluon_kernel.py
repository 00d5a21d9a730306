"""The warp-specialized Gluon GEMM's device side: the producer partition, the kernels
(`ws_gemm_kernel`, `ws_fused_kernel`) and the one dispatch over the partitions (the consumers
are `ficco.kernels.gluon_consumer`'s and their epilogue `ficco.kernels.gluon_epilogue`'s, the
swap-AB roles `ficco.kernels.gluon_swap`'s, the ring, grid and chunk helpers
`ficco.kernels.gluon_ring`'s). `ficco.kernels.gluon_gemm` launches them; its docstring
describes the design and what it measured."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)

from ficco.kernels.gluon_consumer import (
    _coop_consumer,
    _coop_consumer_fast,
    _pingpong_consumer_0,
    _pingpong_consumer_0_fast,
    _pingpong_consumer_1,
    _pingpong_consumer_1_fast,
    _third_consumer_0,
    _third_consumer_0_fast,
    _third_consumer_1,
    _third_consumer_1_fast,
    _third_consumer_2,
    _third_consumer_2_fast,
)
from ficco.kernels.gluon_ring import (
    A_BUFS,
    A_DESC,
    B_BUFS,
    B_DESC,
    B_TAIL_BUFS,
    B_TAIL_DESC,
    C_DESC,
    FIRST_A_ROW,
    READY,
    _a_places,
    _a_rows,
    _column_tail,
    _copy_a,
    _free_slot,
    _fused_launch,
    _grid,
    _tile_offsets,
    _unit_work,
    _units,
)
from ficco.kernels.gluon_swap import _swap_consumer, _swap_producer

# the producer partition's warps and registers; the consumers take the rest of the
# register file (setmaxnreg moves registers between warpgroups)
PRODUCER_WARPS = 1
PRODUCER_REGS = 40
CONSUMER_REGS = 232
# 12 warps a program either way (8 consumer warps, or 4 + 4, and the producer's warpgroup):
# 168 x 384 threads fills the 64K-register file, and setmaxnreg gives the consumers 232
MAX_REGS = 168
# three consumers sharing a tile: 16 warps a program (4 + 4 + 4 and the producer's
# warpgroup), 128 registers each at launch; setmaxnreg gives two of the consumers 152
THIRDS_MAX_REGS = 128
THIRDS_CONSUMER_REGS = gl.constexpr(152)


@gluon.jit
def _producer(descs, ring, bars, scales, tails):
    """Every TMA load of the program's work units (tiles, or a split tail's K ranges of
    them), in order, each K step's (`_load_step`; a fused launch's first,
    `_load_first_step_fused`) into the next free ring slot."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    a_bufs = ring[A_BUFS]
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    # A's tile in A_BLOCKS row blocks of a_desc's, each its own buffer of the slot (three row
    # parts: 192 rows, no power of two), else one
    A_BLOCKS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    A_ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = A_ROWS * A_BLOCKS
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # B's tile is [BLOCK_N, BLOCK_K] K-major (FP8), else [BLOCK_K, BLOCK_N]
    MAIN_N: gl.constexpr = b_desc.block_type.shape[0 if a_desc.dtype.primitive_bitwidth == 8 else 1]
    # a tail (16-bit only): B's columns [MAIN_N, MAIN_N + TAIL_N) of the tile, its own slots
    HAS_TAIL: gl.constexpr = _column_tail(ring)
    TAIL_N: gl.constexpr = descs[B_TAIL_DESC].block_type.shape[1] if HAS_TAIL else 0
    BLOCK_N: gl.constexpr = MAIN_N + TAIL_N
    num_pid_m, num_pid_n, k_steps, rows = _grid(
        c_desc, a_desc.shape[1], scales, BLOCK_M, BLOCK_N, BLOCK_K
    )
    units = _units(num_pid_m * num_pid_n, tails)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    load_bytes: gl.constexpr = (
        a_desc.block_type.nbytes * A_BLOCKS
        + b_desc.block_type.nbytes
        + (descs[B_TAIL_DESC].block_type.nbytes if HAS_TAIL else 0)
    )
    # fused (`ficco.kernels.gluon_fused`): a chunk's rows are read once its flag is set; the
    # chunks seen arrive (a bit each): one acquire and fence per chunk, then its loads follow
    # them in program order
    FUSED: gl.constexpr = _fused_launch(scales)
    arrived = gl.to_tensor(0).to(gl.int64)
    # the chunk whose table entry was read last, and its first A row: fused, chunk 0's from
    # the arguments (a program's first tile is mostly in it: no table read before its wait)
    if FUSED:
        cached = gl.to_tensor(0)
        a_base = scales[FIRST_A_ROW].to(gl.int64)
    else:
        cached = gl.to_tensor(-1)
        a_base = gl.to_tensor(0).to(gl.int64)
    step = 0
    for unit in range(pid, units, programs):
        tile, k_lo, k_count = _unit_work(unit, k_steps, tails)
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N)
        if FUSED:
            a_rows, arrived, cached, a_base = _load_first_step_fused(
                descs, ring, bars, scales, off_m, off_n, k_lo, step, rows, arrived, cached,
                a_base, load_bytes, A_BLOCKS,
            )  # fmt: skip
            step += 1
            first_k = 1
        else:
            a_rows, arrived, cached, a_base = _a_rows(
                off_m, (), rows, scales, arrived, cached, a_base, A_ROWS, A_BLOCKS
            )
            first_k: gl.constexpr = 0
        for ki in range(first_k, k_count):
            k = (k_lo + ki) * BLOCK_K
            slot, bar = _free_slot(bars, step, STAGES, load_bytes)
            _load_step(descs, ring, scales, a_rows, off_n, k, bar, slot, A_BLOCKS)
            step += 1


@gluon.jit
def _load_first_step_fused(
    descs, ring, bars, scales, off_m, off_n, k_lo, step, rows, arrived, cached, a_base,
    load_bytes: gl.constexpr, A_BLOCKS: gl.constexpr,
):  # fmt: skip
    """Fused: the loads of a tile's first K step (k_lo) into ring step `step`'s slot. The
    rows' chunks placed (arithmetic) before the slot's wait; then B's first block [MAIN_N,
    BLOCK_K] (FP8: K-major) in flight while the chunk table is read and the chunks waited on
    (at a program's start that chain is a few global reads long), then A's A_BLOCKS row
    blocks [A_ROWS, BLOCK_K]. (Reading the table one unit ahead ran slower: 0.964 of the
    plain launch against 0.977, one H200 (profiles/h200/NOTES_gemm.md).) (A's rows of the
    tile's blocks, and the chunk state `_a_rows` carries.)"""
    a_desc = descs[A_DESC]
    a_bufs = ring[A_BUFS]
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    A_ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    places = _a_places(off_m, scales, A_ROWS, A_BLOCKS)
    slot, bar = _free_slot(bars, step, STAGES, load_bytes)
    tma.async_copy_global_to_shared(
        descs[B_DESC], [off_n, k_lo * BLOCK_K], bar, ring[B_BUFS].index(slot)
    )
    a_rows, arrived, cached, a_base = _a_rows(
        off_m, places, rows, scales, arrived, cached, a_base, A_ROWS, A_BLOCKS
    )
    for r in gl.static_range(A_BLOCKS):
        _copy_a(a_desc, scales, a_rows[r], k_lo * BLOCK_K, bar, a_bufs.index(slot * A_BLOCKS + r))
    return a_rows, arrived, cached, a_base


@gluon.jit
def _load_step(descs, ring, scales, a_rows, off_n, k, bar, slot, A_BLOCKS: gl.constexpr):
    """One K step's TMA loads at column k into ring slot `slot`, armed on `bar`: A's
    A_BLOCKS row blocks [A_ROWS, BLOCK_K] from rows a_rows (`_a_rows`), B's block [BLOCK_K,
    MAIN_N] (FP8: [MAIN_N, BLOCK_K], K-major) and a column tail's [BLOCK_K, TAIL_N]."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    a_bufs = ring[A_BUFS]
    b_bufs = ring[B_BUFS]
    B_K_MAJOR: gl.constexpr = a_desc.dtype.primitive_bitwidth == 8
    for r in gl.static_range(A_BLOCKS):
        _copy_a(a_desc, scales, a_rows[r], k, bar, a_bufs.index(slot * A_BLOCKS + r))
    if B_K_MAJOR:
        tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_bufs.index(slot))
    else:
        tma.async_copy_global_to_shared(b_desc, [k, off_n], bar, b_bufs.index(slot))
    if _column_tail(ring):
        # the tail's columns follow the main part's (16-bit only: B [BLOCK_K, MAIN_N])
        tma.async_copy_global_to_shared(
            descs[B_TAIL_DESC], [k, off_n + b_desc.block_type.shape[1]], bar,
            ring[B_TAIL_BUFS].index(slot),
        )  # fmt: skip


# a split tail's bounds are loop bounds: one compile for every shape (as `persistent`'s kernel)
_SPLIT_ARGS = ["dp_tiles", "split", "k_per_split"]


@gluon.jit(do_not_specialize=_SPLIT_ARGS)
def ws_gemm_kernel(
    a_desc,
    b_desc,
    c_desc,
    b_tail_desc,
    c_tail_desc,
    a_scale_ptr,
    b_scale_ptr,
    ws_ptr,
    lock_ptr,
    dp_tiles,
    split,
    k_per_split,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    TAIL: gl.constexpr,
    SWAP_AB: gl.constexpr,
    SPLIT_TAIL: gl.constexpr,
):
    _ws_gemm(
        a_desc, b_desc, c_desc, b_tail_desc, c_tail_desc, (a_scale_ptr, b_scale_ptr),
        _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL),
        STAGES, CONSUMERS, PRODUCER_REGS, CONSUMER_REGS, FAST_ACCUM, TAIL, SWAP_AB,
    )  # fmt: skip


# the chunk divisor's multiplier and chunk 0's entry: one compile whatever their values
@gluon.jit(do_not_specialize=[*_SPLIT_ARGS, "chunk_multiplier", "first_a_row", "first_waits"])
def ws_fused_kernel(
    a_desc,
    b_desc,
    c_desc,
    a_scale_ref,
    b_scale_ptr,
    chunk_table,
    flag_ref,
    status_ptr,
    chunk_rows,
    chunks,
    budget_ns,
    chunk_multiplier,
    first_a_row,
    first_flag,
    first_waits,
    a2_desc,
    ws_ptr,
    lock_ptr,
    dp_tiles,
    split,
    k_per_split,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    SPLIT_TAIL: gl.constexpr,
):
    # FP8 over row chunks that wait on flags (`ficco.kernels.gluon_fused`): the chunk table
    # and the rest after the scales (`gluon_ring.CHUNK_COLS`)
    scales = (
        a_scale_ref, b_scale_ptr, chunk_table, flag_ref, status_ptr, chunk_rows, chunks,
        budget_ns, chunk_multiplier, first_a_row, first_flag, first_waits, a2_desc,
    )  # fmt: skip
    _ws_gemm(
        a_desc, b_desc, c_desc, b_desc, c_desc, scales,
        _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL),
        STAGES, CONSUMERS, PRODUCER_REGS, CONSUMER_REGS, FAST_ACCUM, False, False,
    )  # fmt: skip


@gluon.jit
def _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL: gl.constexpr):
    """A split tail's arguments as the partitions take them (`gluon_ring._units`): the fp32
    partials' workspace, the tail tiles' arrival counters, the whole tiles, K ranges a tail
    tile, K steps a range; without a split tail, none (`gluon_ring._split_tail`)."""
    if SPLIT_TAIL:  # noqa: SIM108 - a constexpr branch
        tails = (ws_ptr, lock_ptr, dp_tiles, split, k_per_split)
    else:
        tails = ()
    return tails


@gluon.jit
def _ws_gemm(
    a_desc,
    b_desc,
    c_desc,
    b_tail_desc,
    c_tail_desc,
    scales,
    tails,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    TAIL: gl.constexpr,
    SWAP_AB: gl.constexpr,
):
    # three consumers share each tile (192 rows): A loads as three 64-row blocks a slot
    A_BLOCKS: gl.constexpr = 3 if CONSUMERS == 3 else 1
    a_bufs = gl.allocate_shared_memory(
        a_desc.dtype, [STAGES * A_BLOCKS] + a_desc.block_type.shape, a_desc.layout
    )
    b_bufs = gl.allocate_shared_memory(
        b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # shared tiles (c's blocks one consumer's part of the tile's rows; swap-AB's are other
    # blocks): each consumer frees each slot
    TILE_M: gl.constexpr = a_desc.block_type.shape[0] * A_BLOCKS
    readers: gl.constexpr = 1 if SWAP_AB else TILE_M // c_desc.block_type.shape[0]
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=readers)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    # TAIL: the tile's columns past the power-of-two main part (b_tail_desc, c_tail_desc;
    # `gluon_ring._column_tail`; without, the tail descriptors are unused)
    if TAIL:
        bt_bufs = gl.allocate_shared_memory(
            b_tail_desc.dtype, [STAGES] + b_tail_desc.block_type.shape, b_tail_desc.layout
        )
        descs = (a_desc, b_desc, c_desc, b_tail_desc, c_tail_desc)
        ring = (a_bufs, b_bufs, bt_bufs)
    else:
        descs = (a_desc, b_desc, c_desc)
        ring = (a_bufs, b_bufs)
    bars = (ready, empty, turns)
    # each partition takes only values, each consumer role and accumulation its own function
    # picked here at compile time (`gluon_consumer`'s note on its role functions says why)
    args = (descs, ring, bars, scales, tails)
    if SWAP_AB:
        gl.warp_specialize([(_swap_consumer, args), (_swap_producer, args)], [1], [PRODUCER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_third_consumer_0_fast if FAST_ACCUM else _third_consumer_0, args),
                (_third_consumer_1_fast if FAST_ACCUM else _third_consumer_1, args),
                (_third_consumer_2_fast if FAST_ACCUM else _third_consumer_2, args),
                (_producer, args),
            ],
            [4, 4, 1],
            [THIRDS_CONSUMER_REGS, THIRDS_CONSUMER_REGS, PRODUCER_REGS],
        )
    elif CONSUMERS == 1:
        gl.warp_specialize(
            [(_coop_consumer_fast if FAST_ACCUM else _coop_consumer, args), (_producer, args)],
            [1],
            [PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_pingpong_consumer_0_fast if FAST_ACCUM else _pingpong_consumer_0, args),
                (_pingpong_consumer_1_fast if FAST_ACCUM else _pingpong_consumer_1, args),
                (_producer, args),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
