"""The embedding-bag pooling kernel (``ficco.kernels.embedding``) against
``torch.nn.functional.embedding_bag`` in float64, under Triton's CPU interpreter where there
is no GPU: sum and mean, uneven and empty bags, several tables, both offset layouts, strided
and multi-destination outputs, per-chunk flags, refusals naming the field."""

import os

import torch

if not torch.cuda.is_available():
    # Triton reads this when kernels are decorated: before ficco.kernels is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from ficco.kernels.embedding import (  # noqa: E402
    BagTable,
    EmbeddingPool,
    PoolConfig,
    PoolSegmentViews,
    pool_bags,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: ||out - ref|| / ||ref|| limits per output dtype (fp32 accumulation; the output's rounding)
LIMITS = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _bags(rows: int, lengths: list[int], gen, index_dtype=torch.int64, last=False):
    """(indices, offsets) for bags of the given lengths over ``rows`` rows."""
    lens = torch.tensor(lengths, dtype=torch.int64)
    indices = torch.randint(0, rows, (int(lens.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    if not last:
        offsets = offsets[:-1]
    return indices.to(DEVICE, index_dtype), offsets.to(DEVICE, index_dtype)


def _table(rows, d, lengths, gen, dtype=torch.float32, index_dtype=torch.int64, last=False):
    weight = torch.randn(rows, d, generator=gen).to(DEVICE, dtype)
    return BagTable(weight, *_bags(rows, lengths, gen, index_dtype, last), include_last_offset=last)


def _reference(table: BagTable, mode: str) -> torch.Tensor:
    """float64 pooling of every bag of ``table`` ([B, D])."""
    offsets = table.offsets.cpu().long()
    end = int(offsets[-1]) if table.include_last_offset else table.indices.numel()
    # only the indices the bags cover (embedding_bag checks every index it is given)
    return torch.nn.functional.embedding_bag(
        table.indices.cpu().long()[int(offsets[0]) : end],
        table.weight.cpu().double(),
        offsets - offsets[0],
        mode=mode,
        include_last_offset=table.include_last_offset,
    )


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.cpu().double()
    assert torch.isfinite(got).all(), "an output row was not written (NaN poison left)"
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize(
    "dtype, index_dtype, mode, last",
    [
        (torch.float32, torch.int64, "sum", False),
        (torch.float32, torch.int32, "mean", True),
        (torch.float16, torch.int64, "mean", False),
        (torch.bfloat16, torch.int32, "sum", True),
    ],
)
def test_pooling_matches_embedding_bag_over_uneven_and_empty_bags(dtype, index_dtype, mode, last):
    gen = torch.Generator().manual_seed(hash((str(dtype), mode)) % 1000)
    # three tables of unlike sizes; empty bags first, last and in between; a bag longer
    # than the program's bags x unroll step
    lengths = [[0, 3, 1, 0, 7, 2, 0], [1, 1, 1, 1, 1, 1, 1], [5, 0, 2, 9, 0, 1, 0]]
    tables = [
        _table(rows, 24, lens, gen, dtype, index_dtype, last)
        for rows, lens in zip((40, 3, 17), lengths, strict=True)
    ]
    out = torch.full((7, 3, 24), float("nan"), dtype=dtype, device=DEVICE)
    pool_bags(tables, mode, out=out)
    ref = torch.stack([_reference(t, mode) for t in tables], dim=1)
    assert _rel(out, ref) < LIMITS[dtype]
    empty = torch.tensor(lengths).T == 0  # [B, T]
    assert (out.cpu()[empty] == 0).all(), "an empty bag must pool to zeros"


def test_fp32_output_from_bf16_weights_and_fbgemm_layout():
    """Table-batched layout (one indices tensor, offsets [T * B + 1] sliced per table) into
    an fp32 output: only the weights' own rounding remains."""
    gen = torch.Generator().manual_seed(3)
    t_count, b, d = 2, 5, 16
    lens = torch.tensor([2, 0, 4, 1, 3, 0, 0, 6, 1, 2])
    rows = (11, 30)
    indices = torch.cat(
        [
            torch.randint(0, rows[t], (int(lens[t * b : (t + 1) * b].sum()),), generator=gen)
            for t in range(2)
        ]
    ).to(DEVICE)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(DEVICE)
    weights = [torch.randn(r, d, generator=gen).to(DEVICE, torch.bfloat16) for r in rows]
    tables = [
        BagTable(weights[t], indices, offsets[t * b : (t + 1) * b + 1], include_last_offset=True)
        for t in range(t_count)
    ]
    out = pool_bags(tables, "sum", out_dtype=torch.float32)
    assert out.dtype == torch.float32 and tuple(out.shape) == (b, t_count, d)
    ref = torch.stack([_reference(t, "sum") for t in tables], dim=1)
    assert _rel(out, ref) < 1e-6


def test_segments_store_into_strided_views_and_nothing_else():
    gen = torch.Generator().manual_seed(4)
    table = _table(20, 8, [3, 0, 2, 5, 1, 4], gen)
    # rows 1.. of every other row of a poisoned buffer, 3 columns of padding per row
    buf = torch.full((16, 11), -7.0, device=DEVICE)
    views = [buf[0:6:2, 2:10], buf[7:13:2, 1:9]]
    segments = [PoolSegmentViews(0, 0, 3, views[0]), PoolSegmentViews(0, 3, 3, views[1])]
    EmbeddingPool([table], segments, mode="mean")()
    ref = _reference(table, "mean")
    assert _rel(torch.cat(views), ref) < 1e-6
    written = torch.zeros_like(buf, dtype=torch.bool)
    written[0:6:2, 2:10] = True
    written[7:13:2, 1:9] = True
    assert (buf.cpu()[~written.cpu()] == -7).all(), "a store landed outside the segments' views"


def test_multi_destination_chunks_set_their_flags_once_every_row_is_stored():
    """The fused all-to-all's stores: W receive buffers (one per destination rank), each
    getting its sample block of every table, one flag per (destination, table group); a
    flag shared by several chunks is set once all of them are stored, a chunk of zero bags
    still sets its flag, and the counters are back to zero for the next launch."""
    gen = torch.Generator().manual_seed(5)
    world, b, d = 3, 6, 8
    blocks = [3, 0, 3]  # uneven sample blocks: rank 1 receives nothing
    tables = [_table(r, d, torch.randint(0, 4, (b,), generator=gen).tolist(), gen) for r in (9, 25)]
    recv = [torch.full((len(tables), n, d), float("nan"), device=DEVICE) for n in blocks]
    flags = torch.zeros(world, 2, dtype=torch.int32, device=DEVICE)  # [dest, group]
    chunks, start = [], 0
    for dest, n in enumerate(blocks):
        for t in range(len(tables)):
            # group 0: table 0; group 1: every further table (a table group of one here)
            chunks.append(
                PoolSegmentViews(t, start, n, recv[dest][t], flags[dest, min(t, 1)].view(1))
            )
        start += n
    pool = EmbeddingPool(tables, chunks, mode="sum")
    for launch in range(2):
        for r in recv:
            r.fill_(float("nan"))
        flags.zero_()
        pool()
        assert flags.cpu().eq(1).all(), f"launch {launch}: flags {flags.tolist()}"
        assert int(pool.counts.abs().sum()) == 0, "the group counters must be zero again"
        ref = torch.stack([_reference(t, "sum") for t in tables])  # [T, B, D]
        start = 0
        for dest, n in enumerate(blocks):
            if n:
                assert _rel(recv[dest], ref[:, start : start + n]) < 1e-6, f"rank {dest}"
            start += n
    assert pool.signals == world * 2


def test_tile_shapes_compute_the_same_function():
    gen = torch.Generator().manual_seed(6)
    tables = [_table(50, 16, torch.randint(0, 9, (11,), generator=gen).tolist(), gen)]
    ref = _reference(tables[0], "mean").unsqueeze(1)
    for config in (PoolConfig(1, 1, 1), PoolConfig(8, 4, 2), PoolConfig(16, 8, 1)):
        assert _rel(pool_bags(tables, "mean", config=config), ref) < 1e-6, config


def test_bad_inputs_are_refused_naming_the_field_and_rule():
    gen = torch.Generator().manual_seed(7)
    good = _table(10, 8, [1, 2], gen)
    out = torch.empty(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"mode: must be one of"):
        EmbeddingPool([good], [PoolSegmentViews(0, 0, 2, out)], mode="max")
    with pytest.raises(ValueError, match=r"tables\[1\].weight: every table must share D"):
        pool_bags([good, _table(10, 4, [1, 2], gen)])
    with pytest.raises(ValueError, match=r"tables\[0\].indices: dtype must be int32 or int64"):
        pool_bags([BagTable(good.weight, good.indices.float(), good.offsets)])
    with pytest.raises(ValueError, match=r"tables\[0\].offsets: dtype must be int32 or int64"):
        pool_bags([BagTable(good.weight, good.indices, good.offsets.int())])
    with pytest.raises(ValueError, match=r"tables\[1\].offsets: every table needs B = 2 bags"):
        pool_bags([good, _table(10, 8, [1, 2, 3], gen)])
    with pytest.raises(ValueError, match=r"segments\[0\]: bags \[1, 3\) must lie in table 0's"):
        EmbeddingPool([good], [PoolSegmentViews(0, 1, 2, out)])
    with pytest.raises(ValueError, match=r"segments\[0\].out: must be \[count, D\] = \[2, 8\]"):
        EmbeddingPool([good], [PoolSegmentViews(0, 0, 2, out.T)])
    with pytest.raises(ValueError, match=r"segments\[0\].table: must be in \[0, 1\)"):
        EmbeddingPool([good], [PoolSegmentViews(1, 0, 2, out)])
    with pytest.raises(ValueError, match=r"segments\[0\].signal: must be a 1-element int32"):
        EmbeddingPool([good], [PoolSegmentViews(0, 0, 2, out, torch.zeros(2, dtype=torch.int32))])
    with pytest.raises(ValueError, match=r"block_bags: must be a power of two, got 3"):
        PoolConfig(block_bags=3)
    with pytest.raises(ValueError, match=r"tables: needs at least one table"):
        pool_bags([])


def test_triton_pooling_primitive_stores_what_torch_pooling_stores_on_every_emb_a2a_plan():
    """The executor's Triton pooling (``ficco.execute.cuda_pooling``) against the shared torch
    pooling (``FusedPrimitives.pool``) on emb_a2a plans of an uneven problem (W = 3, B = 7,
    skewed tables), on every rank, a local op and a +fused one: the same rows of every
    rank's buffers written (peers' receive buffers included, for +fused), to rounding, and the
    same flags set."""
    from ficco.execute.buffers import allocate, view
    from ficco.execute.cuda_pooling import TritonPooling
    from ficco.execute.fused import FusedPrimitives
    from ficco.kernels.persistent import LAUNCH_COUNTS
    from ficco.plan import PoolOp, build_plan
    from ficco.problem import Problem
    from ficco.space import enumerate_schedules

    class Prims(TritonPooling, FusedPrimitives):
        def __init__(self, plan, by_rank, flags, use_triton):
            self.plan, self.by_rank, self.flags = plan, by_rank, flags
            self.tensors, self.use_triton = by_rank[plan.rank], use_triton

        def _local(self, region):
            return view(self.tensors, region)

        def _remote(self, region, rank):
            return view(self.by_rank[rank], region)

        def _flag(self, rank, slot):
            return self.flags[rank][slot : slot + 1]

    problem = Problem(
        pattern="emb_a2a", m=7, n=16, k=2, world=3, tables=(40, 3, 17, 9), pooling="mean",
        bags="uniform", dtype="float32",
    )  # fmt: skip
    # per rank, the first op that stays local and the first that stores into peers (the
    # interpreter is slow)
    kinds: dict[tuple, tuple[PoolOp, object]] = {}
    for schedule in enumerate_schedules(problem):
        for rank in range(problem.world):
            for task in build_plan(problem, schedule, rank).tasks:
                op = task.op
                if isinstance(op, PoolOp):
                    peers = any(c.out_rank != rank for c in op.chunks)
                    kinds.setdefault((rank, peers), (op, schedule))
        if len(kinds) == 2 * problem.world:
            break
    ops = {(key[0], op): schedule for key, (op, schedule) in kinds.items()}
    assert any(c.out_rank != r for r, op in ops for c in op.chunks), "no +fused peer stores"
    plans = {r: build_plan(problem, next(iter(ops.values())), r) for r in range(problem.world)}
    for (rank, op), schedule in ops.items():
        got, launches = [], LAUNCH_COUNTS["embedding_pool"]
        for use_triton in (False, True):
            by_rank = {r: allocate(plans[r], seed=1, device=DEVICE) for r in plans}
            flags = {r: torch.zeros(64, dtype=torch.int32, device=DEVICE) for r in plans}
            Prims(build_plan(problem, schedule, rank), by_rank, flags, use_triton).pool(op)
            got.append((by_rank, flags))
        assert LAUNCH_COUNTS["embedding_pool"] == launches + 1, "the Triton path did not run"
        (torch_bufs, torch_flags), (tri_bufs, tri_flags) = got
        for r in plans:
            assert torch.equal(torch_flags[r], tri_flags[r]), (schedule, rank, r)
            for name, want in torch_bufs[r].items():
                have = tri_bufs[r][name]
                assert torch.equal(want.isnan(), have.isnan()), (schedule, rank, r, name)
                torch.testing.assert_close(have, want, equal_nan=True, rtol=1e-6, atol=1e-6)


def test_a_peer_buffer_is_mapped_with_the_peer_own_shape():
    """Uneven batches give ranks receive buffers of different sizes: a peer view (the fused
    stores' target, the ce pushes') takes the peer's shape; a buffer allocated otherwise than
    its pattern's shape (packed) keeps this rank's."""
    from ficco.execute.buffers import buffer_shapes, peer_shape
    from ficco.problem import Problem

    problem = Problem(pattern="emb_a2a", m=7, n=16, k=2, world=2, tables=(40, 3, 17))
    mine, theirs = buffer_shapes(problem, 1)["y"], buffer_shapes(problem, 0)["y"]
    assert mine == (3 * 3, 16) and theirs == (3 * 4, 16)  # samples 4 + 3, every table
    assert peer_shape(problem, 1, 0, "y", mine) == theirs
    assert peer_shape(problem, 1, 0, "y", (9 * 16 * 2,)) == (9 * 16 * 2,)


def test_symmetric_buffers_take_one_size_on_every_rank():
    """Symmetric memory's rendezvous refuses allocations of different sizes (seen on two
    H100s: ``reqs[r].buffer_size == reqs[0].buffer_size``), so a peer-visible buffer whose
    shape differs by rank is allocated at the largest, on every rank; others keep their own."""
    from ficco.execute.buffers import buffer_shapes, symmetric_numel
    from ficco.problem import Problem

    problem = Problem(pattern="emb_a2a", m=7, n=16, k=2, world=2, tables=(40, 3, 17))
    sizes = {symmetric_numel(problem, "y", buffer_shapes(problem, r)["y"]) for r in (0, 1)}
    assert sizes == {3 * 4 * 16}  # rank 0's 4 samples x 3 tables, on both ranks
    assert symmetric_numel(problem, "y", (5, 16)) == 5 * 16  # not the pattern's shape
    even = Problem(pattern="ag_gemm", m=64, n=32, k=16, world=2)
    for name, shape in buffer_shapes(even, 0).items():
        assert symmetric_numel(even, name, shape) == torch.Size(shape).numel()


def test_torch_pooling_is_embedding_bag():
    """Schedules that do not pool with the Triton kernel (serial's baseline among them) pool
    with torch's EmbeddingBag: every segment the serial plan's pooling writes equals
    ``F.embedding_bag`` over its bags, bit for bit, in bf16."""
    import torch.nn.functional as F

    from ficco.execute.buffers import allocate, view
    from ficco.execute.fused import FusedPrimitives
    from ficco.plan import PoolOp, build_plan
    from ficco.problem import Problem
    from ficco.space import Schedule

    problem = Problem(
        pattern="emb_a2a", m=9, n=16, k=3, world=2, tables=(40, 3, 17), pooling="mean",
        bags="uniform", dtype="bf16",
    )  # fmt: skip
    plan = build_plan(problem, Schedule(), 0)
    tensors = allocate(plan, seed=3)

    class Prims(FusedPrimitives):
        def __init__(self):
            self.plan, self.tensors = plan, tensors

        def _local(self, region):
            return view(self.tensors, region)

    ops = [t.op for t in plan.tasks if isinstance(t.op, PoolOp)]
    assert ops
    for op in ops:
        Prims().pool(op)
        for chunk in op.chunks:
            for seg in chunk.segments:
                j0, j1 = seg.bags
                first = int(tensors["offsets"][j0])
                want = F.embedding_bag(
                    tensors["indices"][first : int(tensors["offsets"][j1])],
                    tensors["weights"],
                    tensors["offsets"][j0:j1] - first,
                    mode="mean",
                )
                assert torch.equal(view(tensors, seg.out), want), seg
