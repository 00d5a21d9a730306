"""The fused GEMM's device code: one persistent Triton kernel over row chunks that wait on,
or set, flags (``ficco.kernels.fused`` says what it computes and prepares its launches).

Per program: claim a tile (or take tile ``program_id`` where nothing signals and no flag is
reset), find its chunk and place (arithmetic where every chunk has as many tiles, groups of
``chunk_group`` chunks numbered as one row range; else the tile -> chunk map) and the
chunk's table row, acquire the chunk's flag where it has one, run the K
loop through TMA descriptors or pointer loads, store the tile (TMA, or pointer stores where
the chunk signals or has copies), count it and publish the chunk's flags with its last
tile. The last program to finish zeroes the counters for the next launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ficco.kernels.flags import _bulk_store_wait, _proxy_fence, _wait_flag
from ficco.kernels.persistent import _store_c_tile, _tile_coords
from ficco.kernels.scaled_kernel import _scale_tile
from ficco.kernels.tiles import _unit_coords

#: int64 fields per chunk in the kernel's chunk table (``table_ptr``)
_TABLE_COLS = 14
#: A row past any descriptor's rows that a TMA row coordinate (int32) can still name
NOWHERE_BLOCK: tl.constexpr = tl.constexpr(2**31 - 2**16)


@triton.jit
def _chunk_row(row, A_ALIGN: tl.constexpr, C_ALIGN: tl.constexpr):
    # A chunk's fields in the kernel's table (``_fused_gemm_kernel``'s ``table_ptr``)
    return (
        tl.multiple_of(tl.load(row), A_ALIGN),  # a_off
        tl.multiple_of(tl.load(row + 1), C_ALIGN),  # c_off
        tl.load(row + 2).to(tl.int32),  # rows
        tl.load(row + 3).to(tl.int32),  # tile_start
        tl.load(row + 4),  # wait_off
        tl.load(row + 5),  # signal_off
        tl.load(row + 6),  # has_wait
        tl.load(row + 7),  # has_signal
        tl.load(row + 8),  # copy_start
        tl.load(row + 9).to(tl.int32),  # copy_count
        tl.load(row + 10),  # counted
        tl.load(row + 12).to(tl.int32),  # a_blk0
        tl.load(row + 13).to(tl.int32),  # c_blk0
    )


@triton.jit
def _unit_tile(unit, dp_tiles, split, SPLIT_TAIL: tl.constexpr):
    # The tile of work unit `unit`: units are tiles, but for SPLIT_TAIL's split tiles (past
    # dp_tiles), `split` units each (`tiles._unit_coords`)
    tile = unit
    if SPLIT_TAIL:
        tile = tl.where(unit >= dp_tiles, dp_tiles + tl.maximum(unit - dp_tiles, 0) // split, unit)
    return tile


@triton.jit
def _tile_place(
    tile, num_tiles, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, tile_chunk_ptr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    # (chunk, pid_m, pid_n) of `tile` (the last tile's past the end). Where every chunk has
    # `tiles_per_chunk` tiles, by arithmetic: `chunk_group` consecutive chunks are numbered
    # as one range of row blocks in grouped order (1: chunk by chunk). Else the tile ->
    # chunk map (one more dependent global load ahead of the chunk's table row, its flag and
    # the tile's first TMA loads), pid_m = pid_n = -1: the caller places the tile in its
    # chunk once it has the chunk's rows.
    last = tl.minimum(tile, num_tiles - 1)
    if tiles_per_chunk > 0:
        chunk, pid_m, pid_n = _grouped_place(
            last, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, GROUP_M
        )
    else:
        chunk = tl.load(tile_chunk_ptr + last)
        pid_m = -1
        pid_n = -1
    return chunk, pid_m, pid_n


@triton.jit
def _grouped_place(
    tile, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, GROUP_M: tl.constexpr
):  # fmt: skip
    # (chunk, pid_m, pid_n) of `tile` where every chunk has `tiles_per_chunk` tiles:
    # `chunk_group` consecutive chunks numbered as one range of row blocks in grouped order
    group_tiles = chunk_group * tiles_per_chunk
    group = tile // group_tiles
    first = group * chunk_group
    blocks = tiles_per_chunk // num_pid_n  # row blocks a chunk
    members = tl.minimum(chunk_group, num_chunks - first)
    row_block, pid_n = _tile_coords(
        tile - group * group_tiles, members * blocks, num_pid_n, GROUP_M
    )
    member = row_block // blocks
    return first + member, row_block - member * blocks, pid_n


@triton.jit
def _wait_group(
    group, num_chunks, chunk_group, flag_ref, table_ptr, status_ptr, budget_ns,
    ON_GPU: tl.constexpr, TABLE_COLS: tl.constexpr,
):  # fmt: skip
    # Wait for every chunk of `group` that waits on a flag; the members whose wait gave up
    # (status set), as bits from the group's first chunk (0: all arrived)
    failed = tl.zeros((), dtype=tl.int64)
    first = group * chunk_group
    for c in range(first, tl.minimum(first + chunk_group, num_chunks)):
        row = table_ptr + c * TABLE_COLS
        if tl.load(row + 6) != 0:  # noqa: SIM102 - wait only where the chunk has a flag
            if _wait_flag(flag_ref + tl.load(row + 4), budget_ns, ON_GPU) <= 0:
                tl.store(status_ptr + c, 1)
                failed = failed | (tl.full((), 1, tl.int64) << (c - first).to(tl.int64))
    return failed


@triton.jit
def _group_arrived(
    group, num_chunks, chunk_group, flag_ref, table_ptr, ON_GPU: tl.constexpr,
    TABLE_COLS: tl.constexpr,
):  # fmt: skip
    # Whether every chunk of `group` has arrived already (no wait). One answer for the whole
    # program: the run's end follows from it, and warps that ran different loops would
    # deadlock, so each flag is read by a scalar atomic (one thread's acquire, handed to the
    # others through shared memory), not by every thread's own load as in `_wait_flag`.
    arrived = 1
    first = group * chunk_group
    for c in range(first, tl.minimum(first + chunk_group, num_chunks)):
        row = table_ptr + c * TABLE_COLS
        if tl.load(row + 6) != 0:  # noqa: SIM102 - read only where the chunk has a flag
            flag = tl.atomic_add(flag_ref + tl.load(row + 4), 0, sem="acquire", scope="sys")
            if flag <= 0:
                arrived = 0
    return arrived


@triton.jit
def _ready_runs(
    a_desc, b_desc, c_desc, flag_ref, table_ptr, status_ptr, num_chunks, num_tiles,
    tiles_per_chunk, chunk_group, num_pid_n, k_tiles, budget_ns,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    B_COL_MAJOR: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, ON_GPU: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, TABLE_COLS: tl.constexpr,
):  # fmt: skip
    # Tile t is program t mod G's (nothing signals, so no peer waits on a program that is
    # not resident yet). From its next tile a program waits for that tile's chunk group,
    # takes every later group whose chunks have arrived too, and runs its tiles of them in
    # one flattened loop, the persistent kernel's: the next tile's first loads are issued
    # under the last one's K steps and epilogue, where a tile-by-tile loop restarts its
    # pipeline at every tile (with every flag set: one run, the whole launch).
    programs = tl.num_programs(0)
    group_tiles = chunk_group * tiles_per_chunk
    num_groups = tl.cdiv(num_chunks, chunk_group)
    tile = tl.program_id(0)
    while tile < num_tiles:
        group = tile // group_tiles
        failed = _wait_group(
            group, num_chunks, chunk_group, flag_ref, table_ptr, status_ptr, budget_ns, ON_GPU,
            TABLE_COLS,
        )  # fmt: skip
        next_group = group + 1
        if failed == 0:  # a run over the later groups that have arrived as well
            more = next_group < num_groups
            while more:
                more = _group_arrived(
                    next_group, num_chunks, chunk_group, flag_ref, table_ptr, ON_GPU, TABLE_COLS
                ) != 0  # fmt: skip
                if more:
                    next_group += 1
                    more = next_group < num_groups
        end = tl.minimum(next_group * group_tiles, num_tiles)
        first_chunk = group * chunk_group  # `failed`'s bit 0 (only the run's first group fails)
        if ON_GPU:
            _proxy_fence()  # the TMA loads below after the flags' acquires
        tile_c = tile - programs
        for t in tl.range(tile, end, programs, flatten=True):
            chunk, pid_m, pid_n = _grouped_place(
                t, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, GROUP_M
            )
            a_blk = pid_m + tl.load(table_ptr + chunk * TABLE_COLS + 12).to(tl.int32)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in tl.range(0, k_tiles):
                a = a_desc.load([a_blk * BLOCK_M, ki * BLOCK_K])
                if B_COL_MAJOR:
                    b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
                else:
                    b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
                acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            # the epilogue's place from its own counter, as the persistent kernel's
            tile_c += programs
            chunk_c, pid_mc, pid_nc = _grouped_place(
                tile_c, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, GROUP_M
            )
            c_blk = pid_mc + tl.load(table_ptr + chunk_c * TABLE_COLS + 13).to(tl.int32)
            # a chunk whose wait gave up stores nowhere: its row block is moved past the
            # descriptor's rows, where TMA writes nothing (a branch around the store here
            # cost 60 registers and serialized the wgmmas in the offline sm_90 compile)
            bit = tl.minimum(tl.maximum(chunk_c - first_chunk, 0), 63).to(tl.int64)
            c_blk = tl.where(((failed >> bit) & 1) != 0, NOWHERE_BLOCK // BLOCK_M, c_blk)
            _store_c_tile(c_desc, acc, c_blk, pid_nc, BLOCK_M, BLOCK_N, False, EPILOGUE_SUBTILE)
        tile += tl.cdiv(end - tile, programs) * programs  # this program's first tile past the run


@triton.jit
def _column_halves(x, BLOCK_M: tl.constexpr, COLS: tl.constexpr):
    # x [BLOCK_M, COLS] as its two [BLOCK_M, COLS / 2] column blocks, left then right
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _store_column_eighths(
    c_ref, c_off, x, offs_cm, col, rows, N, stride_cm, stride_cn, copy_ptr, copy_start,
    copy_count, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_ALIGN: tl.constexpr,
    OFFSETS_32: tl.constexpr,
):  # fmt: skip
    # x [BLOCK_M, BLOCK_N] (the output's dtype) to every destination, an eighth of its
    # columns at a time, left to right
    E: tl.constexpr = BLOCK_N // 8
    h0, h1 = _column_halves(x, BLOCK_M, BLOCK_N)
    q0, q1 = _column_halves(h0, BLOCK_M, 4 * E)
    q2, q3 = _column_halves(h1, BLOCK_M, 4 * E)
    e0, e1 = _column_halves(q0, BLOCK_M, 2 * E)
    e2, e3 = _column_halves(q1, BLOCK_M, 2 * E)
    e4, e5 = _column_halves(q2, BLOCK_M, 2 * E)
    e6, e7 = _column_halves(q3, BLOCK_M, 2 * E)
    dest = (c_ref, c_off, rows, N, stride_cm, stride_cn, copy_ptr, copy_start, copy_count)
    _store_everywhere(e0, col, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e1, col + E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e2, col + 2 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e3, col + 3 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e4, col + 4 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e5, col + 5 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e6, col + 6 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)
    _store_everywhere(e7, col + 7 * E, dest, offs_cm, C_ALIGN, E, OFFSETS_32)


@triton.jit
def _store_everywhere(
    part, col, dest, offs_cm, C_ALIGN: tl.constexpr, COLS: tl.constexpr,
    OFFSETS_32: tl.constexpr,
):  # fmt: skip
    # part [BLOCK_M, COLS] to its place (rows offs_cm, columns col + [0, COLS), inside
    # [rows, N]) in the chunk's output and in every further destination of the chunk
    # (dest: the output's ref, offset, rows, N, strides; the copy table's rows): the offsets
    # and the mask are made once for all of them
    c_ref, c_off, rows, N, stride_cm, stride_cn, copy_ptr, copy_start, copy_count = dest
    offs_cn = (col + tl.arange(0, COLS)).to(tl.int64)
    offs = offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    if OFFSETS_32:  # every chunk's [rows, N] spans fewer than 2**31 elements (host-checked)
        offs = offs.to(tl.int32)
    mask = (offs_cm[:, None] < rows) & (offs_cn[None, :] < N)
    tl.store(c_ref + tl.multiple_of(c_off, C_ALIGN) + offs, part, mask=mask)
    for e in range(copy_count):
        copy_off = tl.multiple_of(tl.load(copy_ptr + (copy_start + e) * 3), C_ALIGN)
        tl.store(c_ref + copy_off + offs, part, mask=mask)


# chunk_group and the split plan unspecialised: 1 (chunk by chunk) and a group compile to one
# kernel, and one split kernel serves every plan
@triton.jit(do_not_specialize=["chunk_group", "num_units", "dp_tiles", "split", "k_per_split"])
def _fused_gemm_kernel(
    a_ref,  # every A chunk is a_ref + offset: rows [rows_i, K], strides (stride_am, stride_ak)
    b_ptr,  # B [K, N], strides (stride_bk, stride_bn)
    b_desc,  # TMA: B's host-built descriptor ([K, N], or B^T [N, K] when B_COL_MAJOR)
    a_host_desc,  # HOST_DESCS: every A chunk's rows in one host-built descriptor [rows, K]
    c_host_desc,  # HOST_DESCS: every TMA-stored output chunk's rows, [rows, N]
    c_ref,  # every output chunk is c_ref + offset: [rows_i, N], strides (stride_cm, stride_cn)
    flag_ref,  # int32: every flag is flag_ref + offset
    table_ptr,  # int64 [chunks, TABLE_COLS]: a_off, c_off, rows, tile_start, wait_off,
    #            signal_off, has_wait, has_signal, copy_start, copy_count, counted, a_scale_off,
    #            a_blk0, c_blk0 (offsets may be negative: they are from private refs; counted:
    #            some destination signals; HOST_DESCS: the chunk's first BLOCK_M row block in
    #            the host descriptors)
    copy_ptr,  # int64 [copies, 3]: c_off, signal_off, has_signal of each further destination
    tile_chunk_ptr,  # int32 [tiles]: the chunk of each tile
    work_ptr,  # int32 [2 + chunks]: next unit to claim, programs done, tiles stored per
    #           chunk; zero on entry, and zeroed again by the last program to finish
    ws_ptr,  # SPLIT_TAIL: fp32 partial tiles [split tiles, split, BLOCK_M, BLOCK_N]
    lock_ptr,  # SPLIT_TAIL: int32 arrivals per split tile, zero on entry and left zero
    status_ptr,  # int32 [chunks]: set to 1 where the chunk's wait gave up (never cleared here)
    a_scale_ref,  # SCALED: fp32, every A chunk's scales are a_scale_ref + offset ([rows] or [1])
    b_scale_ptr,  # SCALED: fp32 [N] (B_COLWISE) or [1]
    num_chunks,
    num_tiles,
    tiles_per_chunk,  # every chunk's tile count where they are all equal, else 0
    chunk_group,  # tiles_per_chunk > 0: chunks numbered together (GemmConfig.chunk_group)
    num_units,  # work units: num_tiles, or with SPLIT_TAIL dp_tiles + split tiles x split
    dp_tiles,  # SPLIT_TAIL: whole tiles before the split ones (configs.split_plan)
    split,  # SPLIT_TAIL: K ranges per split tile
    k_per_split,  # SPLIT_TAIL: K steps per range
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    budget_ns,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_ALIGN: tl.constexpr,  # every A offset is a multiple of this many elements
    C_ALIGN: tl.constexpr,  # every output offset is a multiple of this many elements
    USE_TMA: tl.constexpr,  # A, B and (unsignalled) C through tensor descriptors
    B_COL_MAJOR: tl.constexpr,  # TMA: b_desc describes B^T [N, K]
    EPILOGUE_SUBTILE: tl.constexpr,  # TMA: store C in two [BLOCK_M, BLOCK_N / 2] halves
    ON_GPU: tl.constexpr,  # compiled for a GPU: %globaltimer and PTX fences (not interpreted)
    INPUT_PRECISION: tl.constexpr,
    TABLE_COLS: tl.constexpr,  # int64 fields per chunk in table_ptr
    POINTER_STORES: tl.constexpr = True,  # TMA: some chunk signals or has copies (False:
    #                                       no pointer-store epilogue to hold registers for)
    SCALED: tl.constexpr = False,  # fp8 operands: the scale epilogue (ficco.kernels.scaled)
    A_ROWWISE: tl.constexpr = False,  # SCALED: A's scales per row, else one per chunk
    B_COLWISE: tl.constexpr = False,  # SCALED: B's scales per column, else one
    IMPRECISE_ACC: tl.constexpr = None,  # SCALED: K elements a wgmma sums before promotion
    RESET_WAITS: tl.constexpr = False,  # the last program zeroes every chunk's wait flag
    HOST_DESCS: tl.constexpr = False,  # TMA: A and C through a_host_desc and c_host_desc
    SPLIT_TAIL: tl.constexpr = False,  # a short last wave's tiles split along K (split_plan)
    OFFSETS_32: tl.constexpr = False,  # POINTER_STORES: every chunk's output in int32 offsets
    READY_RUNS: tl.constexpr = False,  # HOST_DESCS, equal chunks, nothing signalled, no split
    #                                    tail: tiles by program, in runs of arrived chunks
):
    next_tile_ptr = work_ptr
    done_ptr = work_ptr + 1
    counter_ptr = work_ptr + 2
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if READY_RUNS:
        _ready_runs(
            a_host_desc, b_desc, c_host_desc, flag_ref, table_ptr, status_ptr, num_chunks,
            num_tiles, tiles_per_chunk, chunk_group, num_pid_n, k_tiles, budget_ns, BLOCK_M,
            BLOCK_N, BLOCK_K, GROUP_M, B_COL_MAJOR, EPILOGUE_SUBTILE, ON_GPU, INPUT_PRECISION,
            TABLE_COLS,
        )  # fmt: skip
        by_program = not RESET_WAITS  # no claim counter: a count only to reset the waits
    else:
        offs_k0 = tl.arange(0, BLOCK_K)
        C_COLS: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
        # Tiles are claimed in order from one counter, not dealt out by program id: a program
        # that is not resident yet (its SM held by a kernel beside this one, e.g. an owner's
        # flag wait) owns no tile, so the chunks a peer waits on cannot be stuck behind it.
        # A program's tiles therefore rise, and so do their chunks (their groups, where chunks
        # are grouped): a chunk's row and descriptors are read and made when the program moves
        # to another chunk, not per tile.
        # No more tiles than programs (the grid is then the tile count): each program has one
        # tile and needs no second claim to find the queue empty. Where, besides, no chunk
        # signals and no flag is reset (no peer waits on this launch), program p's tile is p:
        # no claim at all, no counter to zero.
        one_each = (num_units <= tl.num_programs(0)) & (num_units > 0)
        by_program = False
        if not (POINTER_STORES or RESET_WAITS):
            by_program = one_each
        if by_program:  # noqa: SIM108 - a runtime branch: Triton has no tensor ternary
            unit = tl.program_id(0)
        else:
            unit = tl.atomic_add(next_tile_ptr, 1, sem="relaxed")
        tile = _unit_tile(unit, dp_tiles, split, SPLIT_TAIL)
        # The program's first tile's chunk (the last chunk where none is left) and table row: a
        # later tile of the same chunk reads nothing more
        chunk, pid_m, pid_n = _tile_place(
            tile, num_tiles, num_chunks, tiles_per_chunk, chunk_group, num_pid_n, tile_chunk_ptr,
            GROUP_M,
        )  # fmt: skip
        a_off, c_off, rows, tile_start, wait_off, signal_off, has_wait, has_signal, copy_start, \
            copy_count, counted, a_blk0, c_blk0 = _chunk_row(table_ptr + chunk * TABLE_COLS,
                                                            A_ALIGN, C_ALIGN)  # fmt: skip
        if USE_TMA and HOST_DESCS:  # made on the host: no descriptor to write and fence here
            a_desc = a_host_desc
            c_desc = c_host_desc
        elif USE_TMA:  # 128 bytes each, written to global scratch and fenced by the compiler
            a_desc = tl.make_tensor_descriptor(
                a_ref + a_off, [rows, K], [stride_am, 1], [BLOCK_M, BLOCK_K]
            )
            c_desc = tl.make_tensor_descriptor(
                c_ref + c_off, [rows, N], [stride_cm, 1], [BLOCK_M, C_COLS]
            )
        # The chunks whose flag this program acquired (bit c, chunks below 64; later chunks
        # acquire theirs at every tile): their later tiles skip the wait. Grouped chunks
        # (chunk_group > 1) interleave, so one last-acquired chunk would not do.
        acquired = tl.zeros((), dtype=tl.int64)
        while unit < num_units:
            if SPLIT_TAIL:
                tile, is_split, part, k_lo, k_hi = _unit_coords(
                    unit, dp_tiles, split, k_per_split, k_tiles
                )
            else:
                is_split = False
                part = 0
                k_lo = 0
                k_hi = k_tiles
            if tiles_per_chunk == 0:
                pid_m, pid_n = _tile_coords(
                    tile - tile_start, tl.cdiv(rows, BLOCK_M), num_pid_n, GROUP_M
                )
            row = table_ptr + chunk * TABLE_COLS
            ready = 1
            chunk_bit = tl.where(
                chunk < 64, tl.full((), 1, tl.int64) << tl.minimum(chunk, 63).to(tl.int64), 0
            )
            if (has_wait != 0) & ((acquired & chunk_bit) == 0):
                ready = _wait_flag(flag_ref + wait_off, budget_ns, ON_GPU)
                if ready > 0:
                    acquired = acquired | chunk_bit
                    if USE_TMA and ON_GPU:
                        _proxy_fence()
            # The next unit is claimed now, once this one's chunk is ready: the atomic's round trip
            # runs under this tile's K loop, not between its epilogue and the next tile's loads
            # (a program never holds a second claim while it spins on a flag)
            if one_each:  # noqa: SIM108 - a runtime branch: Triton has no tensor ternary
                next_unit = unit + num_units  # past the end: this program's one unit
            else:
                next_unit = tl.atomic_add(next_tile_ptr, 1, sem="relaxed")
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            a_blk = pid_m  # the tile's row block in A's and C's descriptors
            c_blk = pid_m
            if HOST_DESCS:
                a_blk += a_blk0
                c_blk += c_blk0
            if ready > 0:
                if USE_TMA:
                    for ki in range(k_lo, k_hi):
                        a = a_desc.load([a_blk * BLOCK_M, ki * BLOCK_K])
                        if B_COL_MAJOR:
                            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
                        else:
                            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
                        acc = tl.dot(
                            a, b, acc, input_precision=INPUT_PRECISION,
                            max_num_imprecise_acc=IMPRECISE_ACC,
                        )  # fmt: skip
                else:
                    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
                    mask_m = offs_m < rows
                    mask_n = offs_n < N
                    # alignment hint (host-checked): lets the compiler vectorize the loads
                    a_base = a_ref + tl.multiple_of(a_off, A_ALIGN)
                    for ki in range(k_lo, k_hi):
                        offs_k = ki * BLOCK_K + offs_k0
                        a_ptrs = a_base + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
                        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
                        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
                        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K) & mask_n[None, :], other=0.0)
                        acc = tl.dot(
                            a, b, acc, input_precision=INPUT_PRECISION,
                            max_num_imprecise_acc=IMPRECISE_ACC,
                        )  # fmt: skip
            else:
                tl.store(status_ptr + chunk, 1)
            store = ready > 0
            if SPLIT_TAIL:  # noqa: SIM102 - a compile-time branch around a runtime one
                if is_split:
                    # Every K range stores its partial; the last to arrive sums them in a fixed
                    # order and goes on to the epilogue (persistent._matmul_tma_kernel's tail). A
                    # range whose chunk timed out stores nothing but still arrives, so the counter
                    # is left zero for the next launch.
                    local = tile - dp_tiles
                    offs_tile = (
                        tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                    )
                    slots = ws_ptr + (local * split).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs_tile
                    if ready > 0:
                        tl.store(slots + part * (BLOCK_M * BLOCK_N), acc)
                    tl.debug_barrier()
                    ticket = tl.atomic_add(lock_ptr + local, 1, sem="acq_rel", scope="gpu")
                    last = ticket == split - 1
                    store = last & (ready > 0)
                    if last:
                        tl.store(lock_ptr + local, 0)  # ready for the next launch
                    if store:
                        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                        for p in range(split):
                            acc += tl.load(slots + p * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
            if store:
                if SCALED:
                    a_scales = a_scale_ref + tl.load(row + 11)
                    acc = _scale_tile(
                        acc, a_scales, b_scale_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, rows, N,
                        BLOCK_M, BLOCK_N, A_ROWWISE, B_COLWISE,
                    )  # fmt: skip
                if USE_TMA and not POINTER_STORES:
                    _store_c_tile(
                        c_desc, acc, c_blk, pid_n, BLOCK_M, BLOCK_N, False, EPILOGUE_SUBTILE
                    )
                elif USE_TMA and ((counted == 0) & (copy_count == 0)):
                    _store_c_tile(
                        c_desc, acc, c_blk, pid_n, BLOCK_M, BLOCK_N, False, EPILOGUE_SUBTILE
                    )
                else:
                    # pointer stores for signalled chunks: generic-proxy writes (peer memory
                    # included) that the release below publishes; the tile is converted once and
                    # stored an eighth of its columns at a time, each eighth to every destination
                    # with offsets made once (the whole tile's 64-bit offsets, kept across the
                    # destinations' loop, took every register: 128x256 tiles spilled 528 bytes)
                    offs_cm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                    _store_column_eighths(
                        c_ref, c_off, acc.to(c_ref.dtype.element_ty), offs_cm, pid_n * BLOCK_N,
                        rows, N, stride_cm, stride_cn, copy_ptr, copy_start, copy_count, BLOCK_M,
                        BLOCK_N, C_ALIGN, OFFSETS_32,
                    )  # fmt: skip
                if counted != 0:
                    # every thread's stores are issued before the count; the chunk's last tile
                    # publishes them all with one system-scope release per destination flag
                    # (cumulative)
                    tl.debug_barrier()
                    done = tl.atomic_add(counter_ptr + chunk, 1, sem="acq_rel", scope="sys")
                    if done == tl.cdiv(rows, BLOCK_M) * num_pid_n - 1:
                        if has_signal != 0:
                            tl.atomic_xchg(flag_ref + signal_off, 1, sem="release", scope="sys")
                        for e in range(copy_count):
                            copy_row = copy_ptr + (copy_start + e) * 3
                            if tl.load(copy_row + 2) != 0:
                                copy_flag = flag_ref + tl.load(copy_row + 1)
                                tl.atomic_xchg(copy_flag, 1, sem="release", scope="sys")
            unit = next_unit
            tile = _unit_tile(unit, dp_tiles, split, SPLIT_TAIL)
            next_chunk, pid_m, pid_n = _tile_place(
                tile, num_tiles, num_chunks, tiles_per_chunk, chunk_group, num_pid_n,
                tile_chunk_ptr, GROUP_M,
            )  # fmt: skip
            if (next_chunk != chunk) & (unit < num_units):  # another chunk: its row, descriptors
                chunk = next_chunk
                a_off, c_off, rows, tile_start, wait_off, signal_off, has_wait, has_signal, \
                    copy_start, copy_count, counted, a_blk0, c_blk0 = _chunk_row(
                        table_ptr + chunk * TABLE_COLS, A_ALIGN, C_ALIGN)  # fmt: skip
                if USE_TMA and not HOST_DESCS:
                    if ON_GPU:
                        _bulk_store_wait()  # the last tile's store read the old C descriptor
                    a_desc = tl.make_tensor_descriptor(
                        a_ref + a_off, [rows, K], [stride_am, 1], [BLOCK_M, BLOCK_K]
                    )
                    c_desc = tl.make_tensor_descriptor(
                        c_ref + c_off, [rows, N], [stride_cm, 1], [BLOCK_M, C_COLS]
                    )

    # The last program to finish zeroes the claim counter and the chunk counters for the
    # next launch (every other program's claims and counts came before its own count here),
    # so a launch needs no memset before it; tiles by program touched no counter.
    if not by_program:
        finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
        if finished == tl.num_programs(0) - 1:
            for i in range(num_chunks):
                tl.store(counter_ptr + i, 0)
                if RESET_WAITS:
                    # every tile has read its flag (each program counted itself done after
                    # its last tile): consumed, ready for the next launch's arrivals
                    row = table_ptr + i * TABLE_COLS
                    if tl.load(row + 6) != 0:
                        tl.store(flag_ref + tl.load(row + 4), 0)
            tl.store(next_tile_ptr, 0)
            tl.store(done_ptr, 0)
