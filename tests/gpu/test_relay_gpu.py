"""Relay schedules on GPUs (``ficco.plan.relay``): ring and bidirectional-ring reduce-scatter
(gemm_rs, with and without the GEMM epilogue's add) and all-gather (ag_gemm), hops pushed by
the copy engine (ce) or by a Triton kernel on SMs (sm), verified eagerly and timed as a
captured graph (the ``lane`` fixture: one GPU per rank, or W ranks that share one GPU; W = 8
there with ``FICCO_SHARED_WORLDS="2 4 8"``). Every wait is a stream wait on a peer's signal
(no kernel spins on a flag), so ranks that share a GPU run them too."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(1),
]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Schedule, check_legal  # noqa: E402

RS_SCHEDULES = [
    "shard/ce/cublas+relay",
    "finer-c2-m/ce/cublas+birelay+hi",
    "finer-c4-m/ce/cublas+epilogue+relay",
    "shard/sm/cublas+relay",
    "finer-c2-n/sm/cublas+birelay",
    "finer-c2-m/sm/triton+epilogue+birelay+sm16",
    "shard/ce/cublas",  # the direct twin, beside them
]
AG_SCHEDULES = [
    "shard/ce/cublas+relay",
    "finer-c2-m/ce/cublas+birelay",
    "finer-c2-k/sm/cublas+relay",
    "finer-c2-m/sm/triton+birelay+sm16",
    "shard/ce/cublas",
]


@pytest.mark.parametrize("pattern", ["gemm_rs", "ag_gemm"])
def test_relay_schedules_verify_and_capture_on_gpus(pattern, lane):
    # 2040 rows: shards of 1020 / 510 / 255 rows at W = 2 / 4 / 8, cut into ragged chunks
    problem = Problem(pattern=pattern, m=2040, n=512, k=256, world=lane.world)
    texts = RS_SCHEDULES if pattern == "gemm_rs" else AG_SCHEDULES
    schedules = [check_legal(problem, Schedule.parse(s)) for s in texts]
    opts = RunOptions(timing=TimingOptions(rounds=3, warmup=1))
    by = {m.name: m for m in lane.run(problem, schedules, opts)}
    for s in schedules:
        assert by[str(s)].verdict == "ok", (str(s), by[str(s)].detail)
        assert by[str(s)].median_ms > 0
        # copies, Triton stores and stream signals capture: what is timed is the graph
        assert by[str(s)].extra["graph"] == "graph", (str(s), by[str(s)].extra["graph"])
