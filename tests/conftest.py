import os

import pytest

# Kernels run under Triton's interpreter on machines without a GPU. It must be chosen before
# Triton is first imported, so it is set here, before any test module loads.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # Rank processes the tests start themselves (torch.multiprocessing, start method
    # "forkserver") are forked from one server process that has imported torch once, instead
    # of each importing it again (seconds of CPU per rank).
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed"])


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _kept_rank_pools():
    """One rank pool per world for every CPU run of the session: each test's run_cpu (and
    ficco.run, ficco run, a CPU sweep's single runs) reuses the ranks an earlier test
    started instead of paying process start and torch's import again."""
    from ficco.execute.run import kept_pools

    with kept_pools():
        yield
