"""ficco's all-reduce kernels with epoch-valued flags (lamport1, lamport2) and the fused
all-reduce + residual + RMSNorm on GPUs.

One GPU: one process plays W = 2, 4, 8 ranks (every rank's workspace on cuda:0; flags written
and read by one process): the kernels' arithmetic, phase by phase and in one launch per rank
on W streams at once, replays of a captured CUDA graph, a stale flag refused, the fused
epilogue against torch's rms_norm in float64 and its FP8 output. Two GPUs: gemm_ar's lamport
schedules verified and timed as graphs, and the op on an NCCL group. Ranks that share one GPU
(the one-GPU lane, separate processes) cannot run these kernels: a kernel spins on a flag
that a kernel of another process sets, and one GPU runs the processes' kernels one after the
other (on one H100 a spinner saw such a flag only after its budget ran out, or never), so
those tests need 2 GPUs.

    python -m pytest -q tests/gpu/test_lamport_allreduce_gpu.py
"""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(1)]

from ficco.space.transports import LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT  # noqa: E402

KINDS = (LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EPS = 1e-5
two_gpus = pytest.mark.gpus(
    2,
    why="the kernels spin on flags other ranks' kernels set, and kernels of processes that "
    "share one GPU do not run concurrently",
)


def lam():
    from ficco.kernels import allreduce_lamport

    return allreduce_lamport


def rank_order_fp32(srcs):
    total = srcs[0].float()
    for s in srcs[1:]:
        total = total + s.float()
    return total.to(srcs[0].dtype)


def phased(ws, kind, srcs, dsts):
    k = lam()
    for phase in k.phases_of(kind):
        for r, w in enumerate(ws):
            k.all_reduce(w, kind, srcs[r], dsts[r], phases=phase)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_phase_by_phase_every_rank_gets_the_rank_order_sum(kind, world, dtype):
    k = lam()
    ws = k.local_workspaces(world, 1 << 22, device="cuda", timeout_s=5.0)
    gen = torch.Generator(device="cuda").manual_seed(world)
    for shape in ((1, 4096), (7, 1000), (512, 1024)):  # 8 KiB decode row; ragged; 1 MiB
        srcs = [torch.randn(shape, device="cuda", generator=gen).to(dtype) for _ in range(world)]
        dsts = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for _ in srcs]
        phased(ws, kind, srcs, dsts)
        torch.cuda.synchronize()
        want = rank_order_fp32(srcs)
        for r in range(world):
            ws[r].raise_on_timeout(f"rank {r}")
            assert torch.equal(dsts[r], want), (kind, world, shape, r)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_one_launch_per_rank_on_concurrent_streams(kind, world):
    """Every rank's whole call (push, wait, reduce) as one launch, ranks on W streams of one
    process: the grids are small enough to run at once, so each rank's waits see its peers'
    flags as a real multi-GPU run would (a timeout fails the test instead of hanging it)."""
    k = lam()
    # a generous timeout: a rank's first launch compiles its kernel (rank 1 is a
    # specialization of its own) while the peers already spin
    ws = k.local_workspaces(world, 1 << 20, device="cuda", timeout_s=60.0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    for call in range(5):
        srcs = [torch.randn(3, 700, device="cuda").to(torch.bfloat16) for _ in range(world)]
        dsts = [torch.empty_like(s) for s in srcs]
        torch.cuda.synchronize()
        for r in range(world):
            with torch.cuda.stream(streams[r]):
                k.all_reduce(ws[r], kind, srcs[r], dsts[r])
        torch.cuda.synchronize()
        want = rank_order_fp32(srcs)
        for r in range(world):
            ws[r].raise_on_timeout(f"call {call} rank {r}")
            assert torch.equal(dsts[r], want), (kind, call, r)


@pytest.mark.parametrize("kind", KINDS)
def test_a_captured_graph_replays_with_the_epoch_advancing_on_the_device(kind):
    """Every rank's phases captured once into one graph, replayed 6 times with new inputs
    copied in before each replay: no host work between replays, the slot and the expected
    flag value advance inside the kernels."""
    k = lam()
    world, shape = 4, (2, 2048)
    ws = k.local_workspaces(world, 1 << 20, device="cuda", timeout_s=5.0)
    srcs = [torch.zeros(shape, device="cuda", dtype=torch.bfloat16) for _ in range(world)]
    dsts = [torch.empty_like(s) for s in srcs]
    phased(ws, kind, srcs, dsts)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        phased(ws, kind, srcs, dsts)
    for replay in range(6):
        fresh = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in range(world)]
        for s, f in zip(srcs, fresh, strict=True):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        want = rank_order_fp32(fresh)
        for r in range(world):
            ws[r].raise_on_timeout(f"replay {replay} rank {r}")
            assert torch.equal(dsts[r], want), (kind, replay, r)
    assert {int(w.epochs[0]) for w in ws} == {
        1 + 6
    }  # the warm-up and 6 replays (a capture runs nothing)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_flag_times_out_on_the_gpu(kind):
    k = lam()
    world, shape = 2, (4, 256)
    ws = k.local_workspaces(world, 1 << 16, device="cuda", timeout_s=0.2)
    for _ in range(3):
        srcs = [torch.randn(shape, device="cuda") for _ in range(world)]
        phased(ws, kind, srcs, [torch.empty_like(s) for s in srcs])
    torch.cuda.synchronize()
    src, dst = torch.randn(shape, device="cuda"), torch.empty(shape, device="cuda")
    phases = k.phases_of(kind)
    k.all_reduce(ws[0], kind, src, dst, phases=phases[0])  # rank 1 never pushes call 4
    k.all_reduce(ws[0], kind, src, dst, phases=phases[1])
    torch.cuda.synchronize()
    from ficco.kernels.flags import FlagTimeout

    with pytest.raises(FlagTimeout, match="timed out after 0.2 s"):
        ws[0].raise_on_timeout("rank 0")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("world", [2, 8])
def test_the_fused_epilogue_is_torchs_rms_norm(world, dtype):
    import torch.nn.functional as F

    from ficco.ops.norm import add_rms_norm

    k = lam()
    ws = k.local_workspaces(world, 1 << 22, device="cuda", timeout_s=5.0)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    for rows, n in ((1, 8192), (5, 4096), (64, 5120), (3, 123)):
        srcs = [torch.randn(rows, n, device="cuda").to(dtype) for _ in range(world)]
        residual = torch.randn(rows, n, device="cuda").to(dtype)
        weight = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        normed = [torch.empty_like(residual) for _ in range(world)]
        new_res = [torch.empty_like(residual) for _ in range(world)]
        for phase in k.ONE_SHOT_PHASES:
            for r in range(world):
                k.all_reduce_rms_norm(
                    ws[r], srcs[r], residual, weight, EPS, normed[r], new_res[r], phases=phase
                )
        torch.cuda.synchronize()
        want_normed, want_res = add_rms_norm(rank_order_fp32(srcs), residual, weight, EPS)
        for r in range(world):
            ws[r].raise_on_timeout(f"rank {r}")
            assert torch.equal(new_res[r], want_res), (rows, n, r)
            exact = F.rms_norm(new_res[r].double(), (n,), weight.double(), EPS)
            torch.testing.assert_close(normed[r].double(), exact, atol=tol * 4, rtol=tol)
            torch.testing.assert_close(normed[r], want_normed, atol=tol, rtol=tol)


def test_the_fused_fp8_output_is_the_scaled_norm_rounded_once():
    from ficco.ops.norm import add_rms_norm

    k = lam()
    world, rows, n = 2, 4, 4096
    ws = k.local_workspaces(world, 1 << 20, device="cuda", timeout_s=5.0)
    srcs = [torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(world)]
    srcs[0][0, 0] = 3000.0  # saturates at 448 once scaled
    residual = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    normed = [torch.empty(rows, n, device="cuda", dtype=torch.float8_e4m3fn) for _ in srcs]
    new_res = [torch.empty_like(residual) for _ in srcs]
    for phase in k.ONE_SHOT_PHASES:
        for r in range(world):
            k.all_reduce_rms_norm(
                ws[r], srcs[r], residual, weight, EPS, normed[r], new_res[r], scale, phase
            )
    torch.cuda.synchronize()
    want, _ = add_rms_norm(rank_order_fp32(srcs), residual, weight, EPS, scale)
    for r in range(world):
        got = normed[r].float()
        assert got[0, 0] == 448.0
        # one e4m3 step at most (the GPU's and torch's casts agree but for fp32 ulps of the
        # norm computed in a different order)
        assert ((got - want.float()).abs() <= want.float().abs() / 8 + 2.0**-9).all()


# --- two GPUs: the executor and the op ------------------------------------------------------

SCHEDULES = (
    "serial/lamport1/cublas",
    "serial/lamport2/cublas",
    "finer-c2-m/lamport1/cublas",
    "finer-c4-m/lamport2/cublas+hi",
    "finer-c2-m/lamport2/triton",
)


@two_gpus
@pytest.mark.parametrize(("m", "dtype"), [(1, "bf16"), (13, "fp16"), (512, "bf16"), (96, "fp32")])
def test_lamport_schedules_verify_and_are_timed_as_graphs(m, dtype):
    from ficco.execute import RunOptions, TimingOptions
    from ficco.execute.run import run_problem
    from ficco.problem import Problem
    from ficco.space import Schedule, is_legal

    problem = Problem(pattern="gemm_ar", m=m, n=1024, k=512, world=2, dtype=dtype)
    schedules = [s for s in map(Schedule.parse, SCHEDULES) if is_legal(problem, s)]
    assert schedules
    options = RunOptions(timing=TimingOptions(rounds=3))
    results = run_problem(problem, [Schedule(), *schedules], backend="cuda", options=options)
    by = {r.schedule: r for r in results}
    for s in schedules:
        got = by[str(s)]
        assert got.ok, (str(s), got.detail)
        graph = got.measurement.extra["graph"]
        assert graph == "graph", (str(s), graph)


def _op_body(rank, world, init_file):
    import torch.distributed as dist
    import torch.nn.functional as F

    from ficco.ops import linear_all_reduce

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=dev
    )
    try:
        gen = torch.Generator(device=dev).manual_seed(0)  # the same replicated tensors
        residual = torch.randn(16, 4096, device=dev, generator=gen).to(torch.bfloat16)
        norm_w = torch.randn(4096, device=dev, generator=gen).to(torch.bfloat16)
        gen.manual_seed(1 + rank)
        for m in (1, 16):
            x = torch.randn(m, 1024, device=dev, generator=gen).to(torch.bfloat16)
            w = torch.randn(4096, 1024, device=dev, generator=gen).to(torch.bfloat16) / 32
            partial = (x.float() @ w.float().t()).contiguous()
            dist.all_reduce(partial)
            want_res = partial + residual[:m].float()
            want = F.rms_norm(want_res.double(), (4096,), norm_w.double(), EPS)
            for _ in range(3):  # the workspace reused call to call
                with torch.no_grad():
                    normed, new_res = linear_all_reduce(
                        x, w, residual=residual[:m], norm_weight=norm_w, eps=EPS
                    )
                err = (normed.double() - want).norm() / want.norm()
                assert err < 2e-2, (m, float(err))
                assert (new_res.float() - want_res).abs().max() < 0.1
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


@two_gpus
def test_the_fused_op_on_an_nccl_group():
    import torch.multiprocessing as mp

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_op_body, (2, os.path.join(tmp, "init")), nprocs=2, start_method="spawn")
