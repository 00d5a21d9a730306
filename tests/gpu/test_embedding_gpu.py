"""The embedding-bag pooling kernel on a GPU at sizes the interpreter cannot reach: the tuned
default tile against ``embedding_bag`` in float64, the fused multi-destination stores into
separately allocated receive buffers with a consumer waiting on their flags on another stream,
and CUDA-graph replays."""

import pytest
import torch

pytestmark = pytest.mark.gpus(1, why="Triton pooling kernel on CUDA")

LIMITS = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


def _tables(count: int, rows: int, batch: int, max_len: int, dtype, seed: int):
    from ficco.kernels.embedding import BagTable

    gen = torch.Generator(device="cuda").manual_seed(seed)
    tables = []
    for t in range(count):
        weight = torch.randn(rows + 1000 * t, 128, device="cuda", generator=gen).to(dtype)
        lens = torch.randint(0, max_len + 1, (batch,), device="cuda", generator=gen)
        offsets = torch.zeros(batch + 1, dtype=torch.int64, device="cuda")
        offsets[1:] = lens.cumsum(0)
        idx = torch.randint(0, weight.shape[0], (int(offsets[-1]),), device="cuda", generator=gen)
        tables.append(BagTable(weight, idx, offsets, include_last_offset=True))
    return tables


def _reference(tables, mode: str) -> torch.Tensor:
    """float64 ``[B, T, D]``."""
    return torch.stack(
        [
            torch.nn.functional.embedding_bag(
                t.indices, t.weight.double(), t.offsets, mode=mode, include_last_offset=True
            )
            for t in tables
        ],
        dim=1,
    )


def _rel(got, ref) -> float:
    assert torch.isfinite(got).all(), "a row was never written (NaN poison left)"
    return float((got.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_default_tile_matches_embedding_bag(dtype, mode):
    from ficco.kernels.embedding import pool_bags

    tables = _tables(4, 100_000, 3000, 40, dtype, seed=1)
    out = torch.full((3000, 4, 128), float("nan"), dtype=dtype, device="cuda")
    pool_bags(tables, mode, out=out)
    torch.cuda.synchronize()
    assert _rel(out, _reference(tables, mode)) < LIMITS[dtype]


def test_multi_destination_stores_release_flags_a_consumer_waits_on():
    """W = 4 receive buffers (separate allocations, as peers' are); a one-program flag wait
    on another stream, queued before the pool, gates a copy of every buffer: the copies see
    every row once the flags are set. Then the same launch is replayed from a CUDA graph."""
    from ficco.kernels.embedding import EmbeddingPool, PoolSegmentViews
    from ficco.kernels.flags import FlagWait

    world, batch = 4, 2048
    tables = _tables(3, 50_000, batch, 30, torch.bfloat16, seed=2)
    ref = _reference(tables, "sum")
    block = batch // world
    recv = [torch.empty(block, 3, 128, dtype=torch.bfloat16, device="cuda") for _ in range(world)]
    flags = torch.zeros(world, dtype=torch.int32, device="cuda")
    chunks = [
        PoolSegmentViews(t, r * block, block, recv[r][:, t], flags[r : r + 1])
        for r in range(world)
        for t in range(3)
    ]
    pool = EmbeddingPool(tables, chunks, mode="sum")
    pool.compile()
    wait = FlagWait(
        [flags[r : r + 1] for r in range(world)], [f"rank {r}" for r in range(world)], timeout_s=20
    )
    wait.compile()
    consumer = torch.cuda.Stream()
    for r in recv:
        r.fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(consumer):
        wait()  # spins until the pool's last program of each destination sets its flag
        seen = [r.clone() for r in recv]
    pool()
    torch.cuda.synchronize()
    wait.raise_on_timeout("consumer")
    for r in range(world):
        assert _rel(seen[r], ref[r * block : (r + 1) * block]) < LIMITS[torch.bfloat16], r
    assert flags.eq(1).all()
    assert int(pool.counts.abs().sum()) == 0

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pool()
    for _ in range(2):
        flags.zero_()
        for r in recv:
            r.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert flags.eq(1).all()
        for r in range(world):
            assert _rel(recv[r], ref[r * block : (r + 1) * block]) < LIMITS[torch.bfloat16], r


def test_torch_pooling_of_a_plan_reads_bag_bounds_from_the_host_and_captures():
    """emb_a2a's ``cublas`` pooling (torch's EmbeddingBag per segment: the serial baseline's
    ``gemm_alone``) takes the bags' bounds from host offsets: no GPU sync per segment, so a
    CUDA graph captures it and the replay pools the same rows (read from the device offsets,
    each segment waited for the GPU twice, and no capture could hold it: the baseline was
    eager-only and sync-bound)."""
    from ficco.patterns.emb_a2a import embedding_bag, lookups
    from ficco.problem import Problem

    p = Problem(pattern="emb_a2a", m=64, n=128, k=4, world=2, dtype="bf16", tables=(900, 50, 70))
    bags = lookups(p, 0)
    weights = torch.randn(900, 128, device="cuda").to(torch.bfloat16)
    indices, offsets = bags["indices"].cuda(), bags["offsets"].cuda()
    spans = [(0, 32), (32, 64)]
    out = torch.empty(64, 128, device="cuda", dtype=torch.bfloat16)

    def pool_all(host):
        for j0, j1 in spans:
            out[j0:j1].copy_(embedding_bag(weights, indices, offsets, (j0, j1), "sum", host))

    pool_all(bags["offsets"])
    torch.cuda.synchronize()
    eager = out.clone()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pool_all(bags["offsets"])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
