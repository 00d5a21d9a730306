"""scripts/copy_fixed_cost.py's arithmetic on CPU: the weighted fit recovers a known fixed cost
and rate, and the crossover is the smallest size at which the kernel stops winning."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "copy_fixed_cost.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("copy_fixed_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_recovers_fixed_cost_and_rate(script):
    # t_us = 12 + bytes / (400 GB/s): 400e9 B/s = 4e5 B/us
    points = [(n, 12.0 + n / 4e5) for n in script.SIZES]
    fit = script.fit_fixed_cost(points)
    assert fit["fixed_us"] == pytest.approx(12.0, rel=1e-9)
    assert fit["gbps"] == pytest.approx(400.0, rel=1e-9)


def test_summary_divides_by_count_and_finds_the_crossover(script):
    rows = []
    for n in script.SIZES:
        eager = 4 * (10.0 + n / 4e5)  # 4 copies of 10 us each
        kernel = 6.0 + 4 * n / 2e5  # one launch, half the rate
        rows.append(
            {
                "count": 4,
                "segment_bytes": n,
                "total_bytes": 4 * n,
                "eager": {"median_us": eager},
                "kernel": {"median_us": kernel},
                "graph": {"failure": "unavailable: test"},
            }
        )
    (entry,) = script.summarize(rows, (4,))
    assert entry["fixed_us_per_copy"]["eager"] == pytest.approx(10.0, rel=1e-6)
    assert entry["fixed_us_per_copy"]["kernel"] == pytest.approx(1.5, rel=1e-6)
    # kernel < eager while 6 + 2e-5 n < 40 + 1e-5 n, i.e. n < 3.4e6: wins up to 1 MiB
    assert entry["kernel_beats_eager_below_bytes"] == 4 << 20
    assert max(entry["kernel_beats_eager_at"]) == 1 << 20
    assert "graph" not in entry["fixed_us_per_copy"]


def test_the_graphed_kernel_is_summarized_against_both_rivals(script):
    assert "kernel_graph" in script.METHODS
    rows = []
    for n in script.SIZES:
        rows.append(
            {
                "count": 16,
                "segment_bytes": n,
                "total_bytes": 16 * n,
                "eager": {"median_us": 16 * (10.0 + n / 4e5)},
                "graph": {"median_us": 10.0 + 16 * (1.0 + n / 4e5)},  # 1 us per extra copy
                "kernel": {"median_us": 30.0 + 16 * n / 3e5},
                "kernel_graph": {"median_us": 10.0 + 16 * n / 3e5},  # one launch, slower rate
            }
        )
    (entry,) = script.summarize(rows, (16,))
    assert entry["fixed_us_per_copy"]["kernel_graph"] == pytest.approx(10.0 / 16, rel=1e-6)
    # graphed kernel < graph while 16 n (1/3e5 - 1/4e5) < 16, i.e. n < 1.2e6: up to 1 MiB
    assert entry["kernel_graph_beats_graph_at"] == [n for n in script.SIZES if n <= 1 << 20]
    assert entry["kernel_graph_beats_graph_below_bytes"] == 4 << 20
    assert entry["kernel_beats_graph_at"] == []  # the eager launch's 30 us never pays off here
