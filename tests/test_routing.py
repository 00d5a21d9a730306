"""Skewed routing: sizes, distinct experts per token, skew, reproducibility, refusals."""

import pytest

import ficco
from ficco.routing import skewed_routing, with_skewed_routing
from ficco.validate import InputError


def test_rows_sum_to_tokens_times_top_k_and_no_expert_exceeds_the_tokens():
    table = skewed_routing(world=3, experts=12, tokens_per_rank=500, top_k=4, alpha=1.2, seed=3)
    assert len(table) == 3 and all(len(row) == 12 for row in table)
    assert [sum(row) for row in table] == [2000, 2000, 2000]
    # each token picks 4 distinct experts, so no expert gets more than every token once
    assert max(max(row) for row in table) <= 500


def test_skew_grows_with_alpha_and_zero_is_near_uniform():
    def top_share(alpha):
        table = skewed_routing(2, 16, 4000, 1, alpha, seed=0)
        per_expert = [sum(col) for col in zip(*table, strict=True)]
        return max(per_expert) / sum(per_expert)

    flat, mild, steep = top_share(0.0), top_share(1.0), top_share(2.0)
    assert flat < 1.5 / 16  # uniform: 1/16 give or take sampling noise
    assert flat < mild < steep
    assert steep > 0.5


def test_same_seed_same_table_other_seed_other_table():
    a = skewed_routing(2, 8, 300, 2, 1.0, seed=5)
    assert a == skewed_routing(2, 8, 300, 2, 1.0, seed=5)
    assert a != skewed_routing(2, 8, 300, 2, 1.0, seed=6)


def test_with_skewed_routing_keeps_the_problem_size_and_names_it():
    p = ficco.Problem(pattern="gemm_a2a", m=960, n=32, k=16, world=2, experts=4, name="moe.down")
    q = with_skewed_routing(p, top_k=2, alpha=1.5, seed=1)
    assert q.m == p.m and q.name == "moe.down+skew" and q.key != p.key
    assert sum(map(sum, q.routing)) == 960


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(world=0, experts=4, tokens_per_rank=8), "world"),
        (dict(world=2, experts=4, tokens_per_rank=8, top_k=5), "top_k"),
        (dict(world=2, experts=4, tokens_per_rank=8.5), "tokens_per_rank"),
        (dict(world=2, experts=4, tokens_per_rank=8, alpha=-1), "alpha"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, field):
    with pytest.raises(InputError, match=field):
        skewed_routing(**kwargs)


def test_routing_refuses_dense_patterns_and_ragged_tokens():
    dense = ficco.Problem(pattern="ag_gemm", m=64, n=8, k=8, world=2)
    with pytest.raises(InputError, match="pattern"):
        with_skewed_routing(dense)
    moe = ficco.Problem(pattern="a2a_gemm", m=66, n=8, k=8, world=2, experts=2)
    with pytest.raises(InputError, match="top_k=2"):
        with_skewed_routing(moe, top_k=2)
