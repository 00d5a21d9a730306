"""emb_a2a schedules on GPUs (the ``lane`` fixture: one GPU per rank, and ranks that share a
GPU): pooling by torch (``cublas``) and by ficco's Triton kernel (``triton``, through the CUDA
executor's pooling primitive), every transport, table groups and batch cuts, against the
reference, with an uneven batch and skewed tables. ``+fused`` (pool-and-store into peers)
runs on distinct GPUs and is refused, with the reason, where ranks share one."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(1)]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Schedule  # noqa: E402

SCHEDULES = [
    "serial/nccl/cublas",
    "serial/ce/triton",
    "serial/seg/triton",
    "shard/ce/triton",
    "shard/nccl/cublas",
    "finer-c2-m/seg/triton",
    "finer-c4-m/ce/cublas+merged",
    "finer-c8-m/ce/triton",  # more chunks than tables: tables cut by batch
    "shard/ce/triton+fused",
    "finer-c4-m/ce/triton+fused",
]


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_emb_a2a_schedules_verify_on_gpus(pooling, lane):
    world = lane.world
    tables = (50_000, 30, 20_000, 700, 9, 120_000, 3000, 64)[: max(world, 5)]
    problem = Problem(
        pattern="emb_a2a", m=1001, n=128, k=8, world=world, tables=tables, pooling=pooling,
        bags="uniform",
    )  # fmt: skip
    schedules = [Schedule.parse(s) for s in SCHEDULES]
    measured = lane.run(problem, schedules, RunOptions(timing=TimingOptions(rounds=2, warmup=1)))
    by = {m.name: m for m in measured}
    for s in schedules:
        m = by[str(s)]
        if lane.shared and "fused" in str(s):
            assert m.verdict == "unavailable" and "distinct GPUs" in m.detail, (str(s), m.detail)
            continue
        assert m.verdict == "ok", (str(s), m.verdict, m.detail)
