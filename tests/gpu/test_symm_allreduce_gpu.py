"""gemm_ar over symmetric memory's all-reduce kernels (symm1, symm2) on 2 GPUs: verified,
captured in CUDA graphs, and through ficco.ops on the caller's group (skipped without 2
GPUs)."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(
        2, why="symmetric memory's kernels refuse ranks that share a GPU (the one-GPU lane)"
    ),
]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.execute.run import run_problem  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Schedule, is_legal  # noqa: E402

SCHEDULES = (
    "serial/symm1/cublas",
    "serial/symm2/cublas",
    "finer-c2-m/symm1/cublas",
    "finer-c4-m/symm2/cublas+hi",
    "finer-c2-m/symm2/triton",
    "finer-c8-m/symm1/triton+hi",
)


@pytest.mark.parametrize(
    ("m", "dtype"),
    [(1, "bf16"), (13, "bf16"), (512, "bf16"), (96, "fp32")],  # decode row; ragged chunks
)
def test_symm_schedules_verify_and_are_timed_as_graphs(m, dtype):
    problem = Problem(pattern="gemm_ar", m=m, n=1024, k=512, world=2, dtype=dtype)
    schedules = [s for s in map(Schedule.parse, SCHEDULES) if is_legal(problem, s)]
    assert schedules
    opts = RunOptions(timing=TimingOptions(rounds=3, warmup=1))
    results = run_problem(problem, [Schedule(), *schedules], backend="cuda", options=opts)
    by = {r.schedule: r for r in results}
    for s in schedules:
        got = by[str(s)]
        assert got.ok, (str(s), got.detail)
        assert got.median_ms > 0
        graph = got.measurement.extra["graph"]
        assert graph == "graph", (str(s), graph)


def _ops_body(rank, world, init_file):
    import torch.distributed as dist

    from ficco.ops import matmul_all_reduce

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=dev
    )
    try:
        gen = torch.Generator(device=dev).manual_seed(rank)
        for m in (1, 16, 96):  # the token count changes call to call
            a = torch.randn(m, 512, device=dev, generator=gen).to(torch.bfloat16)
            b = torch.randn(512, 1024, device=dev, generator=gen).to(torch.bfloat16)
            want = (a.float() @ b.float()).contiguous()
            dist.all_reduce(want)
            problem = Problem(pattern="gemm_ar", m=m, n=1024, k=512, world=world)
            for text in SCHEDULES:
                if not is_legal(problem, Schedule.parse(text)):
                    continue
                for _ in range(3):  # reuse of the symmetric buffers across calls
                    got = matmul_all_reduce(a, b, schedule=text)
                    err = (got.float() - want).norm() / want.norm()
                    assert err < 2e-2, (text, m, float(err))
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


def test_matmul_all_reduce_over_the_symm_kernels_on_two_gpus():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ops_body, (2, os.path.join(tmp, "rdv")), nprocs=2, join=True)
