"""The fused GEMM's launch options: ``reset_waits`` (the launch's last program zeroes its
chunks' wait flags, so the next launch waits for new arrivals with no memset; the default
leaves them set) and ``host_descriptors`` (A and C through two host-built descriptors where
``row_blocks`` finds every chunk on row-block boundaries of one buffer). Under the CPU
interpreter (the conftest sets TRITON_INTERPRET where there is no GPU)."""

import pytest
import torch
import triton
import triton.language as tl

from ficco.kernels.fused_kernel import _tile_place


@pytest.mark.parametrize("reset_waits", [False, True])
def test_reset_waits_zeroes_consumed_flags_only_when_asked(reset_waits):
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(40, 16, generator=gen), torch.randn(16, 24, generator=gen)
    out = torch.full((40, 24), float("nan"))
    flags = torch.zeros(3, dtype=torch.int32)
    chunks = [
        FusedChunkViews(a[:16], out[:16], signal=flags[0:1]),
        FusedChunkViews(a[16:], out[16:], wait=flags[1:2], name="peer"),
    ]
    kernel = FusedGemm(chunks, b, sm_budget=3, timeout_s=5.0, reset_waits=reset_waits)
    for _ in range(2):  # the second launch: its arrival set again, as a writer would
        flags[1] = 1
        out.fill_(float("nan"))
        kernel()
        assert (out - a @ b).abs().max().item() < 1e-4
        kernel.raise_on_timeout("launch")
        # the waited flag: consumed only with reset_waits; a signalled one is left set
        assert flags[1].item() == (0 if reset_waits else 1)
        assert flags[0].item() == 1 and kernel.work.eq(0).all()
        flags[0] = 0


def test_row_blocks_spans_chunks_on_row_block_boundaries():
    from ficco.kernels.fused_views import row_blocks

    buf = torch.zeros(72, 24)
    span, blocks = row_blocks([buf[32:64], buf[0:32], buf[64:72]], 16)
    assert span.shape == (72, 24) and span.data_ptr() == buf.data_ptr()
    assert blocks == [2, 0, 4]  # the last chunk is ragged but ends the span: clipped there
    assert row_blocks([buf[0:24], buf[24:48]], 16) is None  # 24 rows: one tile spans both
    assert row_blocks([buf[0:40], buf[48:72]], 16) is None  # a chunk ends mid row block
    assert row_blocks([buf[0:16, :8], buf[16:32, 8:16]], 16) is None  # another first column
    assert row_blocks([buf[0:16], torch.zeros(16, 24)], 16) is None  # another buffer


@pytest.mark.parametrize("signalled", [False, True])
def test_host_descriptors_compute_every_chunk(signalled):
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(6)
    a, b = torch.randn(72, 32, generator=gen), torch.randn(32, 40, generator=gen)
    out = torch.full((72, 40), float("nan"))
    flags = torch.zeros(4, dtype=torch.int32)
    flags[1:3] = 1  # arrived
    chunks = [
        FusedChunkViews(a[:32], out[:32], signal=flags[0:1] if signalled else None),
        FusedChunkViews(a[32:64], out[32:64], wait=flags[1:2]),
        FusedChunkViews(a[64:], out[64:], wait=flags[2:3]),  # ragged: ends the buffer
    ]
    cfg = GemmConfig(16, 16, 16, 4, 1, 4)
    kernel = FusedGemm(chunks, b, sm_budget=3, timeout_s=5.0, config=cfg, host_descriptors=True)
    assert kernel.path == "tma" and kernel.host is not None
    # (A, C) first row blocks; a signalled chunk stores through pointers: C's span then
    # starts at the second chunk
    c_blocks = [0, 0, 2] if signalled else [0, 2, 4]
    expected = [[0, c_blocks[0]], [2, c_blocks[1]], [4, c_blocks[2]]]
    assert [row[12:] for row in kernel.table.tolist()] == expected
    kernel()
    kernel.raise_on_timeout("launch")
    assert (out - a @ b).abs().max().item() < 1e-4
    assert flags[0].item() == int(signalled)
    # chunks that share no row blocks: per-chunk descriptors, the same result
    odd = [FusedChunkViews(a[:24], out[:24]), FusedChunkViews(a[24:], out[24:])]
    out.fill_(float("nan"))
    fallback = FusedGemm(odd, b, sm_budget=3, timeout_s=5.0, config=cfg, host_descriptors=True)
    assert fallback.host is None
    fallback()
    assert (out - a @ b).abs().max().item() < 1e-4


@pytest.mark.parametrize("programs", [4, 2])  # 4 tiles: one each; two each
def test_back_to_back_launches_with_one_tile_each(programs):
    """No more tiles than programs and nothing signalled: no program claims twice or counts
    itself done; the last ticket's holder alone resets the claim counter for the next launch."""
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(24, 16, generator=gen), torch.randn(16, 32, generator=gen)
    out = torch.full((24, 32), float("nan"))
    flags = torch.ones(1, dtype=torch.int32)
    chunks = [FusedChunkViews(a[:16], out[:16]), FusedChunkViews(a[16:], out[16:], wait=flags)]
    cfg = GemmConfig(16, 16, 16, 4, 1, 4)  # 2 + 2 tiles
    kernel = FusedGemm(chunks, b, sm_budget=programs, timeout_s=5.0, config=cfg)
    for _ in range(2):
        out.fill_(float("nan"))
        kernel()
        kernel.raise_on_timeout("launch")
        assert (out - a @ b).abs().max().item() < 1e-4
        assert kernel.work.eq(0).all()


@pytest.mark.parametrize("rows", [(16, 16, 16), (16, 24, 8), (16, 80, 8)])
def test_chunks_of_equal_tile_counts_are_found_by_arithmetic(rows):
    # equal chunks: the kernel computes a tile's chunk (tiles_per_chunk); unequal ones read
    # the tile -> chunk map. Either way every chunk's rows come out right, waits included.
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(sum(rows), 16, generator=gen), torch.randn(16, 40, generator=gen)
    out = torch.full((sum(rows), 40), float("nan"))
    flags = torch.ones(len(rows), dtype=torch.int32)
    starts = [sum(rows[:i]) for i in range(len(rows))]
    chunks = [
        FusedChunkViews(a[s : s + r], out[s : s + r], wait=flags[i : i + 1])
        for i, (s, r) in enumerate(zip(starts, rows, strict=True))
    ]
    kernel = FusedGemm(chunks, b, sm_budget=2, timeout_s=5.0)
    cfg = kernel.config
    tiles = {-(-r // cfg.block_m) * -(-40 // cfg.block_n) for r in rows}
    assert kernel.tiles_per_chunk == (tiles.pop() if len(tiles) == 1 else 0)
    kernel()
    kernel.raise_on_timeout("launch")
    assert (out - a @ b).abs().max().item() < 1e-4


@triton.jit
def _place_every_tile(out_ptr, num_tiles, num_chunks, tpc, cg, npn, map_ptr, GROUP_M: tl.constexpr):
    # one program per tile: where the fused kernel places it
    tile = tl.program_id(0)
    chunk, pid_m, pid_n = _tile_place(tile, num_tiles, num_chunks, tpc, cg, npn, map_ptr, GROUP_M)
    tl.store(out_ptr + tile * 3, chunk)
    tl.store(out_ptr + tile * 3 + 1, pid_m)
    tl.store(out_ptr + tile * 3 + 2, pid_n)


def _placements(tiles_per_chunk, chunks, chunk_group, num_pid_n, group_m):
    """(chunk, pid_m, pid_n) of every tile, as the fused kernel places them."""
    tiles = tiles_per_chunk * chunks
    out = torch.full((tiles, 3), -7, dtype=torch.int32)
    unused_map = torch.zeros(1, dtype=torch.int32)
    _place_every_tile[(tiles,)](
        out, tiles, chunks, tiles_per_chunk, chunk_group, num_pid_n, unused_map, group_m
    )
    return [tuple(r) for r in out.tolist()]


@pytest.mark.parametrize("chunks, chunk_group", [(3, 1), (3, 2), (3, 3), (4, 2)])
def test_grouped_chunks_place_every_tile_once_in_grouped_order(chunks, chunk_group):
    # 2 row blocks a chunk, 5 column blocks, GROUP_M 2
    blocks, num_pid_n, group_m = 2, 5, 2
    placed = _placements(blocks * num_pid_n, chunks, chunk_group, num_pid_n, group_m)
    expected = {(c, m, n) for c in range(chunks) for m in range(blocks) for n in range(num_pid_n)}
    assert sorted(placed) == sorted(expected)  # a bijection onto the chunks' tiles
    # a group's tiles come before the next group's: chunks' groups never go backwards
    groups = [c // chunk_group for c, _, _ in placed]
    assert groups == sorted(groups)
    # within a group: the grouped order of `ficco.kernels.persistent` over its row blocks

    def grouped_order(num_pid_m):  # tiles._tile_coords, in Python
        order = []
        for t in range(num_pid_m * num_pid_n):
            in_group = group_m * num_pid_n
            first = (t // in_group) * group_m
            size = min(num_pid_m - first, group_m)
            order.append((first + t % size, (t % in_group) // size))
        return order

    start = 0
    for g in range(-(-chunks // chunk_group)):
        members = min(chunk_group, chunks - g * chunk_group)
        want = [
            (g * chunk_group + rb // blocks, rb % blocks, n)
            for rb, n in grouped_order(members * blocks)
        ]
        assert placed[start : start + len(want)] == want
        start += len(want)
    if chunk_group == 1:  # chunk by chunk: the order before grouping existed
        assert [c for c, _, _ in placed] == sorted(c for c, _, _ in placed)


@pytest.mark.parametrize(
    "chunks, chunk_group, group_m", [(3, 1, 2), (3, 2, 2), (4, 4, 8), (5, 2, 1)]
)
def test_the_arrival_model_claims_tiles_in_the_kernels_order(chunks, chunk_group, group_m):
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused_arrival import tile_chunks

    # 3 row blocks a chunk of 40 rows in 16-row tiles, 5 column blocks of 16 of 80 columns
    cfg = GemmConfig(
        16, 16, 16, group_m=group_m, num_stages=2, num_warps=4, chunk_group=chunk_group
    )
    placed = _placements(3 * 5, chunks, chunk_group, 5, group_m)
    assert tile_chunks(cfg, 40, 80, chunks) == [c for c, _, _ in placed]


@pytest.mark.parametrize("chunk_group", [1, 2, 3])
def test_grouped_chunks_compute_every_chunk_and_wait_on_each(chunk_group):
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(96, 16, generator=gen), torch.randn(16, 48, generator=gen)
    out = torch.full((96, 48), float("nan"))
    flags = torch.ones(3, dtype=torch.int32)
    flags[2] = 0  # never arrives: its tiles give up, the others' are computed
    chunks = [
        FusedChunkViews(a[32 * i : 32 * (i + 1)], out[32 * i : 32 * (i + 1)], wait=flags[i : i + 1])
        for i in range(3)
    ]
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, chunk_group=chunk_group)
    kernel = FusedGemm(chunks, b, sm_budget=2, timeout_s=0.5, config=cfg)
    assert kernel.tiles_per_chunk == 6 and kernel.chunk_group == chunk_group
    kernel()
    with pytest.raises(Exception, match="chunk 2"):
        kernel.raise_on_timeout("launch")
    assert (out[:64] - a[:64] @ b).abs().max().item() < 1e-4
    assert torch.isnan(out[64:]).all()  # the timed-out chunk's tiles skipped their work
    assert kernel.work.eq(0).all()


def test_chunk_groups_apply_only_to_equal_chunks_that_only_wait():
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(12)
    a, b = torch.randn(48, 16, generator=gen), torch.randn(16, 32, generator=gen)
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, chunk_group=4)
    flags = torch.zeros(2, dtype=torch.int32)
    cases = {
        # (chunks, expected group): more than the chunks -> all of them
        "equal, waiting": ([(0, 24), (24, 48)], {}, 2),
        "ragged": ([(0, 32), (32, 48)], {}, 1),
        "signalling": ([(0, 24), (24, 48)], {"signal": flags[0:1]}, 1),
    }
    for name, (spans, extra, group) in cases.items():
        out = torch.full((48, 32), float("nan"))
        chunks = [
            FusedChunkViews(a[s:e], out[s:e], **extra)
            if i == 0
            else FusedChunkViews(a[s:e], out[s:e])
            for i, (s, e) in enumerate(spans)
        ]
        kernel = FusedGemm(chunks, b, sm_budget=2, timeout_s=5.0, config=cfg)
        assert kernel.chunk_group == group, name
        kernel()
        assert (out - a @ b).abs().max().item() < 1e-4, name
        flags.zero_()


def test_grouped_candidates_only_for_few_row_chunks():
    from ficco.kernels.configs import CHUNK_GROUP_MAX_ROWS, GemmConfig, fused_candidate_configs

    few = fused_candidate_configs(128, 8192, 4096, 2, 2, chunks=2)
    plain = [c for c in few if c.chunk_group == 1]
    assert plain and [c.chunk_group for c in few if c.chunk_group > 1] == [2] * len(plain)
    assert {c.name + "_cg2" for c in plain} == {c.name for c in few if c.chunk_group == 2}
    many = fused_candidate_configs(2 * CHUNK_GROUP_MAX_ROWS, 8192, 4096, 2, 2, chunks=2)
    assert all(c.chunk_group == 1 for c in many)
    assert all(c.chunk_group == 1 for c in fused_candidate_configs(128, 8192, 4096, 2, 2))
    with pytest.raises(ValueError, match="chunk_group"):
        GemmConfig(128, 128, 64, chunk_group=0)
    with pytest.raises(ValueError, match="chunk_group > 1"):
        GemmConfig(128, 128, 64, swap_ab=True, chunk_group=2)
    cfg = GemmConfig(128, 128, 64, chunk_group=4)
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg
    legacy = {k: v for k, v in cfg.to_dict().items() if k != "chunk_group"}
    assert GemmConfig.from_dict(legacy).chunk_group == 1  # caches written before the field


def test_a_grouped_tile_is_kept_only_where_it_wins_by_the_margin():
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused_tuning import GROUPED_MARGIN, fused_pick
    from ficco.kernels.trials import Trials

    plain, other = GemmConfig(128, 128, 64), GemmConfig(64, 128, 64)
    grouped = GemmConfig(128, 128, 64, chunk_group=2)
    configs = {c.name: c for c in (plain, other, grouped)}

    def pick(ms_plain, ms_other, ms_grouped):
        times = {plain.name: ms_plain, other.name: ms_other, grouped.name: ms_grouped}
        return fused_pick(Trials(times, {}, configs))

    assert pick(1.0, 1.2, 0.9) == grouped.name  # 10% faster than every chunk-by-chunk tile
    assert pick(1.0, 0.99, 0.98) == other.name  # within the margin: the fastest chunkwise
    assert pick(1.0, 1.2, 1.0 / GROUPED_MARGIN * 1.001) == plain.name
    assert pick(0.8, 1.2, 0.9) == plain.name  # the fastest is chunk by chunk anyway
    only = Trials({grouped.name: 1.0}, {}, {grouped.name: grouped})
    assert fused_pick(only) == grouped.name  # nothing else ran correctly


@pytest.mark.parametrize("chunk_group", [1, 2])
def test_split_tail_launch_sums_k_ranges_and_leaves_counters_zero(chunk_group):
    """Fewer tiles than half the programs: every tile's K split over the idle programs, the
    last range to arrive summing the partials; a signalled chunk still signals once, and
    back-to-back launches find every counter zero."""
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(13)
    a, b = torch.randn(64, 128, generator=gen), torch.randn(128, 32, generator=gen)
    out = torch.full((64, 32), float("nan"))
    flags = torch.zeros(3, dtype=torch.int32)
    flags[1:] = 1  # arrived
    chunks = [
        FusedChunkViews(a[:32], out[:32], wait=flags[1:2]),
        FusedChunkViews(a[32:], out[32:], wait=flags[2:3]),
    ]
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, split_tail=True, chunk_group=chunk_group)
    kernel = FusedGemm(chunks, b, sm_budget=16, timeout_s=5.0, config=cfg)
    # 8 tiles on 16 programs, 8 K steps: two K ranges of 4 steps a tile
    assert kernel.plan is not None and (kernel.plan.split, kernel.plan.tail_tiles) == (2, 8)
    assert kernel.units == 16 and kernel.grid == (16,)
    for _ in range(2):
        out.fill_(float("nan"))
        kernel()
        kernel.raise_on_timeout("launch")
        assert (out - a @ b).abs().max().item() < 1e-4
        assert kernel.work.eq(0).all() and kernel.arrivals.eq(0).all()
    # signalled: the summing range's tile is counted, once
    signalled = [
        FusedChunkViews(a[:32], out[:32], signal=flags[0:1]),
        FusedChunkViews(a[32:], out[32:], wait=flags[2:3]),
    ]
    out.fill_(float("nan"))
    kernel = FusedGemm(signalled, b, sm_budget=16, timeout_s=5.0, config=cfg)
    assert kernel.plan is not None
    kernel()
    assert (out - a @ b).abs().max().item() < 1e-4
    assert flags[0].item() == 1 and kernel.work.eq(0).all() and kernel.arrivals.eq(0).all()


def test_split_tail_ranges_of_a_timed_out_chunk_still_arrive():
    from ficco.kernels.configs import GemmConfig
    from ficco.kernels.flags import FlagTimeout
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(14)
    a, b = torch.randn(64, 128, generator=gen), torch.randn(128, 32, generator=gen)
    out = torch.full((64, 32), float("nan"))
    flags = torch.zeros(1, dtype=torch.int32)  # the second chunk never arrives
    chunks = [FusedChunkViews(a[:32], out[:32]), FusedChunkViews(a[32:], out[32:], wait=flags)]
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, split_tail=True)
    kernel = FusedGemm(chunks, b, sm_budget=16, timeout_s=0.3, config=cfg)
    kernel()
    with pytest.raises(FlagTimeout, match="chunk 1"):
        kernel.raise_on_timeout("launch")
    assert (out[:32] - a[:32] @ b).abs().max().item() < 1e-4 and out[32:].isnan().all()
    assert kernel.arrivals.eq(0).all()  # every range arrived: the next launch starts clean


def test_split_candidates_where_the_launch_leaves_a_short_wave():
    from dataclasses import replace

    from ficco.kernels.configs import fused_candidate_configs, split_plan

    for rows, n, k in ((64, 3072, 4096), (4224, 512, 4096), (4096, 8192, 4096)):
        offered = fused_candidate_configs(rows, n, k, 2, 2, chunks=2, sm_budget=132)
        whole = [c for c in offered if not c.split_tail]
        for cfg in whole:  # a split twin exactly where the plan splits the launch's tiles
            tiles = 2 * -(-rows // cfg.block_m) * -(-n // cfg.block_n)
            splits = split_plan(tiles, 132, -(-k // cfg.block_k)) is not None
            assert (replace(cfg, split_tail=True) in offered) == splits, (rows, cfg.name)
        assert len(offered) == len(whole) + sum(c.split_tail for c in offered)
    few = fused_candidate_configs(64, 3072, 4096, 2, 2, chunks=2, sm_budget=132)
    assert any(c.split_tail and c.chunk_group == 2 for c in few)  # grouped and split
    assert not any(c.split_tail for c in fused_candidate_configs(64, 3072, 4096, 2, 2))


@pytest.mark.parametrize("offsets_32", [True, False])
def test_pointer_stores_reach_every_destination_with_either_offset_width(offsets_32):
    from ficco.kernels.fused import FusedChunkViews, FusedGemm, offsets_fit_int32
    from ficco.kernels.fused_views import FusedCopyViews

    assert offsets_fit_int32(40, 24, (24, 1), 32)
    assert not offsets_fit_int32(1 << 16, 1 << 15, (1 << 15, 1), 128)  # 2**31 elements
    gen = torch.Generator().manual_seed(9)
    a, b = torch.randn(40, 16, generator=gen), torch.randn(16, 44, generator=gen)
    out = torch.full((40, 44), float("nan"))
    copy = torch.full((40, 44), float("nan"))  # a further destination (a peer's, on GPUs)
    flags = torch.zeros(2, dtype=torch.int32)
    chunks = [
        FusedChunkViews(
            a[:24], out[:24], signal=flags[0:1], copies=(FusedCopyViews(copy[:24], flags[1:2]),)
        ),
        FusedChunkViews(a[24:], out[24:]),
    ]
    kernel = FusedGemm(chunks, b, sm_budget=3, timeout_s=5.0)
    assert kernel.offsets_32  # small outputs: int32 offsets
    kernel.offsets_32 = offsets_32  # the other width as a launch whose outputs span 2**31
    kernel()
    kernel.raise_on_timeout("launch")
    want = a @ b
    assert (out - want).abs().max().item() < 1e-4
    assert (copy[:24] - want[:24]).abs().max().item() < 1e-4 and copy[24:].isnan().all()
    assert flags.tolist() == [1, 1]


def test_arriving_must_be_a_bool_or_none():
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    a, b, out = torch.randn(16, 16), torch.randn(16, 8), torch.zeros(16, 8)
    with pytest.raises(ValueError, match="arriving must be True, False or None, got 'yes'"):
        FusedGemm([FusedChunkViews(a, out)], b, sm_budget=2, timeout_s=5.0, arriving="yes")
    FusedGemm([FusedChunkViews(a, out)], b, sm_budget=2, timeout_s=5.0, arriving=True)
