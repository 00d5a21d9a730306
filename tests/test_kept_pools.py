"""Inside ``kept_pools`` a run reuses the ranks of an earlier run of the same kind; outside,
every run starts its own (and closes them)."""

from ficco.execute import run as run_module
from ficco.execute.run import kept_pools, run_problem
from ficco.problem import Problem
from ficco.space import Schedule

PROBLEM = Problem(pattern="gemm_rs", m=32, n=16, k=16, world=2, dtype="fp32")
SCHEDULE = Schedule.parse("finer-c2-m/ce/cublas")


def test_kept_pools_reuse_ranks_per_world_and_environment_and_close_them(monkeypatch):
    """Reused across runs of one world and environment (the user directory aside: no rank
    reads it); another environment starts other ranks; the least recently used pool beyond
    ``KEPT_POOLS`` is closed, and every one at the end."""
    made = []
    real = run_module.backend_pool

    def counting(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(run_module, "backend_pool", counting)
    with kept_pools():
        for _ in range(2):
            assert run_problem(PROBLEM, [SCHEDULE], backend="cpu")[0].ok
        assert len(made) == 1  # the second run found the first one's ranks
        monkeypatch.setenv("FICCO_HOME", "/nonexistent/ficco-home")  # read by the parent only
        assert run_problem(PROBLEM, [SCHEDULE], backend="cpu")[0].ok
        assert len(made) == 1
        pids = [p.pid for p in made[0]._procs]
        monkeypatch.setenv("FICCO_KEPT_POOLS_TEST", "1")  # ranks see the environment they start in
        assert run_problem(PROBLEM, [SCHEDULE], backend="cpu")[0].ok
        assert len(made) == 2 and [p.pid for p in made[0]._procs] == pids
        monkeypatch.setattr(run_module, "KEPT_POOLS", 1)
        assert run_problem(PROBLEM, [SCHEDULE], backend="cpu")[0].ok  # the second pool again
        assert len(made) == 2 and not made[0]._procs and made[1]._procs  # the older closed
    assert all(not pool._procs for pool in made)  # closed at the end
    run_module._kept, outer = None, run_module._kept  # no kept pools: the run's own pool
    try:
        assert run_problem(PROBLEM, [SCHEDULE], backend="cpu")[0].ok
    finally:
        run_module._kept = outer
    assert len(made) == 3 and not made[-1]._procs  # started for the run, closed after it
