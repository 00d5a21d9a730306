"""The fused GEMM's launch options: ``reset_waits`` (the launch's last program zeroes its
chunks' wait flags, so the next launch waits for new arrivals with no memset; the default
leaves them set) and ``host_descriptors`` (A and C through two host-built descriptors where
``row_blocks`` finds every chunk on row-block boundaries of one buffer). Under the CPU
interpreter (the conftest sets TRITON_INTERPRET where there is no GPU)."""

import pytest
import torch


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
