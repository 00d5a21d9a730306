"""A Gluon GEMM consumer's epilogue (`ficco.kernels.gluon_consumer` runs it after each tile's K
loop): FP8's scales (loaded before the K loop or after it), a split tail's fp32 partials and
their sum, and the tile's TMA stores (whole, in column halves, and a column tail's)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from ficco.kernels.gluon_ring import COUNTERS, SPLITS, WHOLE_TILES, WORKSPACE


@gluon.constexpr_function
def _early_scales_mode(fp8, fused, consumers, shared):
    """When a tile's FP8 scales load: 0 in the epilogue; 1 before its K loop, one a thread,
    moved to the accumulator's layout in the epilogue; 2 before its K loop, in the
    accumulator's layout. In the epilogue their latency stands between the last wgmma and the
    stores, and a fused launch's is a chain: the chunk's cached table entry, then its scales.
    Three consumers sharing a tile (152 registers each): 1 (+1.7-4% for 192-row tiles at
    512-4096 rows, one H200 (profiles/h200/NOTES_gemm.md); in that layout they spill). Two
    sharing one (232 registers), fused only: 2 (+1.2-4% over the same launch with scales in
    the epilogue, one H200 (profiles/h200/NOTES_gemm.md); the plain kernel ran 1.5% slower
    with it at 4096-16384 rows, and 3-6% slower with the first form)."""
    if fp8 and consumers == 3:
        return 1
    if fp8 and fused and consumers == 2 and shared:
        return 2
    return 0


@gluon.jit
def _scales_before_k(
    a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc, EARLY: gl.constexpr
):  # fmt: skip
    """FP8: the scales (a_scale [BLOCK_M], b_scale [BLOCK_N]) of the tile at (off_m, off_n)
    that acc [BLOCK_M, BLOCK_N] will hold, loaded before its K loop as `_early_scales_mode`
    EARLY says; () where the epilogue loads them (`_scaled`)."""
    if EARLY == 1:
        early = _early_scales(
            a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc.type.shape[0], acc.type.shape[1]
        )
    elif EARLY == 2:
        early = _tile_scales(a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc)
    else:
        early = ()
    return early


@gluon.jit
def _scaled(acc, early, a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, EARLY: gl.constexpr):
    """FP8: acc [BLOCK_M, BLOCK_N] times its rows' and columns' scales: `early`'s
    (`_scales_before_k`), or loaded now (EARLY 0)."""
    layout: gl.constexpr = acc.type.layout
    if EARLY == 1:
        a_scale = gl.convert_layout(early[0], gl.SliceLayout(1, layout))
        b_scale = gl.convert_layout(early[1], gl.SliceLayout(0, layout))
    elif EARLY == 2:
        a_scale = early[0]
        b_scale = early[1]
    else:
        a_scale, b_scale = _tile_scales(a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc)
    return acc * a_scale[:, None] * b_scale[None, :]


@gluon.jit
def _early_scales(
    a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr
):  # fmt: skip
    """FP8: the scales of the tile at (off_m, off_n), a_scale [BLOCK_M] and b_scale
    [BLOCK_N], spread one a thread (`_tile_scales`' masks; the epilogue moves them to the
    accumulator's layout)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    rows = off_m + gl.arange(0, BLOCK_M, layout=layout)
    cols = off_n + gl.arange(0, BLOCK_N, layout=layout)
    a_scale = gl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    b_scale = gl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)
    return a_scale, b_scale


@gluon.jit
def _tile_scales(a_scale_ptr, b_scale_ptr, off_m, off_n, M, N, acc):
    """FP8: the scales of the tile at (off_m, off_n) that acc [BLOCK_M, BLOCK_N] holds,
    a_scale [BLOCK_M] and b_scale [BLOCK_N] in its layout's rows and columns (0 past the
    matrix's M rows and N columns: fused, past the chunk's rows)."""
    BLOCK_M: gl.constexpr = acc.type.shape[0]
    BLOCK_N: gl.constexpr = acc.type.shape[1]
    layout: gl.constexpr = acc.type.layout
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    a_scale = gl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    b_scale = gl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)
    return a_scale, b_scale


@gluon.jit
def _split_partial(acc, unit, tile, tails, PART: gl.constexpr, PARTS: gl.constexpr):
    """Split tail: a tail unit's fp32 partial acc [BLOCK_M, BLOCK_N] (this consumer's PART of
    its tile's rows) to the workspace, then a ticket; the last of the tile's K ranges to
    arrive sums every partial in K order (deterministic) and stores the tile. (acc, whether
    this consumer stores the tile.) Stores, a barrier of the consumer's warps, then the
    ticket's gpu-scope release: the partials are visible to whoever takes the last ticket;
    that one resets the counter for the next launch (`persistent`'s split tail, in a
    consumer's warps)."""
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
    one H200 (profiles/h200/NOTES_gemm.md)). Written and read in the same order, so any
    layout is correct; this one is the fast one for a tile of 16 rows a warp
    (`GluonGemmConfig.check`)."""
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
def _store_tile(out, acc_t, live, c_desc, c_smem, ct_desc, ct_smem, c_row, off_n):
    """One tile's stores at (c_row, off_n), where `live` (this consumer stores it): out
    [BLOCK_M, MAIN_N] through c_smem [BLOCK_M, EPI_N], whole or in two column halves (c's TMA
    block says which: the halves free shared memory for another ring slot), and a column
    tail's fp32 acc_t [BLOCK_M, TAIL_N] through ct_smem at column off_n + MAIN_N (acc_t,
    ct_desc and ct_smem None without a tail). The stores stay in flight past the return."""
    BLOCK_M: gl.constexpr = out.type.shape[0]
    MAIN_N: gl.constexpr = out.type.shape[1]
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    HAS_TAIL: gl.constexpr = acc_t is not None
    gl.static_assert(EPI_N == MAIN_N or 2 * EPI_N == MAIN_N)
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
            ct_smem.store(acc_t.to(out.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [c_row, off_n], c_smem)
        if HAS_TAIL:
            tma.async_copy_shared_to_global(ct_desc, [c_row, off_n + MAIN_N], ct_smem)
        if EPI_N != MAIN_N:
            # the first half has left c_smem (the tail's store may still be in flight)
            tma.store_wait(pendings=TAIL_STORES)
            c_smem.store(second)
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [c_row, off_n + EPI_N], c_smem)
