import pytest

from ficco.problem import Pattern, Problem, canonical_dtype
from ficco.validate import InputError


def test_valid_problems_and_derived_sizes():
    p = Problem(pattern="ag_gemm", m=8192, n=1024, k=4096, world=4)
    assert p.pattern is Pattern.AG_GEMM and p.dtype == "bf16" and p.m_shard == 2048
    assert p.flops == 2 * 8192 * 1024 * 4096
    assert p.comm_bytes_per_rank() == 3 * 2048 * 4096 * 2
    rs = Problem(pattern="gemm_rs", m=64, n=16, k=8, world=2, dtype="float32")
    assert rs.dtype == "fp32" and rs.flops == 2 * 64 * 16 * 8 * 2


def test_gemm_ar_sizes_and_m_not_divisible_by_world():
    """gemm_ar's M need not divide by W (decode batches of 1); the +rs_ag schedules that
    need it are refused by a space rule instead."""
    p = Problem(pattern="gemm_ar", m=1, n=8192, k=4096, world=2)
    assert p.flops == 2 * 1 * 8192 * 4096 * 2  # every rank's K slice
    assert p.comm_bytes_per_rank() == 1 * 8192 * 2  # 2 (W-1)/W of the 1 x N partial
    w3 = Problem(pattern="gemm_ar", m=5, n=3, k=4, world=3, dtype="fp32")
    assert w3.comm_bytes_per_rank() == -(-2 * 2 * 5 * 3 // 3) * 4
    assert Problem.from_dict(w3.to_dict()) == w3 and w3.key == "gemm_ar:m5:n3:k4:w3:fp32"
    with pytest.raises(ValueError, match="experts/routing"):
        Problem(pattern="gemm_ar", m=4, n=4, k=4, world=2, experts=2)


def test_problem_round_trips_through_dict():
    p = Problem(pattern="a2a_gemm", m=10, n=4, k=4, world=2, experts=2, routing=((3, 1), (2, 4)))
    assert Problem.from_dict(p.to_dict()) == p
    assert p.key == "a2a_gemm:m10:n4:k4:w2:bf16:e2:r3,1/2,4"


def test_uniform_routing_spreads_tokens():
    p = Problem(pattern="gemm_a2a", m=14, n=4, k=4, world=2, experts=4)
    assert p.routing_table() == ((2, 2, 2, 1), (2, 2, 2, 1))
    between = p.tokens_between()
    assert between[0][1] == [2, 1]  # rank 0's tokens for rank 1's two experts


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        (dict(m=0), "m", "positive"),
        (dict(n=-3), "n", "positive"),
        (dict(k=2.5), "k", "integer"),
        (dict(world=1), "world", "at least 2"),
        (dict(m=97), "m", "divisible by world"),
        (dict(dtype="int8"), "dtype", "unknown dtype"),
        (dict(pattern="allreduce_gemm"), "pattern", "unknown pattern"),
        (dict(experts=4), "experts/routing", "only the all-to-all"),
    ],
)
def test_bad_values_name_field_and_rule(kwargs, field, rule):
    args = dict(pattern="gemm_rs", m=96, n=80, k=72, world=2) | kwargs
    with pytest.raises(ValueError) as err:
        Problem(**args)
    assert str(err.value).startswith(f"{field}:") and rule in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        (dict(), "experts", "needs the number of experts"),
        (dict(experts=3), "experts", "multiple of world"),
        (dict(experts=2, routing=((1, 2),)), "routing", "rows"),
        (dict(experts=2, routing=((1, -1), (0, 0))), "routing", ">= 0"),
        (dict(experts=2, routing=((1, 1), (1, 1))), "routing", "sum to m"),
        (dict(experts=2, m=7), "m", "divisible by world"),
    ],
)
def test_bad_all_to_all_values(kwargs, field, rule):
    args = dict(pattern="a2a_gemm", m=8, n=4, k=4, world=2) | kwargs
    with pytest.raises(ValueError) as err:
        Problem(**args)
    assert str(err.value).startswith(f"{field}:") and rule in str(err.value)


def test_dtype_aliases():
    assert canonical_dtype("torch.bfloat16") == "bf16"
    assert canonical_dtype("half") == "fp16"


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (64, 64),
        ("64", None),
        (64.7, None),
        (64.0, None),
        ("12.9", None),
        (True, None),
        ("1e3", None),
    ],
)
def test_sizes_are_integers_never_coerced(value, accepted):
    """A Problem takes typed values: text ("64", from a command line or a CSV cell) is parsed
    by its reader (ficco.api.make_problem, ficco.workloads.read_shapes_csv), not here."""
    args = dict(pattern="ag_gemm", m=value, n=8, k=8, world=2)
    if accepted is None:
        with pytest.raises(InputError) as err:
            Problem(**args)
        assert err.value.field == "m" and "integer" in str(err.value)
    else:
        assert Problem(**args).m == accepted


@pytest.mark.parametrize("count", [12.9, "12.9", "13", True, None, "x"])
def test_routing_counts_are_integers_never_truncated(count):
    routing = ((count, 0), (6, 6))  # "13" is a string in a table of counts, not 13
    with pytest.raises(InputError) as err:
        Problem(pattern="a2a_gemm", m=25, n=4, k=4, world=2, experts=2, routing=routing)
    assert str(err.value).startswith("routing:") and "tokens rank 0 sends to expert 0" in str(
        err.value
    )
