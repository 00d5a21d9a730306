"""GPU tests say how many GPUs they need once, as ``pytest.mark.gpus(n, why=...)``; this skips
them, naming the count and why, on a machine with fewer (or without CUDA).

Tests that run plans on W ranks take the ``lane`` fixture: each runs on ``cuda`` (one GPU per
rank, W = 2) and on ``cuda_shared`` (W ranks that share one GPU, ``ficco.execute.cuda_shared``:
verification only) at every W of ``FICCO_SHARED_WORLDS`` (default ``2 4``). Each lane's rank
pool is started once and kept for the session.
"""

import os
from dataclasses import dataclass

import pytest

#: the world sizes of the one-GPU lane
SHARED_WORLDS = tuple(int(w) for w in os.environ.get("FICCO_SHARED_WORLDS", "2 4").split())
LANES = (("cuda", 2), *(("cuda_shared", w) for w in SHARED_WORLDS))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpus(n, why=''): needs at least n CUDA GPUs (skipped otherwise, saying why)"
    )


def gpu_count() -> int:
    torch = pytest.importorskip("torch")
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpus")
    if marker is None:
        return
    need = marker.args[0] if marker.args else 1
    have = gpu_count()
    if have < need:
        why = marker.kwargs.get("why")
        pytest.skip(
            f"needs {need} GPU{'s' if need > 1 else ''}, found {have}" + (f": {why}" if why else "")
        )


@dataclass
class Lane:
    """Where a test's ranks run: ``backend`` 'cuda' or 'cuda_shared', ``world`` ranks."""

    backend: str
    world: int
    pool: object

    @property
    def shared(self) -> bool:
        """Ranks share a GPU: verdicts count, timings mean nothing."""
        return self.backend == "cuda_shared"

    def run(self, problem, schedules, options):
        """The measurements of ``schedules`` and the baselines, timed as ``options`` say."""
        from ficco.execute.pool import PoolFailure
        from ficco.execute.run import measure_in

        got = measure_in(self.pool, problem, schedules, options.timing)
        assert not isinstance(got, PoolFailure), f"{self.backend} run of {problem.key}: {got}"
        return got


@pytest.fixture(scope="session")
def lane_pools():
    pools: dict = {}
    yield pools
    for pool in pools.values():
        pool.close()


@pytest.fixture(params=LANES, ids=[f"{b}-w{w}" for b, w in LANES])
def lane(request, lane_pools):
    from ficco.execute import RunOptions, backend_pool

    backend, world = request.param
    need = world if backend == "cuda" else 1
    have = gpu_count()
    if have < need:
        pytest.skip(f"{backend} at W = {world} needs {need} GPU{'s' * (need > 1)}, found {have}")
    key = (backend, world)
    if key not in lane_pools:
        lane_pools[key] = backend_pool(backend, world, RunOptions(timeout_s=120))
    return Lane(backend, world, lane_pools[key])
