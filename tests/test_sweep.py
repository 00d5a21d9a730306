import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from synthetic import write_synthetic_store

from ficco.cli import main
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile import MemoryStore, ProfileStore, load_frame
from ficco.space import Gemm, Schedule, SpaceOptions, enumerate_schedules, is_legal
from ficco.sweep import (
    STRATEGIES,
    BackendUnavailable,
    CudaRunner,
    ReplayRunner,
    Runner,
    SweepOptions,
    get_strategy,
    sweep,
)

TINY_CSV = (
    "name,pattern,m,n,k,world,dtype,experts\n"
    "tiny.qkv,ag_gemm,32,16,16,2,fp32,\n"
    "tiny.out,gemm_rs,32,16,16,2,fp32,\n"
)
# W=4 so the order axis is open; chunk counts kept small so the store stays small
SMALL_SPACE = SpaceOptions(chunk_counts=(2, 4), sm_reserves=(0, 16))
REPLAYED = [
    Problem(pattern="ag_gemm", m=4096, n=1280, k=8192, world=4, dtype="bf16", name="toy.qkv"),
    Problem(pattern="gemm_rs", m=4096, n=8192, k=1024, world=4, dtype="bf16", name="toy.out"),
]


def records(store_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (store_dir / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def replay_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("replayed") / "store"
    write_synthetic_store(path, REPLAYED, SMALL_SPACE)
    return path


def test_sweep_killed_with_sigkill_resumes_without_duplicates_or_losses(tmp_path):
    shapes = tmp_path / "tiny.csv"
    shapes.write_text(TINY_CSV)
    store_dir = tmp_path / "store"
    args = [
        "sweep",
        "--shapes",
        str(shapes),
        "--backend",
        "cpu",
        "--store",
        str(store_dir),
        "--limit-schedules",
        "4",
        "--gemm",
        "cublas",
        "--rounds",
        "1",
    ]
    code = "import sys; from ficco.cli import main; sys.argv[0] = 'ficco'; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its rank processes share the group and die with it
    )
    log = store_dir / "records.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.stat().st_size:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = log.read_text()
    complete = [line for line in before.splitlines(keepends=True) if line.endswith("\n")]
    expected = 2 * (4 + 2)  # 2 problems x (4 schedules + gemm_alone + comm_alone)
    assert 1 <= len(complete) < expected, "the kill should land partway through the sweep"

    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    after = records(store_dir)
    pairs = Counter((r["problem_key"], r["name"]) for r in after)
    assert len(pairs) == expected and set(pairs.values()) == {1}
    assert log.read_text().startswith("".join(complete))  # nothing recorded before was lost
    frame = load_frame(store_dir)
    assert len(frame) == expected
    assert set(frame["problem_name"]) == {"tiny.qkv", "tiny.out"}
    assert (frame["verdict"] == "ok").all()
    assert frame["t_gemm_ms"].notna().all() and frame["backend"].eq("cpu").all()
    summary = json.loads(result.stdout)
    assert summary["measured"] + summary["reused"] == 8

    again = CliRunner().invoke(main, [*args, "--json"])
    assert json.loads(again.stdout)["measured"] == 0
    assert len(records(store_dir)) == expected


def test_exhaustive_replay_records_failures_and_goes_on(replay_store):
    runner = ReplayRunner(replay_store)
    store = MemoryStore(runner.fingerprint())
    result = sweep(REPLAYED, runner=runner, store=store, space=SMALL_SPACE)
    source = ProfileStore.read(replay_store)
    assert len(store) == len(source)
    failed = [m for m in store.measurements() if m.verdict != "ok"]
    assert failed and all(m.verdict == "unavailable" for m in failed)
    for outcome in result.outcomes:
        assert outcome.best is not None and outcome.failed > 0
        assert outcome.measured == outcome.candidates
    rerun = sweep(REPLAYED, runner=runner, store=store, space=SMALL_SPACE)
    assert sum(o.measured for o in rerun.outcomes) == 0


class FlakyRunner(Runner):
    """Replays a store, but the whole run of one problem fails (a crashed process group)."""

    backend = "flaky"

    def __init__(self, store_dir, broken_key):
        self.inner = ReplayRunner(store_dir)
        self.broken_key = broken_key

    def fingerprint(self):
        return self.inner.fingerprint()

    def restrict(self, problem, schedules):
        return self.inner.restrict(problem, schedules)

    def measure(self, problem, schedules, on_result=None):
        if problem.key == self.broken_key:
            raise RuntimeError("process group died")
        return self.inner.measure(problem, schedules, on_result)

    def baselines(self, problem):
        return self.inner.baselines(problem)


@pytest.mark.parametrize("strategy", ["exhaustive", "optuna"])
def test_a_failed_run_leaves_its_problem_unrecorded_and_the_sweep_goes_on(replay_store, strategy):
    runner = FlakyRunner(replay_store, REPLAYED[0].key)
    store = MemoryStore(runner.fingerprint())
    with pytest.warns(RuntimeWarning, match="process group died"):
        result = sweep(REPLAYED, runner=runner, store=store, space=SMALL_SPACE, strategy=strategy)
    assert result.outcomes[0].measured == 0 and result.outcomes[1].best is not None
    assert not [m for m in store.measurements(REPLAYED[0].key) if m.kind == "schedule"]


def test_optuna_over_replay_measures_a_share_and_finds_a_good_schedule(replay_store, tmp_path):
    runner = ReplayRunner(replay_store)
    store = ProfileStore.open(tmp_path / "opt", runner.fingerprint())
    options = SweepOptions(trials=12, batch=3, seed=1)
    result = sweep(
        REPLAYED, runner=runner, store=store, strategy="optuna", space=SMALL_SPACE, options=options
    )
    source = ProfileStore.read(replay_store)
    for problem, outcome in zip(REPLAYED, result.outcomes, strict=True):
        mine = [m for m in store.measurements(problem.key) if m.kind == "schedule"]
        assert len(mine) == 12 == len({m.name for m in mine})
        assert "serial/nccl/cublas" in {m.name for m in mine}  # enqueued first
        assert outcome.best is not None and outcome.candidates > 60
        ranks = sorted(m.median_ms for m in source.measurements(problem.key) if m.verdict == "ok")
        assert outcome.best.median_ms <= ranks[len(ranks) // 4]  # top quarter at 12/~100
    assert (tmp_path / "opt" / "optuna.journal").exists()


def sweep_one_with_optuna(runner, problem, store_dir, **options):
    with ProfileStore.open(store_dir, runner.fingerprint()) as store:
        return sweep(
            [problem],
            runner=runner,
            store=store,
            strategy="optuna",
            space=SMALL_SPACE,
            options=SweepOptions(batch=2, **options),
        )


def only_study(journal_path):
    """The one optuna study a journal file holds."""
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal_path))
    )
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def test_optuna_journal_resumes_the_study(replay_store, tmp_path):
    runner = ReplayRunner(replay_store)
    problem = REPLAYED[0]
    sweep_one_with_optuna(runner, problem, tmp_path / "opt", trials=6)
    study = only_study(tmp_path / "opt" / "optuna.journal")
    first = len(study.trials)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done and all("schedule" in t.user_attrs and "verdict" in t.user_attrs for t in done)
    assert all(is_legal(problem, Schedule.parse(t.user_attrs["schedule"])) for t in study.trials)

    calls = runner.calls
    result = sweep_one_with_optuna(runner, problem, tmp_path / "opt", trials=10)
    assert runner.calls - calls == 4 and result.outcomes[0].reused == 6
    assert len(only_study(tmp_path / "opt" / "optuna.journal").trials) > first
    names = [r["name"] for r in records(tmp_path / "opt") if r["kind"] == "schedule"]
    assert len(names) == 10 == len(set(names))


class InterruptingRunner(ReplayRunner):
    """Replays, then raises KeyboardInterrupt once ``limit`` schedules were served."""

    def __init__(self, store_dir, limit):
        super().__init__(store_dir)
        self.limit = limit

    def measure(self, problem, schedules, on_result=None):
        out = []
        for schedule in schedules:
            if self.calls >= self.limit:
                raise KeyboardInterrupt
            out += super().measure(problem, [schedule], on_result)
        return out


def test_interrupted_optuna_sweep_resumes_to_its_budget(replay_store, tmp_path):
    options = dict(strategy="optuna", space=SMALL_SPACE)
    runner = InterruptingRunner(replay_store, limit=7)
    with (
        ProfileStore.open(tmp_path / "opt", runner.fingerprint()) as store,
        pytest.raises(KeyboardInterrupt),
    ):
        sweep(REPLAYED, runner=runner, store=store, options=SweepOptions(trials=5), **options)
    assert len([r for r in records(tmp_path / "opt") if r["kind"] == "schedule"]) == 7
    runner = ReplayRunner(replay_store)
    with ProfileStore.open(tmp_path / "opt", runner.fingerprint()) as store:
        sweep(REPLAYED, runner=runner, store=store, options=SweepOptions(trials=5), **options)
    pairs = Counter((r["problem_key"], r["name"]) for r in records(tmp_path / "opt"))
    assert set(pairs.values()) == {1}
    per_problem = Counter(key for key, name in pairs if "/" in name)
    assert per_problem == {p.key: 5 for p in REPLAYED}


def test_strategy_table_and_backends():
    assert set(STRATEGIES) == {"exhaustive", "optuna"}
    assert callable(get_strategy("optuna"))
    with pytest.raises(ValueError, match="strategy: unknown strategy 'grid'"):
        get_strategy("grid")
    from ficco.backends import backend_spec
    from ficco.execute.options import RunOptions, TimingOptions
    from ficco.sweep import CpuRunner, make_runner

    cpu = make_runner("cpu")
    assert isinstance(cpu, CpuRunner) and cpu.options.timing.rounds == 3
    assert cpu.options.timeout_s == 120 and cpu.spec is backend_spec("cpu")
    auto = make_runner(backend_spec("cpu"), RunOptions(timing=TimingOptions(rounds="auto")))
    assert auto.options.timing.auto
    # a runner times what it verifies: options without timing take the backend's
    assert make_runner("cpu", RunOptions(seed=5)).options.timing == backend_spec("cpu").timing
    with pytest.raises(ValueError, match="backend: must be one of cpu, cuda, .*got 'tpu'"):
        make_runner("tpu")
    import torch

    if torch.cuda.is_available():
        timing = TimingOptions(rounds="auto", issue=("synced",))
        cuda = make_runner("cuda", RunOptions(timing=timing))
        assert isinstance(cuda, CudaRunner) and cuda.options.timing.issue == ("synced",)
    else:
        with pytest.raises(BackendUnavailable, match="needs CUDA GPUs"):
            CudaRunner()
        result = CliRunner().invoke(
            main, ["sweep", "--workloads", "llama3-8b", "-w", "2", "--store", "/nonexistent"]
        )
        assert result.exit_code == 1 and "needs CUDA GPUs" in result.output


def test_sweep_cli_usage_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["sweep", "--workloads", "llama3-8b", "--store", str(tmp_path)])
    assert result.exit_code == 2 and "--world" in result.output
    result = runner.invoke(main, ["sweep", "--store", str(tmp_path), "-w", "2"])
    assert result.exit_code == 2 and "--shapes" in result.output
    result = runner.invoke(
        main, ["sweep", "--workloads", "llama9", "-w", "2", "--store", str(tmp_path)]
    )
    assert result.exit_code == 2 and "llama9" in result.output
    # several models after one flag: the second is read (and refused) as one of them
    result = runner.invoke(
        main, ["sweep", "--workloads", "llama3-8b", "llama9", "-w", "2", "--store", str(tmp_path)]
    )
    assert result.exit_code == 2 and "unknown model(s) ['llama9']" in result.output


def test_sweep_refuses_a_store_of_another_machine(replay_store, tmp_path):
    shapes = tmp_path / "tiny.csv"
    shapes.write_text(TINY_CSV)
    result = CliRunner().invoke(
        main, ["sweep", "--shapes", str(shapes), "--backend", "cpu", "--store", str(replay_store)]
    )
    assert result.exit_code == 1
    assert "backend: 'synthetic' (store) vs 'cpu' (this run)" in result.output


def test_comparison_script_prints_the_two_figures_last(replay_store, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import optuna_vs_exhaustive
    finally:
        sys.path.pop(0)
    optuna_vs_exhaustive.main(["--store", str(replay_store)])
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert last[0].startswith("within 2% of the exhaustive best: ")
    assert last[1].startswith("trials used: ") and last[1].endswith("of exhaustive")
    used = last[1].split("=")[1].split("%")[0]
    assert float(used) <= 30.0


def test_measurements_are_recorded_under_the_problem_name(replay_store):
    runner = ReplayRunner(replay_store)
    store = MemoryStore(runner.fingerprint())
    named = Problem(**{**REPLAYED[1].to_dict(), "name": "other.out"})
    sweep(
        [named],
        runner=runner,
        store=store,
        space=SMALL_SPACE,
        options=SweepOptions(limit_schedules=3),
    )
    assert {m.problem["name"] for m in store.measurements()} == {"other.out"}
    assert all(isinstance(m, Measurement) for m in store.measurements())


def test_cuda_runner_keeps_the_baselines_run_cuda_measures_with_the_schedules(monkeypatch):
    calls = []

    def fake_measure_in(self, pool, problem, schedules, timing, *, baselines):
        assert pool is not None and pool.world == problem.world  # one pool across problems
        calls.append([str(s) for s in schedules])
        p = problem.to_dict()
        out = [Measurement(problem=p, name=str(s), median_ms=1.0) for s in schedules]
        return out + [
            Measurement(problem=p, name=n, kind="baseline", median_ms=0.5)
            for n in ("gemm_alone", "comm_alone", "async_tp")
            if baselines
        ]

    import torch

    monkeypatch.setattr(CudaRunner, "_measure_in", fake_measure_in)
    monkeypatch.setattr(CudaRunner, "_check_available", staticmethod(lambda: None))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    runner = CudaRunner()
    with pytest.raises(BackendUnavailable, match="world=4 need 4 GPUs"):
        sweep([REPLAYED[0]], runner=runner, store=MemoryStore())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    store = MemoryStore({"backend": "cuda"})
    problem = REPLAYED[0]
    sweep([problem], runner=runner, store=store, options=SweepOptions(limit_schedules=3))
    names = Counter(m.name for m in store.measurements())
    assert set(names.values()) == {1} and len(names) == 3 + 3
    assert len(calls) == 1  # the baselines came from the schedules' run
    assert runner.baselines(REPLAYED[1]) and calls[-1] == []  # measured alone when needed


def test_time_limit_leaves_the_rest_for_a_rerun(replay_store):
    runner = ReplayRunner(replay_store)
    store = MemoryStore(runner.fingerprint())
    first = sweep(
        REPLAYED,
        runner=runner,
        store=store,
        space=SMALL_SPACE,
        options=SweepOptions(time_limit_s=0.0),
    )
    assert first.outcomes == [] and first.skipped == len(REPLAYED) and len(store) == 0
    assert first.to_dict()["skipped_for_time"] == len(REPLAYED)
    rest = sweep(REPLAYED, runner=runner, store=store, space=SMALL_SPACE)
    assert rest.skipped == 0 and len(rest.outcomes) == len(REPLAYED) and len(store) > 0
    with pytest.raises(ValueError, match="time_limit_s: must be >= 0"):
        SweepOptions(time_limit_s=-1)


def test_issue_mode_of_stored_records():
    from ficco.sweep import issue_of

    assert issue_of({"extra": {}}) == "queued"  # stored before the modes existed
    assert issue_of({"extra": {"issue": {"synced": {}, "queued": {}}}}) == "synced"
    assert issue_of({"extra": {"issue": {"queued": {}}}}) == "queued"


def test_cpu_sweep_of_large_shapes_warns_that_triton_is_interpreted(tmp_path):
    args = ["sweep", "--workloads", "llama3-8b", "-w", "2", "-t", "64", "--backend", "cpu"]
    args += ["--store", str(tmp_path / "s"), "--time-limit", "0"]
    runner = CliRunner()
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Triton's interpreter" in result.output and "--gemm cublas" in result.output
    result = runner.invoke(main, [*args, "--gemm", "cublas"])
    assert result.exit_code == 0 and "interpreter" not in result.output


def test_two_machines_share_their_optuna_studies_through_one_journal(replay_store, tmp_path):
    """Each machine keeps its own store and budget; the study of a problem, named by the
    machine kind's fingerprint and the problem, holds the trials of both."""
    journal = tmp_path / "shared.journal"
    problem = REPLAYED[0]
    for machine in ("a", "b"):
        runner = ReplayRunner(replay_store)
        sweep_one_with_optuna(runner, problem, tmp_path / machine, trials=6, journal=journal)
        mine = [r for r in records(tmp_path / machine) if r["kind"] == "schedule"]
        assert len(mine) == 6 == len({r["name"] for r in mine})
        assert not (tmp_path / machine / "optuna.journal").exists()
    study = only_study(journal)
    assert problem.key in study.study_name
    # the six measurements of each machine are trials of the one study (a sampled schedule
    # another trial already measured, or one the replay lacks, is a trial too)
    told = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(study.trials) >= 12 and len(told) >= 6


def test_sweep_cli_writes_the_journal_it_is_given(tmp_path):
    shapes = tmp_path / "tiny.csv"
    shapes.write_text(TINY_CSV.splitlines()[0] + "\n" + TINY_CSV.splitlines()[1] + "\n")
    journal = tmp_path / "elsewhere" / "studies.journal"
    journal.parent.mkdir()
    args = ["sweep", "--shapes", str(shapes), "--backend", "cpu", "--store", str(tmp_path / "s")]
    args += ["--strategy", "optuna", "--trials", "2", "--gemm", "cublas", "--rounds", "1"]
    result = CliRunner().invoke(main, [*args, "--journal", str(journal), "--json"])
    assert result.exit_code == 0, result.output
    assert journal.stat().st_size > 0 and not (tmp_path / "s" / "optuna.journal").exists()


def test_the_gpu_runner_names_its_issue_mode_for_the_store_guard():
    """The store guard asks the runner: a runner whose issue mode reads None would let a
    queued sweep append to a synced store unchecked."""
    from ficco.execute.options import RunOptions, TimingOptions
    from ficco.sweep.runners import CpuRunner, CudaRunner

    timing = TimingOptions(issue=("synced", "queued"))
    runner = CudaRunner.__new__(CudaRunner)  # no GPUs here: skip its availability check
    super(CudaRunner, runner).__init__(RunOptions(seed=0, timeout_s=10.0, timing=timing))
    assert runner.issue_mode == "synced"
    assert CpuRunner(RunOptions(seed=0, timeout_s=10.0)).issue_mode is None


def test_cpu_sweep_of_gemm_ar_records_ok_verdicts(tmp_path):
    """The sweep covers gemm_ar: every schedule of a decode row (M = 1: column chunks only)
    and of an M not divisible by W (no rs_ag), plus rs_ag where W divides M."""
    shapes = tmp_path / "shapes.csv"
    shapes.write_text(
        "pattern,m,n,k,world,dtype,experts,name\n"
        "gemm_ar,1,64,32,2,fp32,,tiny.out\n"
        "gemm_ar,6,64,32,2,fp32,,tiny.fc2\n"
    )
    store = tmp_path / "s"
    args = ["sweep", "--shapes", str(shapes), "--backend", "cpu", "--gemm", "cublas"]
    args += ["--chunks", "2", "--rounds", "1", "--store", str(store)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    got = [r for r in records(store) if r["kind"] == "schedule"]
    by_m = Counter(r["problem"]["m"] for r in got)
    space = SpaceOptions(gemms=(Gemm.CUBLAS,), chunk_counts=(2,))
    for m in (1, 6):
        p = Problem(pattern="gemm_ar", m=m, n=64, k=32, world=2, dtype="fp32")
        assert by_m[m] == len(list(enumerate_schedules(p, space)))
    assert {r["verdict"] for r in got} == {"ok"}
    assert any(r["name"].endswith("+rs_ag") for r in got)
