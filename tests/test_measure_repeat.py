"""Repeatability by split rounds (``ficco.measure.repeat``): one cut, and the selector's noise
ceiling and the model's noise floor both take their halves from it."""

import statistics

import pytest

from ficco.measure.repeat import record_rounds, split_medians, split_rounds
from ficco.model.noise import split_rel_diffs
from ficco.select.noise import half_medians

ODD = [1.0, 2.0, 3.0, 4.0, 5.0]


def test_halves_cut_in_time_order_with_the_odd_round_in_the_second():
    assert split_rounds(ODD, "halves") == ([1.0, 2.0], [3.0, 4.0, 5.0])
    assert split_rounds(ODD, "odd_even") == ([1.0, 3.0, 5.0], [2.0, 4.0])
    assert split_medians(ODD, "halves") == (1.5, 4.0)
    assert split_medians(ODD, "odd_even") == (3.0, 3.0)
    assert split_medians([1.0]) is None


def test_an_unknown_split_is_refused_naming_it():
    with pytest.raises(ValueError, match="split: 'thirds'"):
        split_rounds(ODD, "thirds")


def test_record_rounds_reads_the_stored_times():
    assert record_rounds({"extra": {"times_ms": ODD}}) == ODD
    assert record_rounds({"extra": None}) == []
    assert record_rounds({}) == []


@pytest.mark.parametrize("times", [ODD, [0.3, 0.1, 0.2, 0.5], [2.0, 2.1, 1.9, 2.4, 2.2, 2.0, 3.0]])
def test_the_selector_and_the_model_cut_the_rounds_alike(times):
    record = {"name": "x", "median_ms": statistics.median(times), "extra": {"times_ms": times}}
    first, second = split_medians(times, "halves")
    # the selector's noise ceiling: each half's median as the record's
    assert half_medians([record], 0)[0]["median_ms"] == first
    assert half_medians([record], 1)[0]["median_ms"] == second
    assert half_medians([record], 0)[0]["samples"] == len(times) // 2
    # the model's noise floor: the same halves' relative difference
    whole = statistics.median(times)
    halves, odd_even = split_rel_diffs(times)
    assert halves == abs(first - second) / whole
    odd, even = split_medians(times, "odd_even")
    assert odd_even == abs(odd - even) / whole
