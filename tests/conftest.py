import os
import sys

import pytest

# Bytecode files are written even where the environment asks for none (PYTHONDONTWRITEBYTECODE):
# the suite starts hundreds of Python processes (ranks, CLI calls, scripts), and without them
# each compiles ficco again and each worker re-rewrites every test module's asserts (about
# 8 s of CPU a worker). They go to __pycache__ (ignored by git); the processes started later
# read them whatever the variable says.
sys.dont_write_bytecode = False

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
    # of each importing it again (seconds of CPU per rank). torch._dynamo too: the first call
    # of a torch.library custom op (every ficco op) imports it, about 2.7 s of CPU per rank.
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])
    # xdist >= 3.8 hands out files by their test count unless told not to; LONGEST_FIRST
    # (below) is the order wanted. Set here, not in addopts: older xdist lacks the option.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The longest test files, longest first: xdist hands out whole files in collection order
# (loadscopereorder off, pytest_configure), so these start first and the workers finish
# together (the shipped store's family comparison and the help examples that report on it, a
# minute or more each, would otherwise start late). Seconds each on 2 workers, as measured.
LONGEST_FIRST = (
    "test_select.py",  # 98
    "test_execute_cpu.py",  # 105
    "test_cli_help.py",  # 87
    "test_ops.py",  # 68
    "test_store_sql.py",  # 61
    "test_fused.py",  # 34
    "test_bench_block.py",  # 34
    "test_fused_allreduce.py",  # 33
    "test_kernels_fused.py",  # 26
    "test_shipped_profiles.py",  # 25
    "test_kernels_scaled.py",  # 23
    "test_allreduce_symm.py",  # 22
    "test_emb_a2a.py",  # 22
    "test_model_speed.py",  # 20
    "test_seg.py",  # 20
    "test_sweep.py",  # 19
    "test_model_dense.py",  # 19
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


@pytest.fixture(autouse=True)
def _path_and_environment_as_found():
    """Each test leaves ``sys.path`` and ``os.environ`` as it found them. The kept rank pools
    (below) are keyed on both: a test that puts scripts/ on the path, or a variable that
    torch sets (``torch.compile``: TORCHINDUCTOR_CACHE_DIR), would otherwise make every later
    CPU run of its worker start fresh ranks (torch's import again, seconds of CPU each)."""
    path, env = list(sys.path), _environment()
    yield
    if sys.path != path:
        sys.path[:] = path
    now = _environment()
    if now != env:
        for name in now.keys() - env.keys():
            del os.environ[name]
        os.environ.update(env)


def _environment() -> dict[str, str]:
    """``os.environ`` but the variable pytest itself changes from phase to phase."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@pytest.fixture(scope="session", autouse=True)
def _kept_rank_pools():
    """One rank pool per world for every CPU run of the session: each test's run_problem (and
    ficco.run, ficco run, a CPU sweep's single runs) reuses the ranks an earlier test
    started instead of paying process start and torch's import again."""
    from ficco.execute.run import kept_pools

    with kept_pools():
        yield
