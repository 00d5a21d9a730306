"""The pieces every partition of the Gluon GEMM (`ficco.kernels.gluon_gemm`, its swap-AB
form `ficco.kernels.gluon_swap`) shares: the accumulator's register layout, the tile order,
and the ring's slot handshake (a slot's ``empty`` barrier completes when its consumer has
read it, its ``ready`` barrier when its TMA loads have landed)."""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

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


# The launch's arguments reach every partition as five tuples of values (no constexprs:
# `gluon_consumer`'s note on its role functions says why); each position has a name.
# descs: the TMA descriptors of A, B and C, then a tail's (16-bit tiles no power of two
# wide): its B columns and its store
A_DESC = gl.constexpr(0)
B_DESC = gl.constexpr(1)
C_DESC = gl.constexpr(2)
B_TAIL_DESC = gl.constexpr(3)
C_TAIL_DESC = gl.constexpr(4)
# ring: the shared-memory slots of A, B and a tail's B columns
A_BUFS = gl.constexpr(0)
B_BUFS = gl.constexpr(1)
B_TAIL_BUFS = gl.constexpr(2)
# bars: a slot's loads landed, a slot read by its consumers, ping-pong's turns
READY = gl.constexpr(0)
EMPTY = gl.constexpr(1)
TURNS = gl.constexpr(2)
# scales: the scale pointers, then a fused launch's chunk table and the rest (below)
A_SCALE = gl.constexpr(0)
B_SCALE = gl.constexpr(1)
CHUNK_TABLE = gl.constexpr(2)
FLAG = gl.constexpr(3)
STATUS = gl.constexpr(4)
CHUNK_ROWS = gl.constexpr(5)
CHUNKS = gl.constexpr(6)
BUDGET_NS = gl.constexpr(7)
CHUNK_MULTIPLIER = gl.constexpr(8)
FIRST_A_ROW = gl.constexpr(9)
FIRST_FLAG = gl.constexpr(10)
FIRST_WAITS = gl.constexpr(11)
A2_DESC = gl.constexpr(12)
# tails (a split tail, `_units`): the fp32 partials' workspace, the tail tiles' arrival
# counters, the whole tiles, K ranges a tail tile, K steps a range
WORKSPACE = gl.constexpr(0)
COUNTERS = gl.constexpr(1)
WHOLE_TILES = gl.constexpr(2)
SPLITS = gl.constexpr(3)
SPLIT_STEPS = gl.constexpr(4)

# A fused launch (`ficco.kernels.gluon_fused`) passes, after the two scale pointers, its
# chunk table (int64 [chunks, CHUNK_COLS]: each chunk's first row in A's span and in C's,
# its A scales' offset from the scale reference, its wait flag's offset from the flag
# reference, whether it waits), the flag reference, the status, a chunk's rows, the chunk
# count, the wait's budget in ns, the chunk divisor's multiplier (`gluon_fused.
# chunk_multiplier`), chunk 0's first A row, flag and whether it waits (its table entry's,
# as arguments: the wait at a program's start reads no table first) and the second A
# buffer's descriptor (`_fused_launch`). A's first rows in the table (and chunk 0's
# argument) are encoded: the row twice, plus 1 in the second A buffer (`_copy_a`)
CHUNK_COLS = gl.constexpr(5)


# The modes a launch's groups carry (a partition takes no constexprs, so a mode travels as a
# group's length): one predicate a mode, called wherever it is asked.
@gluon.constexpr_function
def _fused_launch(scales):
    """A fused launch (`ficco.kernels.gluon_fused`): the chunk table and the rest follow the
    two scale pointers."""
    return len(scales) > CHUNK_TABLE.value


@gluon.constexpr_function
def _column_tail(ring):
    """A tile with a column tail (16-bit tiles no power of two wide): the ring holds the
    tail's B columns, descs its B and C descriptors."""
    return len(ring) > B_TAIL_BUFS.value


@gluon.constexpr_function
def _split_tail(tails):
    """A split tail (`_units`): tails holds its workspace, counters and bounds."""
    return len(tails) > 0


@gluon.jit
def _grid(c_desc, K, scales, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """(row tiles, column tiles, K steps, rows): of the product, or of a fused launch's
    chunks' rows back to back in the order given (`_chunk_of`), tiled and grouped as one
    product's rows: no tile is padded at a chunk's end, and few-row chunks share each B
    column block in L2 (chunk after chunk, 2 x 128 rows of 28672x8192 read all of B twice:
    0.65 of `_scaled_mm` on one H100)."""
    if _fused_launch(scales):  # noqa: SIM108 - a constexpr branch, kept as the kernels' others
        rows = scales[CHUNK_ROWS] * scales[CHUNKS]
    else:
        rows = c_desc.shape[0]
    num_pid_m, num_pid_n, k_steps = _tile_grid(rows, c_desc.shape[1], K, TILE_M, BLOCK_N, BLOCK_K)
    return num_pid_m, num_pid_n, k_steps, rows


@gluon.jit
def _chunk_of(row, scales):
    """Fused: where the launch's row `row` lies (its chunks' rows back to back; a row past
    them in the last chunk, past its rows): (its chunk, its row in the chunk, the chunk's
    table entry). A tile's row blocks (64-row parts, or whole tiles) each lie in one chunk
    (`gluon_fused.plan`: every chunk's rows a multiple of them). row // rows as a multiply
    by the host's `gluon_fused.chunk_multiplier` (0 for one chunk): a division is ~25
    dependent instructions, and the producer's two for a tile's 64-row blocks, after its
    slot's wait, cost the fused launch ~0.3 us a tile against the plain kernel."""
    rows = scales[CHUNK_ROWS]
    chunk = gl.minimum(
        ((row.to(gl.int64) * scales[CHUNK_MULTIPLIER]) >> 32).to(gl.int32), scales[CHUNKS] - 1
    )
    return chunk, row - chunk * rows, scales[CHUNK_TABLE] + chunk * CHUNK_COLS


@gluon.jit
def _entry_cached(chunk, entry, COL: gl.constexpr, cached, value):
    """Column COL of a chunk's table entry, read only when the chunk is not the one
    `cached` (whose column holds `value`): a program's tiles mostly stay in a chunk, and a
    table read every tile cost ~1% of a fused launch against the plain kernel (one H200,
    profiles/h200/NOTES_gemm.md: the consumers' reads; the producer's, ~0.3%). (value, the
    chunk it is of.)"""
    if chunk != cached:
        value = gl.load(entry + COL)
        cached = chunk
    return value, cached


@gluon.jit
def _a_places(off_m, scales, A_ROWS: gl.constexpr, A_BLOCKS: gl.constexpr):
    """Fused, the producer: (chunk, row in it) of each of a tile's A_BLOCKS row blocks,
    arithmetic only: placed before the tile's first slot wait, so only the cached table
    read and the wait stand between a slot's release and its loads."""
    chunk0, local0, _e0 = _chunk_of(off_m, scales)
    if A_BLOCKS == 1:
        places = ((chunk0, local0),)
    else:
        gl.static_assert(A_BLOCKS == 3)
        chunk1, local1, _e1 = _chunk_of(off_m + A_ROWS, scales)
        chunk2, local2, _e2 = _chunk_of(off_m + 2 * A_ROWS, scales)
        places = ((chunk0, local0), (chunk1, local1), (chunk2, local2))
    return places


@gluon.jit
def _a_block_row(place, row, total, scales, arrived, cached, a_base):
    """Fused, the producer: A's row of the row block at launch row `row` (in chunk
    place[0], its row place[1] there), once its chunk has arrived ((A's row, the chunks
    seen arrived: bit c, chunks past 62 waited on each time, and the cached chunk and its
    first A row)). A block past the launch's rows is read unwaited (never stored)."""
    chunk = place[0]
    a_base, cached = _entry_cached(
        chunk, scales[CHUNK_TABLE] + chunk * CHUNK_COLS, 0, cached, a_base
    )
    if row < total:
        bit = gl.to_tensor(1).to(gl.int64) << gl.minimum(chunk, 63).to(gl.int64)
        if (chunk > 62) | ((arrived & bit) == 0):
            _wait_chunk(scales, chunk)
            arrived = arrived | bit
    # the table's encoding (`gluon_fused`): A's row twice, plus 1 in the second A buffer
    return a_base.to(gl.int32) + 2 * place[1], arrived, cached, a_base


@gluon.jit
def _a_rows(
    off_m, places, total, scales, arrived, cached, a_base, A_ROWS: gl.constexpr,
    A_BLOCKS: gl.constexpr,
):  # fmt: skip
    """A's row of each of a tile's A_BLOCKS row blocks (fused: each waited on, placed by
    `_a_places`, in the table's encoding that `_copy_a` reads), the chunks seen arrived, and
    the producer's cached table entry (`_a_block_row`)."""
    if _fused_launch(scales):
        row0, arrived, cached, a_base = _a_block_row(
            places[0], off_m, total, scales, arrived, cached, a_base
        )
        if A_BLOCKS == 1:
            rows = (row0,)
        else:
            gl.static_assert(A_BLOCKS == 3)
            row1, arrived, cached, a_base = _a_block_row(
                places[1], off_m + A_ROWS, total, scales, arrived, cached, a_base
            )
            row2, arrived, cached, a_base = _a_block_row(
                places[2], off_m + 2 * A_ROWS, total, scales, arrived, cached, a_base
            )
            rows = (row0, row1, row2)
    elif A_BLOCKS == 1:
        rows = (off_m,)
    else:
        gl.static_assert(A_BLOCKS == 3)
        rows = (off_m, off_m + A_ROWS, off_m + 2 * A_ROWS)
    return rows, arrived, cached, a_base


@gluon.jit
def _copy_a(a_desc, scales, a_row, k, bar, dest):
    """One A block's TMA load at (a_row, k) (`_a_rows`). Fused, a_row is the table's
    encoding: the row twice, plus 1 where it lies in the second A buffer (scales[A2_DESC]: an
    all-gather's local shard, read in place beside the gathered rows)."""
    if _fused_launch(scales):
        if (a_row & 1) != 0:
            tma.async_copy_global_to_shared(scales[A2_DESC], [a_row >> 1, k], bar, dest)
        else:
            tma.async_copy_global_to_shared(a_desc, [a_row >> 1, k], bar, dest)
    else:
        tma.async_copy_global_to_shared(a_desc, [a_row, k], bar, dest)


@gluon.jit
def _units(tiles, tails):
    """The launch's work units: its tiles, or (split tail, `tails` = (workspace, counters,
    whole tiles, K ranges a tail tile, K steps a range)) the whole tiles and every tail
    tile's K ranges."""
    if _split_tail(tails):  # noqa: SIM108 - a constexpr branch
        units = tails[WHOLE_TILES] + (tiles - tails[WHOLE_TILES]) * tails[SPLITS]
    else:
        units = tiles
    return units


@gluon.jit
def _unit_work(unit, k_steps, tails):
    """(tile, first K step, K steps) of work unit `unit`: a whole tile, or one K range of a
    tail tile (split tail: the units past the whole tiles, `split` a tile). The divisions only
    in the tail: a whole tile's loads wait on none."""
    tile = unit
    k_lo = unit * 0
    k_count = k_steps + unit * 0
    if _split_tail(tails):  # noqa: SIM102 - a constexpr branch around a runtime one
        if unit >= tails[WHOLE_TILES]:
            tail = unit - tails[WHOLE_TILES]
            tile = tails[WHOLE_TILES] + tail // tails[SPLITS]
            k_lo = (tail % tails[SPLITS]) * tails[SPLIT_STEPS]
            k_count = gl.minimum(tails[SPLIT_STEPS], k_steps - k_lo)
    return tile, k_lo, k_count


@gluon.jit
def _ptx(STATEMENT: gl.constexpr, args, CONSTRAINTS: gl.constexpr):
    # one PTX statement on scalars, its 32-bit result (`ficco.kernels.flags`' own, in Gluon)
    return gl.inline_asm_elementwise(
        STATEMENT, CONSTRAINTS, args, dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _prefetch_chunks(scales):
    """Fused, the first consumer before its first slot lands (its warps idle meanwhile):
    every chunk's table entry and waiting flag into L2 (the first 32 x warps chunks: a
    hint), so where a program's tiles move to another chunk mid-launch the producer's table
    read and acquire hit L2, not DRAM (one H200, profiles/h200/NOTES_gemm.md: that move cost the two-chunk launch 1-2
    us a program against one chunk). A flag not set yet stays coherent: L2 is where peers'
    and copy engines' writes land."""
    THREADS: gl.constexpr = 32 * gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    chunk = gl.arange(0, THREADS, layout=layout)
    live = chunk < scales[CHUNKS]
    entry = scales[CHUNK_TABLE] + chunk * CHUNK_COLS
    waits = gl.load(entry + 4, mask=live, other=0)
    offset = gl.load(entry + 3, mask=live, other=0)
    flag = scales[FLAG] + gl.where(live & (waits != 0), offset, 0)
    gl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [flag], dtype=gl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def _wait_chunk(scales, chunk):
    """Fused, the producer: before a chunk's first TMA load, wait until its flag is nonzero
    (as `ficco.kernels.flags._wait_flag`: an acquire, volatile reads while 0, give up by a
    CAS to -1 after the budget on %globaltimer) and record a give-up in the status; then
    order the TMA reads (async proxy) after the acquire. A chunk given up is still loaded and
    computed (the consumers take every slot); the status makes the launch's owner raise."""
    if chunk == 0:
        # from the arguments: at a program's start the table's reads (two, dependent: the
        # compiler issues the flag offset's under the wait bit's branch) would come first
        waits = scales[FIRST_WAITS]
        flag = scales[FIRST_FLAG]
    else:
        entry = scales[CHUNK_TABLE] + chunk * CHUNK_COLS
        waits = gl.load(entry + 4).to(gl.int32)
        flag = scales[FLAG] + gl.load(entry + 3)
    if waits != 0:
        val = _ptx("ld.acquire.sys.global.b32 $0, [$1];", [flag], "=r,l")
        if val == 0:
            start = _clock()
            while val == 0:
                val = gl.load(flag, volatile=True)
                if (val == 0) & (_clock() - start > scales[BUDGET_NS]):
                    _ptx(
                        "{ .reg .b32 zero, gone; mov.b32 zero, 0; mov.b32 gone, -1;\n\t"
                        "atom.acq_rel.sys.global.cas.b32 $0, [$1], zero, gone; }",
                        [flag], "=r,l",
                    )  # fmt: skip
                    val = _ptx("ld.acquire.sys.global.b32 $0, [$1];", [flag], "=r,l")
            val = _ptx("ld.acquire.sys.global.b32 $0, [$1];", [flag], "=r,l")
        if val < 0:
            gl.store(scales[STATUS] + chunk, 1)
        _ptx("fence.proxy.async.global;\n\tmov.u32 $0, 0;", [], "=r")


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
    )
