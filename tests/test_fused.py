"""Fused schedules: the space, the plans, the flag kernels (interpreter) and gloo runs."""

import dataclasses
import threading
import time

import pytest
import torch

import ficco
from ficco.execute import Verdict, run_problem
from ficco.execute.options import RunOptions
from ficco.plan import (
    FusedChunk,
    FusedGemmOp,
    Plan,
    ReduceOp,
    SignalOp,
    TransferOp,
    WaitFlagsOp,
    build_plan,
    flag_slot,
)
from ficco.problem import Problem
from ficco.space import Compute, Schedule, enumerate_schedules, violations
from ficco.space.geometry import geometry

AG = Problem(pattern="ag_gemm", m=96, n=80, k=72, world=3, dtype="fp32")
RS = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=3, dtype="fp32")


# --- the space -------------------------------------------------------------------------------


def test_fused_string_form_round_trips_and_counts_as_more_complex():
    s = Schedule.parse("finer-c4-m/ce/triton+fused+all_peers+sm16+hi")
    assert s.compute is Compute.FUSED and str(s) == "finer-c4-m/ce/triton+fused+all_peers+sm16+hi"
    plain = Schedule.parse("finer-c4-m/ce/triton+all_peers+sm16+hi".replace("+sm16", ""))
    assert s.complexity > plain.complexity
    with pytest.raises(ValueError, match="options are merged, fused"):
        Schedule.parse("shard/ce/triton+fuse")


@pytest.mark.parametrize(
    ("problem", "text", "rule"),
    [
        (AG, "shard/ce/cublas+fused", "fused_needs_triton"),
        (AG, "serial/ce/triton+fused", "fused_needs_overlap"),
        (AG, "finer-c2-k/nccl/triton+fused", "fused_needs_row_chunks"),
        (AG, "shard/nccl/triton+fused", "fused_needs_symmetric_memory"),
        (
            Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=2, experts=4),
            "shard/ce/triton+fused",
            "fused_needs_dense_pattern",
        ),
    ],
)
def test_each_fused_rule_says_why(problem, text, rule):
    broken = dict(violations(problem, Schedule.parse(text)))
    assert rule in broken and broken[rule]


def test_enumeration_has_fused_schedules_only_where_legal():
    for problem in (AG, RS):
        fused = [s for s in enumerate_schedules(problem) if s.compute is Compute.FUSED]
        # shard + 4 finer counts, x 3 reserves x 2 priorities x 2 orders (W = 3)
        assert len(fused) == 5 * 3 * 2 * 2
        assert {s.transport.value for s in fused} == {"ce"}
        assert {s.gemm.value for s in fused} == {"triton"}
        assert {s.split.value for s in fused} == {"m"}
        assert {s.sm_reserve for s in fused} == {0, 16, 32}  # the SM budget stays an axis
    a2a = Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=2, experts=4)
    assert not any(s.compute is Compute.FUSED for s in enumerate_schedules(a2a))


def test_fused_geometry_is_one_launch_over_all_rows():
    g = geometry(AG, Schedule.parse("finer-c4-m/ce/triton+fused"))
    assert (g.gemm_launches, g.gemm_rows, g.gemm_cols, g.gemm_k) == (1, 96, 80, 72)
    assert g.transfers == 2 * 4 and g.transfer_rows == 8


# --- the plans -------------------------------------------------------------------------------


def _task_of(plan: Plan, kind):
    return [t for t in plan.tasks if isinstance(t.op, kind)]


@pytest.mark.parametrize("text", ["shard/ce/triton+fused", "finer-c2-m/ce/triton+fused+all_peers"])
def test_ag_fused_plan_gemm_waits_only_inside_the_kernel(text):
    s = Schedule.parse(text)
    for rank in range(AG.world):
        plan = build_plan(AG, s, rank)
        (gemm,) = _task_of(plan, FusedGemmOp)
        assert gemm.deps == ()  # the local shard needs nothing
        chunks = gemm.op.chunks
        n = len(chunks) // AG.world
        assert all(c.wait is None and c.a.buffer == "a_shard" for c in chunks[:n])  # local first
        signals = {t.op.slot: t for t in _task_of(plan, SignalOp)}
        for c in chunks[n:]:
            signal = signals[c.wait]
            (recv,) = (plan.tasks[d] for d in signal.deps)
            assert isinstance(recv.op, TransferOp) and recv.op.direction == "recv"
            assert recv.op.local == c.a  # the flag guards exactly the rows the chunk reads
        assert len(signals) == len(chunks) - n
        rows = sorted(c.out.rows for c in chunks)
        assert rows[0][0] == 0 and rows[-1][1] == AG.m
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:], strict=False))
        assert len(plan.transfers()) == 2 * (len(chunks) - n)  # transfers stay tasks


def test_rs_fused_plan_every_staged_block_is_written_and_flagged_by_its_source():
    s = Schedule.parse("finer-c2-m/ce/triton+fused")
    plans = [build_plan(RS, s, r) for r in range(RS.world)]
    S, n = RS.m_shard, 2
    for owner, plan in enumerate(plans):
        waits = _task_of(plan, WaitFlagsOp)
        assert [w.op.slots for w in waits] == [
            tuple(flag_slot(src, j, n) for src in range(RS.world)) for j in range(n)
        ]
        for reduce in _task_of(plan, ReduceOp):
            assert all(isinstance(plan.tasks[d].op, WaitFlagsOp) for d in reduce.deps)
        for src, source_plan in enumerate(plans):
            (gemm,) = _task_of(source_plan, FusedGemmOp)
            mine = [c for c in gemm.op.chunks if c.out_rank == owner]
            assert len(mine) == n
            for j, c in enumerate(mine):
                assert c.signal == (owner, flag_slot(src, j, n))
                assert c.out.buffer == ("partial" if src == owner else "staging")
                assert c.out.rows[0] == src * S + c.a.rows[0] - owner * S
                assert c.a.rows[0] // S == owner  # the source computes the owner's rows
    last = _task_of(plans[0], FusedGemmOp)[0].op.chunks[-1]
    assert last.out_rank == 0  # the local block last: peers get their partials first


# --- the kernels (interpreter) ---------------------------------------------------------------


def _fused(chunks, b, timeout_s, **kw):
    from ficco.kernels.fused import FusedGemm

    return FusedGemm(chunks, b, sm_budget=3, timeout_s=timeout_s, **kw)


@pytest.mark.parametrize("path", ["tma", "ptr"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_kernel_waits_for_the_data_its_flag_guards(dtype, tol, path):
    from ficco.kernels.fused import FusedChunkViews

    gen = torch.Generator().manual_seed(0)
    # 24 columns: rows of 48 or 96 bytes, which tensor descriptors can address
    local = torch.randn(10, 24, generator=gen).to(dtype)
    arriving = torch.randn(30, 24, generator=gen).to(dtype)
    gathered = torch.full((30, 24), float("nan"), dtype=dtype)  # not there yet
    b = torch.randn(24, 24, generator=gen).to(dtype)
    out = torch.full((40, 24), float("nan"), dtype=dtype)
    flags = torch.zeros(4, dtype=torch.int32)
    chunks = [
        FusedChunkViews(local, out[:10]),
        FusedChunkViews(gathered[:15], out[10:25], wait=flags[1:2], signal=flags[3:4]),
        FusedChunkViews(gathered[15:], out[25:], wait=flags[2:3]),
    ]
    kernel = _fused(chunks, b, timeout_s=20.0, path=path)
    assert kernel.path == path

    def copy_then_flag():  # what a copy followed by its stream-ordered flag write does
        for i, rows in ((1, slice(0, 15)), (2, slice(15, 30))):
            time.sleep(0.2)
            gathered[rows] = arriving[rows]
            flags[i] = 1

    thread = threading.Thread(target=copy_then_flag)
    start = time.monotonic()
    thread.start()
    kernel()
    thread.join()
    assert time.monotonic() - start >= 0.4
    expect = torch.cat([local, arriving]).float() @ b.float()
    assert (out.float() - expect).abs().max().item() < tol * expect.abs().max().item()
    assert flags[3].item() == 1  # the chunk's last tile signalled
    kernel.raise_on_timeout("test")  # no timeout recorded


def test_a_flag_that_never_arrives_ends_in_flag_timeout_naming_the_chunk():
    from ficco.kernels.fused import FlagTimeout, FlagWait, FusedChunkViews

    a, b = torch.randn(16, 8), torch.randn(8, 8)
    out = torch.full((16, 8), float("nan"))
    flags = torch.zeros(2, dtype=torch.int32)
    chunks = [
        FusedChunkViews(a[:8], out[:8], wait=flags[0:1], name="chunk A"),
        FusedChunkViews(a[8:], out[8:], wait=flags[1:2], name="chunk B"),
    ]
    flags[0] = 1
    kernel = _fused(chunks, b, timeout_s=0.5)
    start = time.monotonic()
    kernel()
    assert time.monotonic() - start < 10
    with pytest.raises(FlagTimeout, match=r"timed out after 0.5 s .*chunk B") as err:
        kernel.raise_on_timeout("rank 3: fused GEMM")
    assert "chunk A" not in str(err.value) and "rank 3" in str(err.value)
    assert torch.isnan(out[8:]).all() and not torch.isnan(out[:8]).any()

    wait = FlagWait([flags[0:1], torch.zeros(1, dtype=torch.int32)], ["x", "y"], timeout_s=0.3)
    wait()
    with pytest.raises(FlagTimeout, match="flag of y"):
        wait.raise_on_timeout("owner")


def test_tma_path_takes_what_descriptors_can_address_and_says_why_not():
    from ficco.kernels.fused import FusedChunkViews
    from ficco.kernels.persistent import LAUNCH_COUNTS

    gen = torch.Generator().manual_seed(1)
    a = torch.randn(40, 24, generator=gen).half()  # 48-byte rows
    w = torch.randn(40, 24, generator=gen).half()
    b = w.t()  # [24, 40], column-major: read as B^T through its descriptor
    out = torch.full((40, 40), float("nan")).half()
    kernel = _fused([FusedChunkViews(a[:8], out[:8]), FusedChunkViews(a[8:], out[8:])], b, 5.0)
    assert kernel.path == "tma" and kernel.b_col_major and kernel.tma_refusal() == ""
    before = LAUNCH_COUNTS["fused_tma"]
    kernel()
    assert LAUNCH_COUNTS["fused_tma"] == before + 1
    expect = a.float() @ b.float()
    assert (out.float() - expect).abs().max().item() < 2e-2 * expect.abs().max().item()
    # the same rows 8 bytes into a buffer: no chunk of them starts on a 16-byte boundary
    shifted = torch.empty(a.numel() + 4, dtype=a.dtype)[4:].view(40, 24).copy_(a)
    odd = [FusedChunkViews(shifted[:8], out[:8]), FusedChunkViews(shifted[8:], out[8:])]
    with pytest.raises(ValueError, match="path='tma' refused: a chunk's a does not start"):
        _fused(odd, b, 5.0, path="tma")
    fallback = _fused(odd, b, 5.0)
    assert fallback.path == "ptr" and "16-byte boundary" in fallback.tma_refusal()
    out.fill_(float("nan"))
    fallback()
    assert (out.float() - expect).abs().max().item() < 2e-2 * expect.abs().max().item()
    with pytest.raises(ValueError, match="path: must be 'tma', 'ptr' or None"):
        _fused(odd, b, 5.0, path="cuda")


@pytest.mark.parametrize("path", ["tma", "ptr"])
def test_back_to_back_launches_need_no_reset_between(path):
    """The kernel's last program zeroes the claim and chunk counters: a second launch (no
    memset) computes everything again and signals again; a timeout stays reported until read."""
    from ficco.kernels.fused import FlagTimeout, FusedChunkViews

    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(40, 16, generator=gen), torch.randn(16, 24, generator=gen)
    out = torch.full((40, 24), float("nan"))
    flags = torch.zeros(3, dtype=torch.int32)
    chunks = [
        FusedChunkViews(a[:24], out[:24], signal=flags[0:1]),
        FusedChunkViews(a[24:], out[24:], wait=flags[1:2], name="late chunk"),
    ]
    kernel = _fused(chunks, b, timeout_s=0.3, path=path)
    kernel()  # the late chunk's flag never comes
    assert flags[0].item() == 1 and not torch.isnan(out[:24]).any() and kernel.work.eq(0).all()
    assert torch.isnan(out[24:]).all()
    with pytest.raises(FlagTimeout, match="late chunk"):
        kernel.raise_on_timeout("first")
    kernel.raise_on_timeout("reported once")  # read, so cleared
    flags.zero_()
    flags[1] = 1
    out.fill_(float("nan"))
    kernel()
    assert flags[0].item() == 1 and kernel.work.eq(0).all()
    assert (out - a @ b).abs().max().item() < 1e-4
    kernel.raise_on_timeout("second")


def test_fused_tiles_come_from_the_persistent_space_without_split_tail():
    from dataclasses import replace

    from ficco.kernels.configs import GPU_CONFIGS, fused_candidate_configs, heuristic_config
    from ficco.kernels.fused_configs import FusedTuningKey, fused_config
    from ficco.kernels.tuning import TuningKey

    space = {replace(c, split_tail=False) for c in GPU_CONFIGS}
    for rows, n, k in ((64, 4096, 2048), (2048, 8192, 8192), (256, 3072, 4096)):
        kept = fused_candidate_configs(rows, n, k, 2, 2)
        assert kept and set(kept) <= space and not any(c.split_tail for c in kept)
        assert all(c.block_m <= max(64, rows) for c in kept)  # no tile taller than a chunk
    assert len(fused_candidate_configs(2048, 8192, 8192, 2, 2)) == len(GPU_CONFIGS)
    cpu = torch.device("cpu")
    assert fused_config(96, 80, 72, 3, torch.float32, 3, cpu, "tma") == heuristic_config(
        96, 80, 72, interpreter=True
    )
    base = TuningKey("H200", "3.6.0", "bfloat16", 4096, 8192, 8192, 132)
    key = FusedTuningKey(base, chunks=4)
    assert str(key) == f"{base}|fused|chunks=4" and str(key) != str(base)


def test_kernel_refuses_chunks_that_do_not_share_strides():
    from ficco.kernels.fused import FusedChunkViews

    a, b, out = torch.randn(8, 8), torch.randn(8, 4), torch.zeros(8, 4)
    wide = torch.zeros(8, 6)[:, :4]
    with pytest.raises(ValueError, match="out must share one stride"):
        _fused([FusedChunkViews(a, out), FusedChunkViews(a, wide)], b, timeout_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        _fused([FusedChunkViews(a, out)], b, timeout_s=0)


# --- gloo runs (every rank a process) --------------------------------------------------------

FUSED_W2 = ["shard/ce/triton+fused", "finer-c4-m/ce/triton+fused+sm16+hi"]
FUSED_W3 = ["finer-c2-m/ce/triton+fused", "finer-c2-m/ce/triton+fused+all_peers+sm32"]


@pytest.mark.parametrize(
    ("pattern", "world", "dtype", "texts"),
    [
        ("ag_gemm", 2, "fp32", FUSED_W2),
        ("gemm_rs", 2, "fp32", FUSED_W2),
        ("ag_gemm", 3, "fp16", FUSED_W3),
        ("gemm_rs", 3, "fp16", FUSED_W3),
        ("ag_gemm", 3, "fp32", FUSED_W3[:1]),
        ("gemm_rs", 2, "fp16", FUSED_W2[:1]),
    ],
)
def test_fused_schedules_verify_over_gloo(pattern, world, dtype, texts):
    p = Problem(pattern=pattern, m=96, n=80, k=72, world=world, dtype=dtype)
    schedules = [Schedule.parse(t) for t in texts]
    results = run_problem(p, schedules, backend="cpu")
    assert [r.schedule for r in results] == texts
    assert all(r.ok for r in results), [(r.schedule, r.verdict.value, r.detail) for r in results]


def drop_first_signal(plan: Plan) -> Plan:
    """The first chunk's flag is never set: its copy lands, nobody says so."""
    first = next(t.id for t in plan.tasks if isinstance(t.op, SignalOp))
    return dataclasses.replace(plan, tasks=tuple(t for t in plan.tasks if t.id != first))


def silence_first_producer_chunk(plan: Plan) -> Plan:
    """The fused GEMM stores its first chunk into the owner but never flags it."""
    tasks = []
    for t in plan.tasks:
        if isinstance(t.op, FusedGemmOp):
            first, *rest = t.op.chunks
            quiet: FusedChunk = dataclasses.replace(first, signal=None)
            t = dataclasses.replace(t, op=dataclasses.replace(t.op, chunks=(quiet, *rest)))
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tuple(tasks))


@pytest.mark.parametrize(
    ("pattern", "hook", "where"),
    [
        ("ag_gemm", drop_first_signal, "fused GEMM"),
        ("gemm_rs", silence_first_producer_chunk, "reduction's flag wait"),
    ],
)
def test_a_missing_flag_is_a_timeout_verdict_not_a_hang(pattern, hook, where):
    p = Problem(pattern=pattern, m=32, n=16, k=16, world=2, dtype="fp32")
    options = RunOptions(timeout_s=8.0)  # flags give up after a quarter: 2 s
    start = time.monotonic()
    (result,) = run_problem(
        p, [Schedule.parse("shard/ce/triton+fused")], options=options, backend="cpu", plan_hook=hook
    )
    assert result.verdict is Verdict.TIMEOUT, result
    assert "FlagTimeout" in result.detail and where in result.detail
    assert "timed out after 2 s" in result.detail and "source rank" in result.detail
    # the pool's own limit (2 * timeout + 60 s) was never reached: the flag wait ended it
    assert time.monotonic() - start < 60


def test_space_options_can_leave_fused_out():
    """A store measured before fused schedules existed keeps its space (214 at this shape,
    beside the 172 relays added since)."""
    from ficco.space import Order, SpaceOptions

    p = Problem(pattern="ag_gemm", m=8192, n=8192, k=8192, world=2)
    everything = list(enumerate_schedules(p))
    before = list(
        enumerate_schedules(p, SpaceOptions(computes=(Compute.PER_CHUNK, Compute.MERGED)))
    )
    assert len(everything) - len(before) == 30
    relays = [s for s in before if s.order in (Order.RELAY, Order.BIRELAY)]
    assert len(before) - len(relays) == 214 and len(relays) == 172
    assert set(before) == {s for s in everything if s.compute is not Compute.FUSED}


def test_fused_without_shared_memory_is_unavailable_not_wrong():
    """A CPU group that is not a ficco rank pool (the drop-in ops) has no shared buffers."""
    from ficco.execute.buffers import allocate
    from ficco.execute.cpu import CpuPrimitives
    from ficco.verdict import Unavailable

    plan = build_plan(RS, Schedule.parse("shard/ce/triton+fused"), 0)
    with pytest.raises(Unavailable, match="shared \\(symmetric\\) memory"):
        CpuPrimitives(plan, allocate(plan, 0), 1)


def _run_modes(rank: int, world: int, init_file: str, shared_dir: str, out_dir: str) -> None:
    """One gloo rank: a fused plan of each pattern run in its 'gemm' and 'comm' parts alone
    (the signatures' runs), where no peer's flags come: they must not wait."""
    import json
    import os

    from ficco.execute.cpu import CpuBackend
    from ficco.execute.cpu_group import init_gloo_rank
    from ficco.execute.interpreter import interpret

    init_gloo_rank(rank, world, init_file, 60.0)
    backend = CpuBackend(rank, world, shared_dir=shared_dir, flag_timeout_s=5.0)
    took = {}
    for problem in (AG, RS):
        p = dataclasses.replace(problem, world=world)
        bufs = backend.allocate(p, 0)
        plan = build_plan(p, Schedule.parse("finer-c2-m/ce/triton+fused"), rank)
        prims = backend.primitives(plan, bufs, 0)
        for mode in ("gemm", "comm", "full"):
            start = time.monotonic()
            interpret(prims, mode)
            took[f"{p.pattern}:{mode}"] = time.monotonic() - start
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(took, fh)
    backend.close()


def test_the_parts_of_a_fused_plan_run_alone_without_waiting(tmp_path):
    import json

    import torch.multiprocessing as mp

    world = 2
    mp.start_processes(
        _run_modes,
        args=(world, str(tmp_path / "rendezvous"), str(tmp_path), str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="forkserver",
    )
    for rank in range(world):
        took = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(took) == {
            f"{p}:{m}" for p in ("ag_gemm", "gemm_rs") for m in ("gemm", "comm", "full")
        }
        # a wait would have lasted the 5 s flag timeout and raised
        assert max(took.values()) < 5.0, took


def test_cuda_ranks_load_every_kernel_eagerly():
    # a kernel loaded lazily while a flag wait spins blocks the host: ficco's ranks load
    # every kernel with its module
    from ficco.execute.pool import RankPool

    assert RankPool._env()["CUDA_MODULE_LOADING"] == "EAGER"


def test_ops_refuse_fused_on_cuda_without_eager_loading(monkeypatch):
    from ficco.ops.choice import backend_limit

    p = ficco.Problem(pattern="ag_gemm", m=4096, n=1024, k=1024, world=2)
    fused = ficco.Schedule.parse("shard/ce/triton+fused")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    assert "CUDA_MODULE_LOADING=EAGER" in backend_limit(p, fused, "cuda")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert backend_limit(p, fused, "cuda") is None
