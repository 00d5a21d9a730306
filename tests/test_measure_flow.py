"""The measuring flow's capture branches (what the CUDA backend takes), driven on CPU: a CPU
backend whose "graphs" replay the eager call, so verification of replays, the captured
serial baseline and the @graph twins of the isolated parts run without a GPU."""

from measuring_rank import CapturingCpuBackend, serve_measure_jobs

from ficco.backends import backend_spec
from ficco.execute import RunOptions, TimingOptions
from ficco.execute.pool import RankPool
from ficco.execute.run import measure_in
from ficco.problem import Problem
from ficco.space import Schedule


class CeCapturingCpuBackend(CapturingCpuBackend):
    #: a capture that records nothing: its replay leaves the NaN-poisoned output as it is
    broken = False

    def wants_graph(self, options, schedule):
        return schedule.transport.value == "ce" and options.graphs in ("all", "ce")

    def capture(self, fn):
        return super().capture((lambda: None) if self.broken else fn)


def capturing_rank(rank, world, init_file, conn, options, broken=False):
    from ficco.execute.cpu_group import init_gloo_rank

    init_gloo_rank(rank, world, init_file, options.timeout_s)
    backend = CeCapturingCpuBackend(rank, world)
    backend.broken = broken
    serve_measure_jobs(backend, conn)


def test_captured_candidates_are_verified_and_timed_beside_their_eager_twins():
    problem = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32")
    schedules = [Schedule.parse(s) for s in ("serial/nccl/cublas", "finer-c2-m/ce/cublas")]
    options = RunOptions(timeout_s=60)
    timing = TimingOptions(rounds=3, warmup=1, graphs="all")
    with RankPool(
        2,
        capturing_rank,
        (options,),
        timeout_s=120,
        startup_s=60,
        preload=backend_spec("cpu").preload,
    ) as pool:
        got = measure_in(pool, problem, schedules, timing)
    assert isinstance(got, list), got
    names = [m.name for m in got]
    assert names == [
        *map(str, schedules),
        "gemm_alone",
        "comm_alone",
        "serial_eager",
        "serial_graph",
    ]
    by = {m.name: m for m in got}
    assert all(m.verdict == "ok" and m.rounds == 3 for m in got), [(m.name, m.detail) for m in got]
    assert by["finer-c2-m/ce/cublas"].extra["graph"] == "graph"
    assert by["serial/nccl/cublas"].extra["graph"] == "eager"
    assert by["serial_graph"].extra["graph"] == "graph"
    for part in ("gemm_alone", "comm_alone"):  # each kept the faster of eager and replay
        kept = by[part].extra["issue_graph"]["queued"]
        assert kept in ("graph", "eager") and by[part].extra["graph"] == kept
    assert "gemm_alone@graph" not in names


def test_a_replay_that_computes_wrong_is_incorrect_and_keeps_the_eager_error():
    problem = Problem(pattern="ag_gemm", m=32, n=16, k=16, world=2, dtype="fp32")
    schedule = Schedule.parse("shard/ce/cublas")
    timing = TimingOptions(rounds=2, warmup=0, graphs="ce")
    args = (RunOptions(timeout_s=60), True)
    with RankPool(
        2, capturing_rank, args, timeout_s=120, startup_s=60, preload=backend_spec("cpu").preload
    ) as pool:
        (m, *baselines) = measure_in(pool, problem, [schedule], timing)
    assert m.verdict == "incorrect" and "incorrect graph replay" in m.detail
    assert m.max_abs_err < m.tolerance  # the eager run was right: its error is reported
    assert m.rounds == 0
    assert {b.name for b in baselines} == {"gemm_alone", "comm_alone", "serial_eager"}  # no graphs
