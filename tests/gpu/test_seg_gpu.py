"""The seg transport on GPUs: each step's transfers as one segment-copy kernel over the peers'
buffers, verified eagerly and as a captured graph, beside its ce twin (the ``lane`` fixture:
one GPU per rank, or ranks that share a GPU)."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(1),
]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.routing import with_skewed_routing  # noqa: E402
from ficco.space import Schedule  # noqa: E402

SCHEDULES = [
    "serial/seg/cublas",
    "serial/ce/cublas",
    "shard/seg/cublas+hi",
    "finer-c2-m/seg/cublas",
    "finer-c4-m/seg/cublas+merged",
    "finer-c2-m/seg/triton+sm16",
    "finer-c2-m/ce/cublas",
]


@pytest.mark.parametrize("pattern", ["a2a_gemm", "gemm_a2a"])
@pytest.mark.parametrize("skewed", [False, True])
def test_seg_schedules_verify_and_capture_on_gpus(pattern, skewed, lane):
    problem = Problem(pattern=pattern, m=2048, n=512, k=256, world=lane.world, experts=8)
    if skewed:
        problem = with_skewed_routing(problem, top_k=2, alpha=1.2, seed=0)
    schedules = [Schedule.parse(s) for s in SCHEDULES]
    opts = RunOptions(timing=TimingOptions(rounds=3, warmup=1))
    by = {m.name: m for m in lane.run(problem, schedules, opts)}
    for s in schedules:
        assert by[str(s)].verdict == "ok", (str(s), by[str(s)].detail)
        assert by[str(s)].median_ms > 0
        # what is timed is the captured graph (the kernel launch captured like ce's copies)
        assert by[str(s)].extra["graph"] == "graph", (str(s), by[str(s)].extra["graph"])
