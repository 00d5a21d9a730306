"""GPU tests say how many GPUs they need once, as ``pytest.mark.gpus(n)``; this skips them,
naming the count, on a machine with fewer (or without CUDA)."""

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): needs at least n CUDA GPUs (skipped otherwise)")


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpus")
    if marker is None:
        return
    need = marker.args[0] if marker.args else 1
    torch = pytest.importorskip("torch")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < need:
        pytest.skip(f"needs {need} GPU{'s' if need > 1 else ''}, found {have}")
