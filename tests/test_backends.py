"""Backends as registered specs: found by name, complete, refused twice; their capability
checks run before anything starts; every backend's run returns one result type; a pool's
failure becomes a verdict by its type."""

import dataclasses
import subprocess
import sys

import click
import pytest

import ficco
from ficco import api, backends
from ficco.backends import BackendSpec, backend_names, backend_spec, register_backend
from ficco.execute import run as run_module
from ficco.execute.pool import PoolFailure
from ficco.execute.run import ScheduleResult, run_problem
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.validate import InputError
from ficco.verdict import Verdict

BF16 = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="bf16")
TRITON = Schedule.parse("shard/ce/triton")
CUBLAS = Schedule.parse("shard/ce/cublas")


def spec_like(name: str, **changes) -> BackendSpec:
    fields = {f.name: getattr(backend_spec("cpu"), f.name) for f in dataclasses.fields(BackendSpec)}
    return BackendSpec(**(fields | {"name": name} | changes))


def test_a_spec_is_found_by_name_and_registering_imports_no_torch():
    assert backend_names()[:2] == ("cpu", "cuda")
    cpu, cuda = backend_spec("cpu"), backend_spec("cuda")
    assert (cpu.name, cpu.dtype, cpu.run_timed, cpu.profiles) == ("cpu", "fp32", False, False)
    assert (cuda.name, cuda.dtype, cuda.run_timed, cuda.profiles) == ("cuda", "bf16", True, True)
    assert cpu.timing.rounds == 3 and cuda.timing.rounds == 10 and cuda.timing.signatures
    assert (cpu.gpus(4), cuda.gpus(4)) == (0, 4)
    assert api.default_dtype("cpu") == "fp32" and backends.unprofiled(["cuda", "cpu", "?"]) == [
        "cpu"
    ]
    code = (
        "import sys; from ficco.backends import registry; registry();"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(InputError, match="backend: must be one of cpu, cuda.*got 'tpu'") as err:
        backend_spec("tpu")
    assert err.value.field == "backend"
    with pytest.raises(InputError, match="backend: must be one of cpu, cuda"):
        ficco.run(BF16, [CUBLAS], backend="tpu")


def test_a_duplicate_or_incomplete_spec_is_refused(monkeypatch):
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    with pytest.raises(ValueError, match="backend: 'cpu' is registered twice"):
        register_backend(spec_like("cpu"))
    assert register_backend(backend_spec("cpu")) is backend_spec("cpu")  # the same spec: kept
    with pytest.raises(ValueError, match="check: backend fake needs a callable, got None"):
        spec_like("fake", check=None)
    with pytest.raises(ValueError, match="timing: backend fake needs a TimingOptions"):
        spec_like("fake", timing={"rounds": 3})
    with pytest.raises(ValueError, match="dtype: one of"):
        spec_like("fake", dtype="fp8")
    with pytest.raises(ValueError, match="preload: backend fake needs a tuple of module names"):
        spec_like("fake", preload="torch")  # a string would preload t, o, r, c, h
    with pytest.raises(TypeError, match="setup_rank"):
        BackendSpec(
            **{f.name: 1 for f in dataclasses.fields(BackendSpec) if f.name != "setup_rank"}
        )


def test_a_registered_backend_is_a_cli_choice_and_a_default_source(monkeypatch):
    from ficco.cli.common import backend_option, per_backend

    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    before = backend_names()
    register_backend(spec_like("fake", summary="stands in.", timeout_s=7.0))

    @click.command()
    @backend_option("cpu")
    def command(backend):
        pass

    (option,) = command.params
    assert tuple(option.type.choices) == (*before, "fake") and "fake: stands in." in option.help
    assert per_backend(lambda s: f"{s.timeout_s:g}").startswith("120 cpu, 300 cuda, ")
    assert per_backend(lambda s: f"{s.timeout_s:g}").endswith(", 7 fake")
    assert api.RunRequest(problem=BF16, backend="fake").options.timeout_s == 7.0


def test_the_capability_check_refuses_with_its_reason_before_anything_starts(monkeypatch):
    reason = backend_spec("cpu").check(BF16, TRITON)
    assert "bf16" in reason and backend_spec("cpu").check(BF16, CUBLAS) is None
    assert backend_spec("cuda").check(BF16, TRITON) is None

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool was started for schedules the backend refuses")

    monkeypatch.setattr(run_module, "backend_pool", no_pool)
    seen = []
    (result,) = run_problem(BF16, [TRITON], backend="cpu", on_result=seen.append)
    assert result == ScheduleResult(str(TRITON), Verdict.UNAVAILABLE, detail=reason)
    assert seen == [result]


class _FakePool:
    world = 2

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _failing_measure_in(verdicts: dict[str, str], failure: PoolFailure):
    """A stand-in for ``measure_in``: reports ``verdicts`` as verified, then fails."""

    def measure_in(pool, problem, schedules, timing, on_progress=None, **kwargs):
        for name, verdict in verdicts.items():
            m = Measurement(problem=problem.to_dict(), name=name, verdict=verdict)
            on_progress({"phase": "verified", "name": name, "measurement": m})
        return failure

    return measure_in


@pytest.mark.parametrize("timed", [False, True])
def test_a_pool_failure_becomes_the_verdict_it_carries(monkeypatch, timed):
    from ficco.execute import RunOptions, TimingOptions

    problem = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32")
    ok, wrong, late = (
        Schedule.parse(s) for s in ("serial/nccl/cublas", "shard/ce/cublas", "shard/nccl/cublas")
    )
    hang = PoolFailure(Verdict.TIMEOUT, "no progress for 9 s after verified shard/ce/cublas")
    verified = {str(ok): "ok", str(wrong): "incorrect"}
    monkeypatch.setattr(run_module, "backend_pool", lambda *a, **k: _FakePool())
    monkeypatch.setattr(run_module, "measure_in", _failing_measure_in(verified, hang))
    options = RunOptions(timing=TimingOptions(rounds=1) if timed else None)
    got = run_problem(problem, [ok, wrong, late], backend="cpu", options=options)
    assert all(isinstance(r, ScheduleResult) for r in got)
    verdicts = [r.verdict for r in got]
    # a verified schedule keeps its verdict unless the failure cut its timing short
    assert verdicts == [
        Verdict.TIMEOUT if timed else Verdict.OK,
        Verdict.INCORRECT,
        Verdict.TIMEOUT,
    ]
    assert got[2].detail == str(hang) == "timeout: " + hang.reason
    died = PoolFailure(Verdict.ERROR, "rank process exited with code 3")
    monkeypatch.setattr(run_module, "measure_in", _failing_measure_in({}, died))
    assert {r.verdict for r in run_problem(problem, [ok, late], backend="cpu")} == {Verdict.ERROR}


def test_the_cpu_sweep_records_a_pool_failure_by_its_verdict(monkeypatch):
    from ficco.sweep import CpuRunner

    problem = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="bf16")
    runner = CpuRunner()
    monkeypatch.setattr(runner, "_pool_for", lambda world: _FakePool())
    failure = PoolFailure(Verdict.TIMEOUT, "no progress for 9 s after started")
    monkeypatch.setattr(runner, "_measure_in", lambda *a, **k: failure)
    got = {m.name: m for m in runner.measure(problem, [CUBLAS, TRITON])}
    assert (got[str(CUBLAS)].verdict, got[str(CUBLAS)].detail) == ("timeout", str(failure))
    assert got[str(TRITON)].verdict == "unavailable"  # refused by the spec, never sent


def test_sweep_options_are_frozen():
    from ficco.sweep import SweepObserver, SweepOptions

    options = SweepOptions(observer=SweepObserver())
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.observer = SweepObserver()


def test_run_returns_one_result_type_on_cpu():
    """``ficco.run`` on CPU: a schedule verified by the ranks and one the backend refuses
    come back as the same type, in order; the verify-only run has no timings."""
    results = ficco.run(BF16, [CUBLAS, TRITON], backend="cpu")
    assert [type(r) for r in results] == [ScheduleResult, ScheduleResult]
    (ran, refused) = results
    assert (ran.schedule, ran.verdict, ran.kind) == (str(CUBLAS), Verdict.OK, "schedule")
    assert ran.max_abs_err <= ran.tolerance and not ran.timed and ran.rounds == 0
    assert ran.measurement is not None and ran.measurement.name == str(CUBLAS)
    assert refused.verdict is Verdict.UNAVAILABLE and "bf16" in refused.detail
    assert refused.to_dict()["verdict"] == "unavailable" and "measurement" not in refused.to_dict()


def failing_rank(rank, world, init_file, conn, *args):
    """Stands in for a rank whose job raises outside any schedule (``serve``'s ``failed``)."""
    while (message := conn.recv()) is not None:
        tag, _job = message
        if rank == 0:
            conn.send(("failed", tag, (Verdict.OOM.value, "OutOfMemoryError: 2 GiB")))


def test_a_job_that_raises_fails_with_the_exception_kind():
    from ficco.execute.pool import RankPool

    with RankPool(
        2, failing_rank, (), timeout_s=60, startup_s=60, preload=backend_spec("cpu").preload
    ) as pool:
        got = run_module.measure_in(pool, BF16, [CUBLAS], None)
    assert got == PoolFailure(Verdict.OOM, "OutOfMemoryError: 2 GiB")
    assert str(got) == "oom: OutOfMemoryError: 2 GiB"
