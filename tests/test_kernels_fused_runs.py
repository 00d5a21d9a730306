"""The fused GEMM's ready runs (``FusedGemm(ready_runs=)``, the kernel's ``READY_RUNS``):
tiles dealt out by program and run in flattened loops over the chunk groups that have
arrived. Under the CPU interpreter (the conftest sets TRITON_INTERPRET where there is no
GPU), which runs the programs one after another: a program's waits and runs, the groups a
run takes, a chunk that never arrives, and where runs are refused."""

import threading
import time

import pytest
import torch

from ficco.kernels.configs import GemmConfig
from ficco.kernels.fused import FusedChunkViews, FusedGemm
from ficco.kernels.persistent import LAUNCH_COUNTS

# 4 chunks of 32 rows, 48 columns: 16-row tiles, 2 row blocks x 3 column blocks a chunk
ROWS, N, K = 32, 48, 16


def _operands(chunks: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(chunks * ROWS, K, generator=gen)
    b = torch.randn(K, N, generator=gen)
    out = torch.full((chunks * ROWS, N), float("nan"))
    return a, b, out


def _views(a, out, flags, waits):
    """Chunk i waits on flags[i] where waits[i]; chunk 0 is the local one."""
    return [
        FusedChunkViews(
            a[ROWS * i : ROWS * (i + 1)],
            out[ROWS * i : ROWS * (i + 1)],
            wait=flags[i : i + 1] if waits[i] else None,
            name=f"chunk {i}",
        )
        for i in range(len(waits))
    ]


def _runs(views, b, cfg, **kw):
    kernel = FusedGemm(views, b, host_descriptors=True, config=cfg, ready_runs=True, **kw)
    assert kernel.ready_runs_refusal() == ""
    return kernel


@pytest.mark.parametrize(
    "programs, chunk_group",  # tiles a program: 24, 8, 3-4, 3-4 and 1 or 0
    [(1, 1), (3, 2), (7, 1), (7, 4), (64, 2)],
)
def test_runs_compute_every_chunk_as_the_claimed_tiles_do(programs, chunk_group):
    a, b, out = _operands(4, seed=21)
    flags = torch.ones(4, dtype=torch.int32)
    views = _views(a, out, flags, [False, True, True, True])
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, chunk_group=chunk_group)
    before = LAUNCH_COUNTS["fused_ready_runs"]
    kernel = _runs(views, b, cfg, sm_budget=programs, timeout_s=5.0)
    assert kernel.chunk_group == chunk_group and kernel.tiles_per_chunk == 6
    kernel()
    kernel.raise_on_timeout("launch")
    assert LAUNCH_COUNTS["fused_ready_runs"] == before + 1
    assert (out - a @ b).abs().max().item() < 1e-4
    assert kernel.work.eq(0).all() and flags.eq(1).all()  # no counter touched, flags kept
    claimed = torch.full_like(out, float("nan"))
    FusedGemm(
        _views(a, claimed, flags, [False, True, True, True]), b, sm_budget=programs,
        timeout_s=5.0, config=cfg, host_descriptors=True, ready_runs=False,
    )()  # fmt: skip
    assert LAUNCH_COUNTS["fused_ready_runs"] == before + 1  # that one claimed its tiles
    assert torch.equal(out, claimed)


def test_a_run_stops_at_the_first_group_not_yet_arrived_and_waits_for_it():
    a, b, out = _operands(4, seed=22)
    flags = torch.tensor([0, 1, 0, 1], dtype=torch.int32)  # chunk 2 lands later
    views = _views(a, out, flags, [False, True, True, True])
    kernel = _runs(views, b, GemmConfig(16, 16, 16, 2, 1, 4), sm_budget=3, timeout_s=20.0)

    def land():
        time.sleep(0.3)
        flags[2] = 1

    thread = threading.Thread(target=land)
    start = time.monotonic()
    thread.start()
    kernel()
    thread.join()
    assert time.monotonic() - start >= 0.3  # the run over chunks 0-1 ended, chunk 2 waited
    kernel.raise_on_timeout("launch")
    assert (out - a @ b).abs().max().item() < 1e-4


@pytest.mark.parametrize("chunk_group", [1, 2])
def test_a_chunk_that_never_arrives_is_skipped_and_named_the_rest_computed(chunk_group):
    a, b, out = _operands(4, seed=23)
    flags = torch.tensor([0, 1, 0, 1], dtype=torch.int32)  # chunk 2 never comes
    views = _views(a, out, flags, [False, True, True, True])
    cfg = GemmConfig(16, 16, 16, 2, 1, 4, chunk_group=chunk_group)
    kernel = _runs(views, b, cfg, sm_budget=3, timeout_s=0.3, reset_waits=True)
    kernel()
    with pytest.raises(Exception, match="chunk 2") as err:
        kernel.raise_on_timeout("launch")
    assert "chunk 3" not in str(err.value)
    rows = slice(2 * ROWS, 3 * ROWS)
    assert torch.isnan(out[rows]).all()
    keep = torch.ones(4 * ROWS, dtype=torch.bool)
    keep[rows] = False
    # chunk 3 shares chunk 2's group where grouped: computed all the same
    assert (out[keep] - (a @ b)[keep]).abs().max().item() < 1e-4
    # reset_waits: the last program zeroed every wait flag for the next launch
    assert flags.eq(0).all() and kernel.work.eq(0).all()


def test_back_to_back_launches_with_reset_waits_wait_again():
    a, b, out = _operands(2, seed=24)
    flags = torch.zeros(2, dtype=torch.int32)
    views = _views(a, out, flags, [False, True])
    kernel = _runs(
        views, b, GemmConfig(16, 16, 16, 2, 1, 4), sm_budget=4, timeout_s=5.0, reset_waits=True
    )
    for _ in range(2):
        flags[1] = 1  # the arrival, as a writer ordered after the last launch sets it
        out.fill_(float("nan"))
        kernel()
        kernel.raise_on_timeout("launch")
        assert (out - a @ b).abs().max().item() < 1e-4
        assert flags[1].item() == 0 and kernel.work.eq(0).all()


def test_ready_runs_refused_with_the_reason_where_it_does_not_apply():
    a, b, out = _operands(2, seed=25)
    flags = torch.ones(3, dtype=torch.int32)
    cfg = GemmConfig(16, 16, 16, 2, 1, 4)
    kw = dict(sm_budget=2, timeout_s=5.0, config=cfg)
    halves = [(0, ROWS), (ROWS, 2 * ROWS)]
    cases = {
        "signals": (
            [FusedChunkViews(a[s:e], out[s:e], signal=flags[i : i + 1]) for i, (s, e) in
             enumerate(halves)],
            dict(host_descriptors=True),
            "signals or has copies",
        ),
        "ragged": (
            [FusedChunkViews(a[:48], out[:48]), FusedChunkViews(a[48:], out[48:])],
            dict(host_descriptors=True),
            "tile counts differ",
        ),
        "no host descriptors": (
            [FusedChunkViews(a[s:e], out[s:e]) for s, e in halves],
            dict(host_descriptors=False),
            "no host descriptors",
        ),
    }  # fmt: skip
    for name, (views, extra, reason) in cases.items():
        kernel = FusedGemm(views, b, **kw, **extra)  # the default claims: runs refused
        assert reason in kernel.ready_runs_refusal(), name
        before = LAUNCH_COUNTS["fused_ready_runs"]
        kernel()
        assert LAUNCH_COUNTS["fused_ready_runs"] == before, name
        assert (out - a @ b).abs().max().item() < 1e-4, name
        with pytest.raises(ValueError, match=f"ready_runs=True refused for .*: .*{reason}"):
            FusedGemm(views, b, **kw, **extra, ready_runs=True)
    split = GemmConfig(16, 16, 16, 2, 1, 4, split_tail=True)
    views = [FusedChunkViews(a[s:e], out[s:e]) for s, e in halves]
    kernel = FusedGemm(views, b, sm_budget=16, timeout_s=5.0, config=split, host_descriptors=True)
    if kernel.plan is not None:  # the plan splits this launch's short wave
        assert "split_tail" in kernel.ready_runs_refusal()
    with pytest.raises(ValueError, match="ready_runs must be True, False or None, got 'yes'"):
        FusedGemm(views, b, **kw, ready_runs="yes")

    # runs apply here; the default (None) takes them where the tiles outnumber the programs
    # (12 tiles on 2 programs), and claims where each program has one tile (12 on 12)
    for budget, runs in ((2, True), (64, False)):
        out.fill_(float("nan"))
        before = LAUNCH_COUNTS["fused_ready_runs"]
        default = FusedGemm(views, b, **{**kw, "sm_budget": budget}, host_descriptors=True)
        assert default.ready_runs_refusal() == "" and default.tiles == 12
        assert default.runs_by_default() is runs and default.grid[0] == min(budget, 12)
        default()
        assert LAUNCH_COUNTS["fused_ready_runs"] == before + runs, budget
        assert (out - a @ b).abs().max().item() < 1e-4, budget
