"""The consumer partitions of the warp-specialized Gluon GEMM (`ficco.kernels.gluon_kernel`
holds the producer and the kernels, `ficco.kernels.gluon_gemm` their launch; the swap-AB roles are
`ficco.kernels.gluon_swap`'s): each consumer's K loop of wgmmas over the ring's slots, FP8's
promotion by hand and scales, and the epilogue's stores. The modes (cooperative, ping-pong,
shared tiles, a tail) and what they measured are described in `ficco.kernels.gluon_gemm`."""

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
    A_SCALE,
    B_BUFS,
    B_DESC,
    B_SCALE,
    B_TAIL_BUFS,
    B_TAIL_DESC,
    C_DESC,
    C_TAIL_DESC,
    CHUNK_ROWS,
    CHUNK_TABLE,
    COUNTERS,
    EMPTY,
    READY,
    SPLITS,
    WHOLE_TILES,
    WORKSPACE,
    _acc_layout,
    _chunk_of,
    _entry_cached,
    _grid,
    _landed_slot,
    _prefetch_chunks,
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
    program's units j with j mod CONSUMERS == WHICH (shared tiles: every unit)."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    a_bufs = ring[A_BUFS]
    b_bufs = ring[B_BUFS]
    ready, empty, turns = bars
    STAGES: gl.constexpr = ready.type.shape[0]
    A_BLOCKS: gl.constexpr = a_bufs.type.shape[0] // STAGES  # A's row blocks per slot
    TILE_M: gl.constexpr = a_desc.block_type.shape[0] * A_BLOCKS
    # shared tiles (GluonGemmConfig.shared_tile; the launcher gives c's blocks one consumer's
    # rows): every consumer takes every tile, consumer WHICH rows [WHICH, WHICH + 1) *
    # BLOCK_M of it, each freeing a ring slot with its own arrival (`empty` counts PARTS)
    PARTS: gl.constexpr = TILE_M // c_desc.block_type.shape[0]
    SHARED: gl.constexpr = PARTS > 1
    BLOCK_M: gl.constexpr = TILE_M // PARTS
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # B's tile is [BLOCK_N, BLOCK_K] K-major (FP8), else [BLOCK_K, BLOCK_N]
    MAIN_N: gl.constexpr = b_desc.block_type.shape[0 if a_desc.dtype.primitive_bitwidth == 8 else 1]
    # a tail (16-bit only): columns [MAIN_N, MAIN_N + TAIL_N) of the tile, with their own B
    # slots (ring[B_TAIL_BUFS]), accumulator and store (descs[C_TAIL_DESC])
    HAS_TAIL: gl.constexpr = len(ring) > B_TAIL_BUFS
    TAIL_N: gl.constexpr = descs[B_TAIL_DESC].block_type.shape[1] if HAS_TAIL else 0
    BLOCK_N: gl.constexpr = MAIN_N + TAIL_N
    WARPS: gl.constexpr = gl.num_warps()
    # FP8: B K-major (wgmma's rule), scaled, fp32 promotion every K step of at most 128
    # products (cuBLASLt's 128)
    FP8: gl.constexpr = a_desc.dtype.primitive_bitwidth == 8
    # FAST (FP8 only): no promotion at all (cuBLASLt's use_fast_accum)
    IMPRECISE_ACC: gl.constexpr = min(BLOCK_K, 128) if FP8 else 0
    # FP8 accumulators of at most 64 registers a thread leave room for a partial sum: those
    # tiles promote by hand after each K step, the others through wgmma's
    # max_num_imprecise_acc (Triton adds each step's partial sums in place)
    LAGGED: gl.constexpr = (
        FP8 and not FAST and BLOCK_M * BLOCK_N // (32 * WARPS) <= 64 and BLOCK_K <= 128
    )
    gl.static_assert(not (FP8 and HAS_TAIL))
    # FP8: a tile's scales loaded before its K loop (in the epilogue their latency stands
    # between the last wgmma and the stores, and a fused launch's is a chain: the chunk's
    # cached table entry, then its scales). Three consumers sharing a tile (152 registers
    # each): one scale a thread, moved to the accumulator's layout in the epilogue (1: +1.7-4%
    # for 192-row tiles at 512-4096 rows, one H200 (profiles/h200/NOTES_gemm.md); in that layout they spill). Two
    # sharing one (232 registers), fused only: in the accumulator's layout (2: +1.2-4% over
    # the same launch with scales in the epilogue, one H200 (profiles/h200/NOTES_gemm.md); the plain kernel ran 1.5%
    # slower with it at 4096-16384 rows, and 3-6% slower with the first form)
    if FP8 and CONSUMERS == 3:
        EARLY_SCALES: gl.constexpr = 1
    elif FP8 and len(scales) > CHUNK_TABLE and CONSUMERS == 2 and SHARED:
        EARLY_SCALES: gl.constexpr = 2
    else:
        EARLY_SCALES: gl.constexpr = 0
    K_INSTR: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth
    acc_layout: gl.constexpr = _acc_layout(BLOCK_M, MAIN_N, WARPS, K_INSTR)
    out_dtype: gl.constexpr = c_desc.dtype
    N = c_desc.shape[1]
    # fused (`ficco.kernels.gluon_fused`): the chunks' rows back to back (`_chunk_of`)
    FUSED: gl.constexpr = len(scales) > CHUNK_TABLE
    num_pid_m, num_pid_n, k_steps, rows = _grid(
        c_desc, a_desc.shape[1], scales, TILE_M, BLOCK_N, BLOCK_K
    )
    # split tail (`tails`, `gluon_ring._units`): the last wave's tiles in K ranges, each
    # range's partial summed by the last to arrive (`_split_partial`)
    SPLIT: gl.constexpr = len(tails) > 0
    units = _units(num_pid_m * num_pid_n, tails)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    # ping-pong: consumer WHICH takes every other tile; shared tiles: all take every tile
    STRIDE: gl.constexpr = 1 if SHARED else CONSUMERS
    FIRST: gl.constexpr = 0 if SHARED else WHICH
    PART: gl.constexpr = WHICH if SHARED else 0  # this consumer's row part of each tile
    # the epilogue stores the tile whole or in two column halves (c's TMA block says which),
    # the halves freeing shared memory for another ring slot
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    gl.static_assert(EPI_N == MAIN_N or 2 * EPI_N == MAIN_N)
    c_smem = gl.allocate_shared_memory(out_dtype, [BLOCK_M, EPI_N], c_desc.layout)
    acc = gl.zeros([BLOCK_M, MAIN_N], gl.float32, acc_layout)
    if HAS_TAIL:
        tail_layout: gl.constexpr = _acc_layout(BLOCK_M, TAIL_N, WARPS, K_INSTR)
        ct_smem = gl.allocate_shared_memory(out_dtype, [BLOCK_M, TAIL_N], descs[C_TAIL_DESC].layout)
        acc_t = gl.zeros([BLOCK_M, TAIL_N], gl.float32, tail_layout)
    if FUSED and WHICH == 0:
        _prefetch_chunks(scales)
    # fused: the chunks whose table entries were read last, and their first output row and
    # A scales' offset (`_entry_cached`)
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
            # this consumer's rows: in one chunk, at c_row of the outputs, their scales at
            # a_scale_ptr; a part past the launch's rows is computed and not stored
            live = off_m < rows
            chunk, scale_m, entry = _chunk_of(off_m, scales)
            c_base, c_cached = _entry_cached(chunk, entry, 1, c_cached, c_base)
            s_off, s_cached = _entry_cached(chunk, entry, 2, s_cached, s_off)
            c_row = c_base.to(gl.int32) + scale_m
            a_scale_ptr = scales[A_SCALE] + s_off
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
        if EARLY_SCALES == 1:
            a_early, b_early = _early_scales(
                a_scale_ptr, scales[B_SCALE], scale_m, off_n, scale_rows, N, BLOCK_M, MAIN_N
            )
        elif EARLY_SCALES == 2:
            a_early, b_early = _tile_scales(
                a_scale_ptr, scales[B_SCALE], scale_m, off_n, scale_rows, N, acc
            )
        if CONSUMERS > 1 and not SHARED:  # noqa: SIM102 - a constexpr branch around a runtime one
            # the other consumer has issued every wgmma of tile j - 1 (its arrival below)
            if j > 0:
                mbarrier.wait(turns.index(WHICH), (mine - (1 - WHICH)) & 1)
        # the units before j are whole tiles (a split unit is a program's last)
        step = j * k_steps
        previous = 0
        if LAGGED:
            acc, step = _promote_each_step(a_bufs, b_bufs, bars, acc, step, k_count, PART)
            if CONSUMERS > 1 and not SHARED:
                mbarrier.arrive(turns.index(1 - WHICH), count=1)
        else:
            for ki in range(k_count):
                slot = _landed_slot(bars, step, STAGES)
                b_tile = b_bufs.index(slot).permute((1, 0)) if FP8 else b_bufs.index(slot)
                a_tile = _a_tile(a_bufs, slot, PART, BLOCK_M, STAGES)
                if FAST:  # wgmma's default for FP8: never promote
                    acc = warpgroup_mma(a_tile, b_tile, acc, use_acc=ki > 0, is_async=True)
                else:
                    acc = warpgroup_mma(
                        a_tile,
                        b_tile,
                        acc,
                        use_acc=ki > 0,
                        is_async=True,
                        max_num_imprecise_acc=IMPRECISE_ACC,
                    )
                if HAS_TAIL:
                    # the same A slot against the tail's B columns: this step's two wgmmas
                    # in flight, so the previous step's slot has been read
                    acc_t = warpgroup_mma(
                        a_bufs.index(slot), ring[B_TAIL_BUFS].index(slot), acc_t, use_acc=ki > 0,
                        is_async=True,
                    )  # fmt: skip
                    acc, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_t))
                else:
                    # one wgmma in flight: the previous step's slot has been read
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                if ki > 0:
                    mbarrier.arrive(empty.index(previous), count=1)
                previous = slot
                step += 1
            if CONSUMERS > 1 and not SHARED:
                mbarrier.arrive(turns.index(1 - WHICH), count=1)
            if HAS_TAIL:
                acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(previous), count=1)
        if SPLIT:
            acc, last = _split_partial(acc, unit, tile, tails, PART, PARTS)
            if FUSED:  # noqa: SIM108 - a constexpr branch
                live = live & last
            else:
                live = last
        out = acc
        if FP8:
            if EARLY_SCALES == 1:
                a_scale = gl.convert_layout(a_early, gl.SliceLayout(1, acc_layout))
                b_scale = gl.convert_layout(b_early, gl.SliceLayout(0, acc_layout))
            elif EARLY_SCALES == 2:
                a_scale = a_early
                b_scale = b_early
            else:
                a_scale, b_scale = _tile_scales(
                    a_scale_ptr, scales[B_SCALE], scale_m, off_n, scale_rows, N, acc
                )
            out = out * a_scale[:, None] * b_scale[None, :]
        out = out.to(out_dtype)
        # the store groups in flight that may stay so when c_smem is written again: the
        # tail's, issued after the first main part's (groups complete in order)
        TAIL_STORES: gl.constexpr = 1 if HAS_TAIL else 0
        if EPI_N == MAIN_N:
            first = out
        else:
            # columns h * EPI_N + n' as [BLOCK_M, EPI_N, 2]: h is a register bit of the
            # accumulator's layout, so the split moves no data
            first, second = out.reshape([BLOCK_M, 2, EPI_N]).permute((0, 2, 1)).split()
        if live:
            # the previous tile's stores have left c_smem (and ct_smem)
            tma.store_wait(pendings=0)
            c_smem.store(first)
            if HAS_TAIL:
                ct_smem.store(acc_t.to(out_dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [c_row, off_n], c_smem)
            if HAS_TAIL:
                tma.async_copy_shared_to_global(
                    descs[C_TAIL_DESC], [c_row, off_n + MAIN_N], ct_smem
                )
            if EPI_N != MAIN_N:
                # the first half has left c_smem (the tail's store may still be in flight)
                tma.store_wait(pendings=TAIL_STORES)
                c_smem.store(second)
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [c_row, off_n + EPI_N], c_smem)
        mine += 1  # noqa: SIM113 - the loop strides by CONSUMERS
    tma.store_wait(pendings=0)


@gluon.jit
def _split_partial(acc, unit, tile, tails, PART: gl.constexpr, PARTS: gl.constexpr):
    """Split tail: a tail unit's fp32 partial (this consumer's PART of its tile's rows) to
    the workspace, then a ticket; the last of the tile's K ranges to arrive sums every
    partial in K order (deterministic) and stores the tile. (acc, whether this consumer
    stores the tile.) Stores, a barrier of the consumer's warps, then the ticket's gpu-scope
    release: the partials are visible to whoever takes the last ticket; that one resets
    the counter for the next launch (`persistent`'s split tail, in a consumer's warps)."""
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    BLOCK_N: gl.constexpr = acc.type.shape[1]
    SIZE: gl.constexpr = BLOCK_M * BLOCK_N
    dp_tiles = tails[WHOLE_TILES]
    split = tails[SPLITS]
    last = unit < dp_tiles
    if unit >= dp_tiles:
        local = tile - dp_tiles
        offs = _register_order(acc)
        # workspace [tail tiles, split, PARTS, BLOCK_M, BLOCK_N]
        base = tails[WORKSPACE] + ((local * split).to(gl.int64) * PARTS + PART) * SIZE
        gl.store(base + ((unit - dp_tiles) % split) * (PARTS * SIZE) + offs, acc)
        gl.thread_barrier()
        counter = tails[COUNTERS] + local * PARTS + PART
        ticket = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        last = ticket == split - 1
        if last:
            acc = gl.zeros_like(acc)
            for p in range(split):
                acc += gl.load(base + p * (PARTS * SIZE) + offs, cache_modifier=".cg")
            gl.store(counter, 0)
    return acc, last


@gluon.jit
def _register_order(acc):
    """A [BLOCK_M, BLOCK_N] fp32 tile's offsets in a partial's workspace, in the order the
    threads hold it: wgmma's accumulator gives each warp 16 rows, each thread two adjacent
    columns of rows r and r + 8 per 8 columns; here each such pair lies beside the next
    thread's, so a warp's store of one pair is 256 contiguous bytes (row-major, its 8 rows x 8
    bytes touched 8 lines a store: the split tail's fix-up cost more than the wave it saved,
    one H200 (profiles/h200/NOTES_gemm.md)). Written and read in the same order, so any layout is correct; this one is
    the fast one for a tile of 16 rows a warp (`GluonGemmConfig.check`)."""
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    BLOCK_N: gl.constexpr = acc.type.shape[1]
    layout: gl.constexpr = acc.type.layout
    THREADS: gl.constexpr = 32 * gl.num_warps()
    gl.static_assert(BLOCK_M * 32 == 16 * THREADS)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))[:, None]
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))[None, :]
    thread = (rows // 16) * 32 + (rows % 8) * 4 + (cols % 8) // 2
    pair = (cols // 8) * 2 + (rows % 16) // 8
    return (pair * THREADS + thread) * 2 + cols % 2


@gluon.jit
def _early_scales(
    a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr
):  # fmt: skip
    """FP8: the scales of the tile at (off_m, off_n), spread one a thread (`_tile_scales`'
    masks; the epilogue moves them to the accumulator's layout)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    rows = off_m + gl.arange(0, BLOCK_M, layout=layout)
    cols = off_n + gl.arange(0, BLOCK_N, layout=layout)
    a_scale = gl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    b_scale = gl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)
    return a_scale, b_scale


@gluon.jit
def _tile_scales(a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc):
    """FP8: the scales of the tile at (off_m, off_n) that acc holds, in its layout's rows and
    columns (0 past the matrix's M rows and N columns: fused, past the chunk's rows)."""
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    BLOCK_N: gl.constexpr = acc.type.shape[1]
    layout: gl.constexpr = acc.type.layout
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    a_scale = gl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    b_scale = gl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)
    return a_scale, b_scale


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
def _promote_each_step(a_bufs, b_bufs, bars, acc, step, k_steps, PART: gl.constexpr):
    """FP8, promoted by hand: each K step's products summed by the tensor cores alone, then
    added to the fp32 accumulator once they are done (no wgmma of this warpgroup in flight
    while its registers are read: ptxas serializes every wgmma otherwise, C7514); another
    warpgroup's wgmmas keep the tensor cores busy meanwhile. (acc, step) after the tile."""
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
    return acc, step


# one function per role and accumulation: Triton 3.6 hands constexprs to partitions as tensors
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
