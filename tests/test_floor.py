"""No timing below physics: the floor of a problem on a described machine, the verdict of a
measurement faster than it, and a fake clock that returns an impossible time through the
whole measuring flow on CPU ranks (emb_a2a, with its copy-engine all-to-all baseline)."""

import math

import pytest
from measuring_rank import CapturingCpuBackend, serve_measure_jobs

from ficco.backends import backend_spec
from ficco.execute import RunOptions, TimingOptions
from ficco.execute.pool import RankPool
from ficco.execute.run import measure_in
from ficco.measure.floor import below_floor, judge_floor, machine_for, physical_floor
from ficco.measure.record import Measurement, signature
from ficco.model.machine import load_machine
from ficco.patterns import ideal_ms
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import Verdict

H200X2 = load_machine("h200x2")
EMB = Problem(pattern="emb_a2a", m=8, n=4, k=2, world=2, dtype="fp32", tables=(5, 6, 7))


def test_the_floor_is_the_gemm_at_the_cards_peak_or_the_bytes_over_the_links():
    gemm = Problem(pattern="ag_gemm", m=8192, n=8192, k=8192, world=2, dtype="bf16")
    floor = physical_floor(gemm, H200X2)
    assert floor.work_ms == pytest.approx(2 * 8192**3 / 2 / (989e12 / 1e3))
    # ag_gemm: the busiest rank receives W - 1 shards of M/W rows of A
    assert floor.link_ms == pytest.approx(4096 * 8192 * 2 / (450e9 / 1e3))
    assert floor.ms == max(floor.work_ms, floor.link_ms)
    # emb_a2a's work is a gather: flops x dtype bytes through HBM, not tensor-core peak
    emb = physical_floor(EMB, H200X2)
    assert emb.work_ms == pytest.approx(2 * 3 * 8 * 4 * 4 / 2 / (4800e9 / 1e3))


def test_a_timing_below_the_floor_by_more_than_the_noise_is_implausible_never_ok():
    floor = physical_floor(EMB, H200X2).ms
    fast = Measurement(problem=EMB.to_dict(), name="shard/ce/cublas", median_ms=floor / 100)
    noisy = Measurement(problem=EMB.to_dict(), name="serial/ce/cublas", median_ms=floor / 2)
    noisy.spread_ms = floor  # its own spread reaches the floor: not proven impossible
    honest = Measurement(problem=EMB.to_dict(), name="serial/nccl/cublas", median_ms=floor * 3)
    flagged = judge_floor([fast, noisy, honest], EMB, H200X2)
    assert flagged == ["shard/ce/cublas"]
    assert fast.verdict == Verdict.IMPLAUSIBLE.value and "physical floor" in fast.detail
    assert noisy.verdict == honest.verdict == "ok"
    assert honest.extra["floor_ms"] == pytest.approx(floor)
    assert not below_floor(math.nan, 0.0, floor) and not below_floor(0.0, 0.0, 0.0)
    assert judge_floor([fast], EMB, None) == []  # no machine described: no floor held


def test_the_ideal_is_never_below_the_floor():
    m = Measurement(problem=EMB.to_dict(), name="shard/ce/cublas", median_ms=5.0)
    m.extra["floor_ms"] = 2.0
    times = {"gemm_alone": 0.5, "comm_alone": 0.9, "comm_alone_ce": 0.4}
    assert ideal_ms("emb_a2a", times) == 0.5  # the fastest real exchange is the CE one
    assert signature(m, times)["ideal_ms"] == 2.0


def test_the_machine_of_a_gpu_is_the_smallest_shipped_node_that_holds_the_world():
    assert machine_for("NVIDIA H200", 2).name == "h200x2"
    assert machine_for("NVIDIA H200", 3).name == "h200x4"
    assert machine_for("NVIDIA H200", 16) is None  # one node only: a floor is per node
    assert machine_for("cpu", 2) is None


class ImpossibleClock:
    """A clock that says ``shard/ce/cublas`` ran in a picosecond, everything else in 1 ms."""

    def prepare(self, issue):
        pass

    def time(self, fn):
        fn()
        return None

    def collect(self, pending):
        return {n: [1e-9 if n == "shard/ce/cublas" else 1.0] * len(v) for n, v in pending.items()}

    def synchronize(self):
        pass


class LyingCpuBackend(CapturingCpuBackend):
    def clock(self, options):
        return ImpossibleClock()


def lying_rank(rank, world, init_file, conn, options):
    from ficco.execute.cpu_group import init_gloo_rank

    init_gloo_rank(rank, world, init_file, options.timeout_s)
    serve_measure_jobs(LyingCpuBackend(rank, world), conn)


def test_a_fake_clock_with_an_impossible_time_makes_that_schedule_implausible():
    schedules = [Schedule.parse(s) for s in ("serial/nccl/cublas", "shard/ce/cublas")]
    timing = TimingOptions(rounds=2, warmup=0, graphs="all", machine="h200x2")
    options = RunOptions(timeout_s=60)
    with RankPool(
        2, lying_rank, (options,), timeout_s=120, startup_s=60, preload=backend_spec("cpu").preload
    ) as pool:
        got = measure_in(pool, EMB, schedules, timing)
    assert isinstance(got, list), got
    by = {m.name: m for m in got}
    assert by["shard/ce/cublas"].verdict == "implausible", by["shard/ce/cublas"]
    assert "below the physical floor" in by["shard/ce/cublas"].detail
    assert by["serial/nccl/cublas"].verdict == "ok"
    assert by["serial/nccl/cublas"].extra["floor_ms"] > 0
    # the fastest real all-to-all alone: the serial/ce plan's pushes, beside NCCL's, captured
    assert by["comm_alone_ce"].verdict == "ok", by["comm_alone_ce"].detail
    assert by["comm_alone_ce"].extra["graph"] in ("graph", "eager")
    assert "comm_alone_ce@graph" not in by
