"""The store's noise floor (``ficco.model.noise``) on a tiny synthetic store."""

from __future__ import annotations

import pytest

from ficco.model.noise import noise_floor, quantiles, split_rel_diffs


def _record(pattern: str, name: str, n: int, times: list[float]) -> dict:
    ordered = sorted(times)
    return {
        "problem": {"pattern": pattern, "m": 1024, "n": n, "k": 4096, "world": 2},
        "name": name,
        "kind": "schedule",
        "verdict": "ok",
        "median_ms": (ordered[(len(times) - 1) // 2] + ordered[len(times) // 2]) / 2,
        "extra": {"times_ms": times},
    }


def test_split_differences_of_a_bimodal_record():
    # 4 fast rounds, then 4 slow ones: the halves disagree by the whole jump, odd/even not
    times = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    halves, odd_even = split_rel_diffs(times)
    assert halves == pytest.approx(1.0 / 1.5)
    assert odd_even == pytest.approx(0.0)
    assert split_rel_diffs([1.0, 2.0, 3.0]) is None  # too few rounds to split


def test_noise_floor_per_group_and_overall():
    records = [
        _record("ag_gemm", "shard/nccl/cublas", 1024, [1.0, 1.0, 1.0, 1.0]),
        _record("ag_gemm", "shard/nccl/cublas", 2048, [2.0, 2.0, 3.0, 3.0]),
        _record("gemm_rs", "shard/ce/cublas", 1024, [4.0, 4.0, 4.0, 4.0]),
    ]
    floor = noise_floor(records, lambda r: r["problem"]["pattern"])
    assert set(floor) == {"ag_gemm", "gemm_rs", "all"}
    ag = floor["ag_gemm"]
    assert ag["records"] == 2
    # halves: 0 for the steady record, |2 - 3| / 2.5 for the drifting one
    assert ag["halves"] == {"n": 2, "median": pytest.approx(0.2), "p90": 0.0}
    # one constant per (pattern, schedule): the median of 1.0 and 2.5, 1.75 for both
    assert ag["const_schedule"]["median"] == pytest.approx((0.75 + 0.3) / 2)
    # per (pattern, schedule, n, k) each record is its own key: no error left
    assert ag["const_schedule_nk"]["median"] == 0.0
    assert floor["all"]["records"] == 3 and floor["gemm_rs"]["const_schedule"]["median"] == 0.0


def test_records_left_out_by_the_grouping_count_nowhere():
    records = [_record("ag_gemm", "serial/nccl/cublas", 1024, [1.0] * 4)]
    assert noise_floor(records, lambda r: None) == {}
    assert quantiles([]) == {"n": 0}
