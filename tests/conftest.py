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


# The longest test files, longest first: xdist hands out whole files in collection order, so
# these start first and the workers finish together (the shipped store's family comparison and
# optuna replay, and the help examples that report on it, a minute or more each, would
# otherwise start last, alphabetically).
LONGEST_FIRST = (
    "test_select.py",
    "test_execute_cpu.py",
    "test_cli_help.py",
    "test_ops.py",
    "test_store_sql.py",
    "test_shipped_profiles.py",
    "test_model_dense.py",
    "test_sweep.py",
    "test_emb_a2a.py",
)


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: files intact
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
