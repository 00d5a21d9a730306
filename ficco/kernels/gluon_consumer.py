"""The consumer partitions of the warp-specialized Gluon GEMM (`ficco.kernels.gluon_kernel`
holds the producer and the kernels, `ficco.kernels.gluon_gemm` their launch; the swap-AB roles are
`ficco.kernels.gluon_swap`'s): each consumer's walk over its work units, where a fused launch's
rows go, the ping-pong turns, and the K loops of wgmmas over the ring's slots (FP8 promoted by
hand or by wgmma); the epilogue (scales, split-tail partials, stores) is
`ficco.kernels.gluon_epilogue`'s. The modes (cooperative, ping-pong, shared tiles, a tail) and
what they measured are described in `ficco.kernels.gluon_gemm`."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ficco.kernels.gluon_epilogue import (
    _early_scales_mode,
    _scaled,
    _scales_before_k,
    _split_partial,
    _store_tile,
)
from ficco.kernels.gluon_ring import (
    A_BUFS,
    A_DESC,
    A_SCALE,
    B_BUFS,
    B_DESC,
    B_SCALE,
    B_TAIL_BUFS,
    B_TAIL_DESC,
    C_DESC,
    C_TAIL_DESC,
    CHUNK_ROWS,
    EMPTY,
    READY,
    TURNS,
    _acc_layout,
    _chunk_of,
    _column_tail,
    _entry_cached,
    _fused_launch,
    _grid,
    _landed_slot,
    _prefetch_chunks,
    _split_tail,
    _tile_offsets,
    _unit_work,
    _units,
)


@gluon.jit
def _consume(
    descs,
    ring,
    bars,
    scales,
    tails,
    CONSUMERS: gl.constexpr,
    WHICH: gl.constexpr,
    FAST: gl.constexpr,
):
    """Consumer WHICH's work units (tiles, or a split tail's K ranges of them): the
    program's units j with j mod CONSUMERS == WHICH (shared tiles: every unit); each one's
    rows placed, its K loop, its epilogue (`gluon_epilogue`)."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    a_bufs = ring[A_BUFS]
    b_bufs = ring[B_BUFS]
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    A_BLOCKS: gl.constexpr = a_bufs.type.shape[0] // STAGES  # A's row blocks per slot
    TILE_M: gl.constexpr = a_desc.block_type.shape[0] * A_BLOCKS
    # shared tiles (GluonGemmConfig.shared_tile; the launcher gives c's blocks one consumer's
    # rows): every consumer takes every tile, consumer WHICH rows [WHICH, WHICH + 1) *
    # BLOCK_M of it, each freeing a ring slot with its own arrival (`empty` counts PARTS)
    PARTS: gl.constexpr = TILE_M // c_desc.block_type.shape[0]
    SHARED: gl.constexpr = PARTS > 1
    BLOCK_M: gl.constexpr = TILE_M // PARTS
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # FP8: B K-major (wgmma's rule: B's tile [MAIN_N, BLOCK_K], else [BLOCK_K, MAIN_N]),
    # scaled, fp32 promotion every K step of at most 128 products (cuBLASLt's 128); FAST
    # (FP8 only): no promotion at all (cuBLASLt's use_fast_accum)
    FP8: gl.constexpr = a_desc.dtype.primitive_bitwidth == 8
    MAIN_N: gl.constexpr = b_desc.block_type.shape[0 if FP8 else 1]
    # a tail (16-bit only): columns [MAIN_N, MAIN_N + TAIL_N) of the tile, with their own B
    # slots, accumulator and store
    HAS_TAIL: gl.constexpr = _column_tail(ring)
    TAIL_N: gl.constexpr = descs[B_TAIL_DESC].block_type.shape[1] if HAS_TAIL else 0
    BLOCK_N: gl.constexpr = MAIN_N + TAIL_N
    WARPS: gl.constexpr = gl.num_warps()
    IMPRECISE_ACC: gl.constexpr = min(BLOCK_K, 128) if FP8 else 0
    # FP8 accumulators of at most 64 registers a thread leave room for a partial sum: those
    # tiles promote by hand after each K step, the others through wgmma's
    # max_num_imprecise_acc (Triton adds each step's partial sums in place)
    LAGGED: gl.constexpr = (
        FP8 and not FAST and BLOCK_M * BLOCK_N // (32 * WARPS) <= 64 and BLOCK_K <= 128
    )
    gl.static_assert(not (FP8 and HAS_TAIL))
    # fused (`ficco.kernels.gluon_fused`): the chunks' rows back to back (`_chunk_of`)
    FUSED: gl.constexpr = _fused_launch(scales)
    EARLY_SCALES: gl.constexpr = _early_scales_mode(FP8, FUSED, CONSUMERS, SHARED)
    K_INSTR: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth
    acc_layout: gl.constexpr = _acc_layout(BLOCK_M, MAIN_N, WARPS, K_INSTR)
    out_dtype: gl.constexpr = c_desc.dtype
    N = c_desc.shape[1]
    num_pid_m, num_pid_n, k_steps, rows = _grid(
        c_desc, a_desc.shape[1], scales, TILE_M, BLOCK_N, BLOCK_K
    )
    # split tail (`tails`, `gluon_ring._units`): the last wave's tiles in K ranges, each
    # range's partial summed by the last to arrive (`_split_partial`)
    SPLIT: gl.constexpr = _split_tail(tails)
    units = _units(num_pid_m * num_pid_n, tails)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    # ping-pong: consumer WHICH takes every other tile, in turns; shared tiles: all take
    # every tile
    PINGPONG: gl.constexpr = CONSUMERS > 1 and not SHARED
    STRIDE: gl.constexpr = 1 if SHARED else CONSUMERS
    FIRST: gl.constexpr = 0 if SHARED else WHICH
    PART: gl.constexpr = WHICH if SHARED else 0  # this consumer's row part of each tile
    # the epilogue stores the tile whole or in two column halves (`_store_tile`)
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    c_smem = gl.allocate_shared_memory(out_dtype, [BLOCK_M, EPI_N], c_desc.layout)
    acc = gl.zeros([BLOCK_M, MAIN_N], gl.float32, acc_layout)
    if HAS_TAIL:
        tail_layout: gl.constexpr = _acc_layout(BLOCK_M, TAIL_N, WARPS, K_INSTR)
        ct_desc = descs[C_TAIL_DESC]
        ct_smem = gl.allocate_shared_memory(out_dtype, [BLOCK_M, TAIL_N], ct_desc.layout)
        acc_t = gl.zeros([BLOCK_M, TAIL_N], gl.float32, tail_layout)
    else:
        ct_desc = None
        ct_smem = None
        acc_t = None
    if FUSED and WHICH == 0:
        _prefetch_chunks(scales)
    # fused: the chunks whose table entries were read last, and their first output row and
    # A scales' offset (`_fused_rows`)
    c_cached = gl.to_tensor(-1)
    s_cached = gl.to_tensor(-1)
    c_base = gl.to_tensor(0).to(gl.int64)
    s_off = gl.to_tensor(0).to(gl.int64)
    mine = 0  # this consumer's tiles so far
    for j in range(FIRST, gl.cdiv(units - pid, programs), STRIDE):
        unit = pid + j * programs
        tile, _k_lo, k_count = _unit_work(unit, k_steps, tails)
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, TILE_M, BLOCK_N)
        if SHARED:
            off_m += WHICH * BLOCK_M
        if FUSED:
            live, scale_m, c_row, a_scale_ptr, c_base, c_cached, s_off, s_cached = _fused_rows(
                off_m, rows, scales, c_base, c_cached, s_off, s_cached
            )
            scale_rows = scales[CHUNK_ROWS]
        else:
            live: gl.constexpr = True
            scale_m = off_m
            c_row = off_m
            a_scale_ptr = scales[A_SCALE]
            scale_rows = rows
        if FP8:
            # wgmma with max_num_imprecise_acc adds its promoted partial sums to the
            # accumulator even where use_acc is false: the previous tile's sums would stay
            acc = gl.zeros([BLOCK_M, MAIN_N], gl.float32, acc_layout)
        early = _scales_before_k(
            a_scale_ptr, scales[B_SCALE], scale_m, off_n, scale_rows, N, acc, EARLY_SCALES
        )
        if PINGPONG:
            _wait_turn(bars, j, mine, WHICH)
        # the ring step of the unit's first K step: the units before j are whole tiles (a
        # split unit is a program's last)
        step = j * k_steps
        if LAGGED:
            acc = _promote_each_step(
                a_bufs, b_bufs, bars, acc, step, k_count, PART, PINGPONG, WHICH
            )
        elif HAS_TAIL:
            acc, acc_t = _k_loop_with_tail(
                a_bufs, b_bufs, ring[B_TAIL_BUFS], bars, acc, acc_t, step, k_count, PART,
                PINGPONG, WHICH,
            )  # fmt: skip
        else:
            acc = _k_loop(
                a_bufs, b_bufs, bars, acc, step, k_count, PART, PINGPONG, WHICH, FAST,
                IMPRECISE_ACC,
            )  # fmt: skip
        if SPLIT:
            acc, last = _split_partial(acc, unit, tile, tails, PART, PARTS)
            live = live & last if FUSED else last
        out = acc
        if FP8:
            out = _scaled(
                acc, early, a_scale_ptr, scales[B_SCALE], scale_m, off_n, scale_rows, N,
                EARLY_SCALES,
            )  # fmt: skip
        _store_tile(out.to(out_dtype), acc_t, live, c_desc, c_smem, ct_desc, ct_smem, c_row, off_n)
        mine += 1  # noqa: SIM113 - the loop strides by CONSUMERS
    tma.store_wait(pendings=0)


@gluon.jit
def _fused_rows(off_m, rows, scales, c_base, c_cached, s_off, s_cached):
    """Fused: this consumer's rows of a tile from launch row off_m lie in one chunk; their
    outputs start at c_row, their A scales at a_scale_ptr, and a part past the launch's
    `rows` is computed and not stored. c_base and s_off: the first output row and the A
    scales' offset in the table entries of chunks c_cached and s_cached, read last
    (`_entry_cached`). (live, row in the chunk, c_row, a_scale_ptr, then the four updated.)
    Four values, not a tuple, defined and assigned in the tile loop in the order they always
    were: its carried values keep their order whether Triton takes them in order of
    definition (3.9) or of assignment in the loop."""
    live = off_m < rows
    chunk, scale_m, entry = _chunk_of(off_m, scales)
    c_base, c_cached = _entry_cached(chunk, entry, 1, c_cached, c_base)
    s_off, s_cached = _entry_cached(chunk, entry, 2, s_cached, s_off)
    c_row = c_base.to(gl.int32) + scale_m
    a_scale_ptr = scales[A_SCALE] + s_off
    return live, scale_m, c_row, a_scale_ptr, c_base, c_cached, s_off, s_cached


@gluon.jit
def _wait_turn(bars, j, mine, WHICH: gl.constexpr):
    """Ping-pong: before consumer WHICH's tile j (its `mine`-th), wait until the other
    consumer has issued every wgmma of tile j - 1 (its `_pass_turn`)."""
    if j > 0:
        mbarrier.wait(bars[TURNS].index(WHICH), (mine - (1 - WHICH)) & 1)


@gluon.jit
def _pass_turn(bars, PINGPONG: gl.constexpr, WHICH: gl.constexpr):
    """Ping-pong: consumer WHICH has issued its tile's last wgmma; the other's K loop may
    start."""
    if PINGPONG:
        mbarrier.arrive(bars[TURNS].index(1 - WHICH), count=1)


@gluon.jit
def _k_loop(
    a_bufs, b_bufs, bars, acc, step, k_steps, PART: gl.constexpr, PINGPONG: gl.constexpr,
    WHICH: gl.constexpr, FAST: gl.constexpr, IMPRECISE_ACC: gl.constexpr,
):  # fmt: skip
    """One tile's K steps into acc [BLOCK_M, MAIN_N] from ring step `step`: a wgmma a step
    (FP8: B K-major, promoted by wgmma every IMPRECISE_ACC products, or never where FAST),
    one in flight, each slot released once the next step's wgmma is issued; the turn passed
    after the last one is issued, then its wait. The tile's acc."""
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    FP8: gl.constexpr = a_bufs.dtype.primitive_bitwidth == 8
    previous = 0
    for ki in range(k_steps):
        slot = _landed_slot(bars, step, STAGES)
        b_tile = b_bufs.index(slot).permute((1, 0)) if FP8 else b_bufs.index(slot)
        a_tile = _a_tile(a_bufs, slot, PART, BLOCK_M, STAGES)
        if FAST:  # wgmma's default for FP8: never promote
            acc = warpgroup_mma(a_tile, b_tile, acc, use_acc=ki > 0, is_async=True)
        else:
            acc = warpgroup_mma(
                a_tile, b_tile, acc, use_acc=ki > 0, is_async=True,
                max_num_imprecise_acc=IMPRECISE_ACC,
            )  # fmt: skip
        # one wgmma in flight: the previous step's slot has been read
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if ki > 0:
            mbarrier.arrive(bars[EMPTY].index(previous), count=1)
        previous = slot
        step += 1
    _pass_turn(bars, PINGPONG, WHICH)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(bars[EMPTY].index(previous), count=1)
    return acc


@gluon.jit
def _k_loop_with_tail(
    a_bufs, b_bufs, bt_bufs, bars, acc, acc_t, step, k_steps, PART: gl.constexpr,
    PINGPONG: gl.constexpr, WHICH: gl.constexpr,
):  # fmt: skip
    """`_k_loop` for a 16-bit tile with a column tail: each step's A slot against B's main
    columns into acc [BLOCK_M, MAIN_N] and against the tail's (bt_bufs) into acc_t [BLOCK_M,
    TAIL_N], the step's two wgmmas in flight, so the previous step's slot has been read.
    The tile's (acc, acc_t)."""
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    previous = 0
    for ki in range(k_steps):
        slot = _landed_slot(bars, step, STAGES)
        b_tile = b_bufs.index(slot)
        a_tile = _a_tile(a_bufs, slot, PART, BLOCK_M, STAGES)
        acc = warpgroup_mma(
            a_tile, b_tile, acc, use_acc=ki > 0, is_async=True, max_num_imprecise_acc=0
        )
        acc_t = warpgroup_mma(
            a_bufs.index(slot), bt_bufs.index(slot), acc_t, use_acc=ki > 0, is_async=True
        )
        acc, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_t))
        if ki > 0:
            mbarrier.arrive(bars[EMPTY].index(previous), count=1)
        previous = slot
        step += 1
    _pass_turn(bars, PINGPONG, WHICH)
    acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
    mbarrier.arrive(bars[EMPTY].index(previous), count=1)
    return acc, acc_t


@gluon.jit
def _a_tile(a_bufs, slot, PART: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr):
    """Ring slot `slot`'s A rows of row part PART, ROWS of them: the consumer's part of the
    tile (all of it, but for shared tiles), its own buffer where A loads in row blocks."""
    A_BLOCKS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    if A_BLOCKS > 1:
        return a_bufs.index(slot * A_BLOCKS + PART)
    elif a_bufs.type.shape[1] > ROWS:
        return a_bufs.index(slot).slice(PART * ROWS, ROWS, dim=0)
    else:
        return a_bufs.index(slot)


@gluon.jit
def _promote_each_step(
    a_bufs, b_bufs, bars, acc, step, k_steps, PART: gl.constexpr, PINGPONG: gl.constexpr,
    WHICH: gl.constexpr,
):  # fmt: skip
    """FP8, promoted by hand: each K step's products summed by the tensor cores alone, then
    added to the fp32 accumulator acc [BLOCK_M, MAIN_N] once they are done (no wgmma of this
    warpgroup in flight while its registers are read: ptxas serializes every wgmma
    otherwise, C7514); another warpgroup's wgmmas keep the tensor cores busy meanwhile; the
    turn passed after the last step. The tile's acc."""
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    ROWS: gl.constexpr = acc.type.shape[0]
    zero = gl.zeros_like(acc)
    for _ki in range(k_steps):
        slot = _landed_slot(bars, step, STAGES)
        partial = warpgroup_mma(
            _a_tile(a_bufs, slot, PART, ROWS, STAGES), b_bufs.index(slot).permute((1, 0)), zero,
            use_acc=False, is_async=True,
        )  # fmt: skip
        partial = warpgroup_mma_wait(num_outstanding=0, deps=(partial,))
        mbarrier.arrive(bars[EMPTY].index(slot), count=1)
        acc = acc + partial
        step += 1
    _pass_turn(bars, PINGPONG, WHICH)
    return acc


# Why twelve one-line functions, one per consumer role and accumulation (CONSUMERS, WHICH,
# FAST): gl.warp_specialize hands each partition its arguments as the partition region's
# block arguments, and Triton 3.6 (the GPU image's) turns a constexpr among them into a
# tensor, so `_consume` could not branch on it at compile time nor shape its tiles by it.
# Every partition therefore takes only the five value groups (their types carry the other
# constants, their lengths the modes: `gluon_ring._fused_launch`), and each function here
# passes its constants as literals, which a plain call keeps constexpr. Triton 3.9 rebuilds
# partition arguments from their types and keeps constexprs: there
# `(_consume, (descs, ring, bars, scales, tails, 2, WHICH, FAST))` compiles to the same PTX
# (the 12 ping-pong variants' digests, offline sm_90); they stay while the image runs 3.6.
@gluon.jit
def _coop_consumer(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 1, 0, False)


@gluon.jit
def _pingpong_consumer_0(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 2, 0, False)


@gluon.jit
def _pingpong_consumer_1(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 2, 1, False)


@gluon.jit
def _coop_consumer_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 1, 0, True)


@gluon.jit
def _pingpong_consumer_0_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 2, 0, True)


@gluon.jit
def _pingpong_consumer_1_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 2, 1, True)


@gluon.jit
def _third_consumer_0(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 0, False)


@gluon.jit
def _third_consumer_1(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 1, False)


@gluon.jit
def _third_consumer_2(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 2, False)


@gluon.jit
def _third_consumer_0_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 0, True)


@gluon.jit
def _third_consumer_1_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 1, True)


@gluon.jit
def _third_consumer_2_fast(descs, ring, bars, scales, tails):
    _consume(descs, ring, bars, scales, tails, 3, 2, True)
