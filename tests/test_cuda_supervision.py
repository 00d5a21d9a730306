"""The GPU runner's supervision, driven on CPU with stand-in rank processes: a problem that
hangs or crashes is recorded and fresh workers go on with the rest."""

import os
import time

import pytest

from ficco.execute import RunOptions, TimingOptions
from ficco.execute.pool import PoolFailure
from ficco.execute.run import backend_pool, measure_in
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import Verdict


def fake_rank(rank, world, init_file, conn, backend, options):
    """Stands in for a GPU rank (``ficco.execute.rank.serve``): m=32 hangs, m=48 kills its
    process, m=96 answers and then dies (a CUDA error raised in a destructor), others
    succeed."""
    if rank == 0:
        conn.send(("ready", None, {"phase": "init", "name": "fake"}))
    while (message := conn.recv()) is not None:
        tag, job = message
        m = job.problem.m
        name = str(job.schedules[0])
        if rank == 0:
            conn.send(("progress", tag, {"phase": "verified", "name": name}))
        if m == 32:
            time.sleep(3600)
        if m == 48:
            os._exit(3)
        if rank == 0:
            done = Measurement(problem=job.problem.to_dict(), name=name, median_ms=float(m))
            conn.send(("done", tag, [done]))
        if m == 96:
            time.sleep(0.5)  # dies after its answer, before the next job arrives
            os._exit(4)


def run_jobs(jobs, options, on_progress=None, on_result=None):
    """Each problem in turn in one pool of stand-in ranks, as a sweep's runner keeps one:
    per problem its measurements, or the :class:`PoolFailure` it ended in."""
    out = []
    with backend_pool("cuda", 2, options, body=fake_rank) as pool:
        for index, (problem, schedules) in enumerate(jobs):
            progress = (lambda msg, i=index: on_progress(i, msg)) if on_progress else None
            got = measure_in(pool, problem, schedules, options.timing, progress)
            out.append(got)
            if on_result and not isinstance(got, PoolFailure):
                on_result(index, got)
    return out


def test_hang_and_crash_are_recorded_and_the_run_goes_on():
    sizes = [16, 32, 64, 48, 80]
    jobs = [
        (Problem(pattern="ag_gemm", m=m, n=8, k=8, world=2), [Schedule.parse("shard/ce/cublas")])
        for m in sizes
    ]
    progress, finished = [], []
    out = run_jobs(
        jobs,
        RunOptions(timeout_s=3, startup_s=60, timing=TimingOptions()),
        on_progress=lambda i, msg: progress.append(i),
        on_result=lambda i, ms: finished.append(i),
    )
    assert [o[0].median_ms for o in out if isinstance(o, list)] == [16.0, 64.0, 80.0]
    assert out[1].verdict is Verdict.TIMEOUT and out[3].verdict is Verdict.ERROR
    assert str(out[1]).startswith("timeout: no progress for 3 s after verified shard/ce/cublas")
    assert str(out[3]).startswith("error: rank process exited with code 3")
    assert finished == [0, 2, 4]
    assert set(progress) == {0, 1, 2, 3, 4}


def test_a_rank_that_dies_after_answering_is_replaced_before_the_next_problem():
    jobs = [
        (Problem(pattern="ag_gemm", m=m, n=8, k=8, world=2), [Schedule.parse("shard/ce/cublas")])
        for m in (96, 16, 96, 64)
    ]

    def slow_caller(i, ms):
        time.sleep(1.0)  # the dying rank is gone before the next problem is sent

    options = RunOptions(timeout_s=5, startup_s=60, timing=TimingOptions())
    out = run_jobs(jobs, options, on_result=slow_caller)
    assert [o[0].median_ms for o in out] == [96.0, 16.0, 96.0, 64.0]


def test_run_cuda_without_gpus_names_what_is_missing():
    import torch
    from click.testing import CliRunner

    from ficco.cli import main

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    args = ["run", "ag_gemm", "--m", "64", "--n", "32", "--k", "32", "-w", "2"]
    args += ["--backend", "cuda", "-s", "shard/ce/cublas"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "the cuda backend needs 2 GPUs" in result.output
    bad = CliRunner().invoke(main, [*args, "--rounds", "0"])
    assert bad.exit_code == 2 and "--rounds: needs at least 1 round" in bad.output


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rounds", 0, "rounds: needs at least 1 round, got 0"),
        ("graphs", "some", "graphs: one of all, ce, none; got 'some'"),
        ("issue", "eager", "issue: .*each entry must be one of"),
    ],
)
def test_bad_timing_options_name_the_field(field, value, message):
    from ficco.sweep.runners import CudaRunner

    with pytest.raises(ValueError, match=message):  # refused before any GPU is looked for
        CudaRunner(RunOptions(timing=TimingOptions(**{field: value})))
    with pytest.raises(ValueError, match="issue: \\['eager'\\]"):
        TimingOptions(issue=["queued", "eager"])
    with pytest.raises(ValueError, match="issue: empty"):
        TimingOptions(issue=[])
