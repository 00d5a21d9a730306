"""CPU ranks forked from a warm server (``ficco.execute.forkserver``): each sees the
environment its pool started in, a server serves one environment only, a killed or failed
rank reports its exit code as ``Popen`` would, and a dead server is replaced."""

import os
import subprocess
import sys

import pytest

from ficco.backends import backend_spec
from ficco.execute import forkserver
from ficco.execute.pool import RankPool
from ficco.verdict import Verdict

#: a server that imports little starts in a tenth of a second: the supervision tests use it
LIGHT = ("ficco.verdict",)

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no fork here")


def telling_rank(rank, world, init_file, conn, *args):
    """Answers each job with what a forked rank must have: its pid, the variable the test
    set, whether torch was imported before it started, and its parent (the server)."""
    while (message := conn.recv()) is not None:
        tag, _job = message
        if rank == 0:
            seen = {
                "pid": os.getpid(),
                "parent": os.getppid(),
                "marker": os.environ.get("FICCO_FORK_TEST"),
                "torch_preloaded": "torch" in sys.modules,
            }
            conn.send(("done", tag, seen))


def crashing_rank(rank, world, init_file, conn, *args):
    conn.recv()
    os._exit(3)


def ask(pool):
    return pool.run(lambda tag: None, None)


def test_ranks_are_forked_from_one_server_per_environment(monkeypatch):
    monkeypatch.setenv("FICCO_FORK_TEST", "first")
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        first = ask(pool)
        assert all(isinstance(p, forkserver.ForkedRank) for p in pool._procs)
    assert first["marker"] == "first" and not first["torch_preloaded"]
    assert first["parent"] != os.getpid()  # a child of the server, not of this process
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        again = ask(pool)
    assert again["parent"] == first["parent"] and again["pid"] != first["pid"]
    # another environment: another server (a module the server imported may read it)
    monkeypatch.setenv("FICCO_FORK_TEST", "second")
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        second = ask(pool)
    assert second["marker"] == "second" and second["parent"] != first["parent"]
    # a variable no rank reads changes nothing but the rank's own environment
    monkeypatch.setenv("FICCO_HOME", "/nonexistent/ficco-home")
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        assert ask(pool)["parent"] == second["parent"]


def test_a_rank_that_exits_or_is_killed_reports_its_code_and_the_pool_goes_on():
    with RankPool(2, crashing_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        failure = ask(pool)
        assert failure.verdict is Verdict.ERROR and "exited with code 3" in failure.reason
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        before = ask(pool)
        rank = pool._procs[1]
        assert rank.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            rank.wait(timeout=0.1)
        rank.kill()
        assert rank.wait(timeout=10) == -9
        assert ask(pool)["pid"] != before["pid"]  # the next job started fresh ranks


def test_a_dead_server_is_replaced(monkeypatch):
    monkeypatch.setenv("FICCO_FORK_TEST", "replaced")
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        first = ask(pool)
    os.kill(first["parent"], 9)
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=LIGHT) as pool:
        got = ask(pool)
    assert got["marker"] == "replaced" and got["parent"] != first["parent"]


def test_cpu_ranks_start_with_torch_imported():
    """The cpu backend's ranks are forked after the server imported torch (what makes a
    fresh pool start in a fraction of a second instead of ~2 s of CPU per rank)."""
    preload = backend_spec("cpu").preload
    assert "torch" in preload
    with RankPool(2, telling_rank, timeout_s=60, startup_s=60, preload=preload) as pool:
        assert ask(pool)["torch_preloaded"]
