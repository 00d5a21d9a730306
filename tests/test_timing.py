"""The timing protocol: fixed and ``rounds="auto"`` rounds, fed fake samples, then for real
on CPU processes."""

import itertools
import json
import math
import random

import pytest

from ficco.execute.options import RunOptions, TimingOptions, parse_rounds
from ficco.execute.timing import median_ci, needs_more, time_rounds


class FakeClock:
    """Serves each candidate's next sample from a generator; logs the calls."""

    def __init__(self, samples: dict):
        self.samples = {name: iter(gen) for name, gen in samples.items()}
        self.calls: list[str] = []
        self.collects = 0

    def prepare(self, issue):
        pass

    def time(self, fn):
        fn()
        return fn.name

    def collect(self, pending):
        self.collects += 1
        return {name: [next(self.samples[n]) for n in got] for name, got in pending.items()}

    def synchronize(self):
        pass


def candidates(*names):
    out = {}
    for name in names:

        def fn(name=name):
            pass

        fn.name = name
        out[name] = fn
    return out


def logged(clock, cands):
    def wrap(name, fn):
        def run():
            clock.calls.append(name)
            fn()

        run.name = name
        return run

    return {name: wrap(name, fn) for name, fn in cands.items()}


def test_median_ci_is_the_order_statistic_interval():
    xs = list(range(1, 21))  # n = 20: ranks 6 and 15 at 95% (binomial tail 0.041 <= 0.05)
    assert median_ci(xs, 0.95) == (6, 15)
    assert median_ci(list(range(6)), 0.95) == (0, 5)  # n = 6: 2 / 64 <= 0.05
    assert median_ci(list(range(5)), 0.95) == (-math.inf, math.inf)  # 2 / 32 > 0.05
    lo, hi = median_ci(list(range(101)), 0.95)
    assert (lo, hi) == (40, 60)  # the textbook ranks 41 and 61 of 101 (1-based)


def test_needs_more_stops_a_tight_candidate_and_caps_a_noisy_one():
    opts = TimingOptions(rounds="auto", min_rounds=6, max_rounds=12, target_rel_ci=0.02)
    assert needs_more([1.0] * 5, opts)  # below the minimum
    assert not needs_more([1.0, 1.001, 0.999, 1.0, 1.002, 0.998], opts)
    assert needs_more([1.0, 2.0, 0.5, 1.5, 3.0, 0.7], opts)
    assert not needs_more([1.0, 2.0, 0.5, 1.5, 3.0, 0.7] * 2, opts)  # the cap


def test_auto_rounds_go_on_for_the_noisy_candidates_only_in_whole_interleaved_rounds():
    rng = random.Random(0)
    steady = (1.0 + 1e-4 * rng.random() for _ in itertools.count())
    noisy = (rng.uniform(0.5, 2.0) for _ in itertools.count())
    clock = FakeClock({"steady": steady, "noisy": noisy, "noisy2": noisy})
    opts = TimingOptions(rounds="auto", warmup=0, min_rounds=6, max_rounds=20)
    got = time_rounds(logged(clock, candidates("steady", "noisy", "noisy2")), opts, clock)
    assert len(got["steady"]) == 6 and len(got["noisy"]) == len(got["noisy2"]) == 20
    # the first 6 rounds interleave all three; after that each round holds both noisy ones
    assert clock.calls[:18] == ["steady", "noisy", "noisy2"] * 6
    assert clock.calls[18:] == ["noisy", "noisy2"] * 14
    assert clock.collects == 1 + 14


def test_fixed_rounds_take_exactly_that_many_in_one_pass():
    clock = FakeClock({"a": itertools.repeat(1.0), "b": itertools.repeat(2.0)})
    got = time_rounds(candidates("a", "b"), TimingOptions(rounds=4, warmup=1), clock)
    assert got == {"a": [1.0] * 4, "b": [2.0] * 4} and clock.collects == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rounds": "often"}, "rounds: needs at least 1 round, got 'often'"),
        ({"rounds": 0}, "rounds: needs at least 1 round, got 0"),
        ({"min_rounds": 8, "max_rounds": 4}, r"max_rounds: must be >= min_rounds \(8\), got 4"),
        ({"target_rel_ci": 0.0}, r"target_rel_ci: must be in \(0, 1\), got 0.0"),
        ({"confidence": 1.0}, r"confidence: must be in \[0.5, 1\), got 1.0"),
        ({"issue": "synced"}, "issue: 'synced' is one string"),
    ],
)
def test_bad_timing_options_name_field_value_and_rule(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimingOptions(**kwargs)


def test_options_are_frozen_and_rounds_parse():
    opts = TimingOptions()
    with pytest.raises(AttributeError):
        opts.rounds = 3
    assert parse_rounds("auto") == "auto" and parse_rounds("7") == 7
    with pytest.raises(ValueError, match="rounds: a whole number of rounds or 'auto'"):
        parse_rounds("many")
    with pytest.raises(ValueError, match="timeout_s: must be > 0 seconds"):
        RunOptions(timeout_s=0)


def test_auto_rounds_on_cpu_processes_record_the_rounds_each_took(tmp_path):
    from ficco.problem import Problem
    from ficco.profile import ProfileStore
    from ficco.space import Schedule
    from ficco.sweep import CpuRunner

    problem = Problem(pattern="ag_gemm", m=32, n=16, k=16, world=2, dtype="fp32")
    # a target no host timing can meet: every candidate runs to the cap
    timing = TimingOptions(rounds="auto", warmup=1, min_rounds=3, max_rounds=6, target_rel_ci=1e-9)
    runner = CpuRunner(RunOptions(timing=timing))
    try:
        got = runner.measure(problem, [Schedule(), Schedule.parse("shard/ce/cublas")])
        assert [m.verdict for m in got] == ["ok", "ok"]
        for m in got + runner.baselines(problem):
            assert m.rounds == m.samples == len(m.extra["times_ms"]) == 6, m
        store = ProfileStore.open(tmp_path / "store", runner.fingerprint())
        for m in got:
            store.append(m)
        records = (tmp_path / "store" / "records.jsonl").read_text().splitlines()
        assert [json.loads(r)["rounds"] for r in records] == [6, 6]
        # a target every candidate meets at its first judgement (n = 6: the full range)
        loose = TimingOptions(
            rounds="auto", warmup=0, min_rounds=6, max_rounds=9, target_rel_ci=0.99
        )
        runner.options = RunOptions(timing=loose)
        (m,) = runner.measure(problem, [Schedule.parse("shard/ce/cublas")])
        assert 6 <= m.rounds <= 9 and m.rounds == len(m.extra["times_ms"])
    finally:
        runner.close()


def test_run_problem_times_on_cpu_and_refuses_what_cpu_cannot_do():
    from ficco.execute import run_problem
    from ficco.problem import Problem
    from ficco.space import Schedule
    from ficco.sweep import CpuRunner

    problem = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32")
    options = RunOptions(timing=TimingOptions(rounds=2, warmup=0))
    got = run_problem(problem, [Schedule()], backend="cpu", options=options)
    assert [r.schedule for r in got] == ["serial/nccl/cublas", "gemm_alone", "comm_alone"]
    assert all(r.ok and r.rounds == 2 and r.median_ms > 0 for r in got)
    (verified,) = run_problem(problem, [Schedule()], backend="cpu")  # no timing: verify
    assert verified.ok and verified.rounds == 0
    with pytest.raises(ValueError, match="backend: must be one of cpu, cuda, .*got 'tpu'"):
        run_problem(problem, [Schedule()], backend="tpu")
    with pytest.raises(ValueError, match="signatures: the cpu backend times no per-task spans"):
        CpuRunner(RunOptions(timing=TimingOptions(signatures=True)))


def _ranks_clock_rank(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import time

    import torch
    import torch.distributed as dist

    from ficco.execute.timing import RanksClock

    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    order: list[str] = []

    def step(name: str, ms: float):
        def run() -> None:
            order.append(name)
            time.sleep(ms / 1e3)

        return run

    try:
        # rank 1's "slow" takes 40 ms, rank 0's 1 ms: every rank's sample is the max
        fns = {"slow": step("slow", 40.0 if rank == 1 else 1.0), "fast": step("fast", 1.0)}
        got = time_rounds(
            fns, TimingOptions(warmup=1, rounds=3), RanksClock(torch.device("cpu")), "synced",
            rotate=True,
        )  # fmt: skip
        with open(f"{out_dir}/{rank}.json", "w") as f:
            json.dump({"samples": got, "order": order}, f)
    finally:
        dist.destroy_process_group()


def test_ranks_clock_gives_every_rank_the_slowest_ranks_sample_in_rotated_rounds(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.start_processes(
        _ranks_clock_rank,
        args=(world, str(tmp_path / "store"), str(tmp_path)),
        nprocs=world,
        start_method="forkserver",
    )
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    assert ranks[0]["samples"] == ranks[1]["samples"]  # the max across ranks, on each
    samples = ranks[0]["samples"]
    assert len(samples["slow"]) == len(samples["fast"]) == 3
    assert min(samples["slow"]) >= 40.0 > max(samples["fast"])
    # one untimed call each, then rounds starting at the next candidate each time
    assert ranks[0]["order"] == ["slow", "fast", "slow", "fast", "fast", "slow", "slow", "fast"]
