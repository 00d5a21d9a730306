"""The verdict's tolerance: loose enough for any summation order of a correct GEMM, tight
enough that a wrong row, a dropped K slice or a stale element is caught."""

import pytest
import torch

from ficco.execute.verify import check_output
from ficco.problem import Problem
from ficco.space import Schedule

M, N, K = 64, 48, 7168


@pytest.fixture(scope="module")
def operands():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen)
    b = torch.randn(K, N, generator=gen)
    return a, b, a.double() @ b.double(), a @ b


def check(out, operands, schedule="finer-c16-m/ce/cublas"):
    a, b, exact, plain = operands
    problem = Problem(pattern="ag_gemm", m=M, n=N, k=K, world=2, dtype="fp32")
    return check_output(out, exact, plain, problem, Schedule.parse(schedule))


def test_products_summed_in_another_order_are_correct(operands):
    a, b, exact, plain = operands
    # two-row chunks, as a 16-chunk schedule of this problem cuts them (CPU BLAS runs them
    # as matrix-vector products), and plain sequential fp32 summation over K, the worst
    # ordinary order
    two_rows = torch.cat([a[i : i + 2] @ b for i in range(0, M, 2)])
    sequential = torch.zeros(M, N)
    for k in range(K):
        sequential += a[:, k, None] * b[k]
    for out in (two_rows, sequential):
        result = check(out, operands)
        assert result.ok, (result.max_abs_err, result.tolerance)
    # the case is real: sequential summation errs several times more than the blocked matmul
    blocked_err = (plain.double() - exact).abs().max().item()
    assert (sequential.double() - exact).abs().max().item() > 3 * blocked_err


@pytest.mark.parametrize(
    "fault",
    ["row_shifted", "one_k_slice_dropped", "one_element_stale", "nan"],
)
def test_wrong_results_stay_incorrect(operands, fault):
    a, b, exact, plain = operands
    out = plain.clone()
    if fault == "row_shifted":
        out[1:] = plain[:-1].clone()
    elif fault == "one_k_slice_dropped":
        # the smallest plausible loss: one 16th of one row's reduction never arrived
        out[5] -= a[5, : K // 16] @ b[: K // 16]
    elif fault == "one_element_stale":
        out[3, 7] = 0.0
    else:
        out[0, 0] = float("nan")
    result = check(out, operands)
    assert not result.ok
    if fault != "nan":
        assert result.max_abs_err > 100 * result.tolerance


def test_one_merge_of_rank_verdicts_for_every_backend():
    from ficco.execute.verify import RankVerdict, merge_verdicts
    from ficco.measure.record import Measurement
    from ficco.verdict import Verdict

    ok = RankVerdict(Verdict.OK, 1e-6, 1e-4)
    wrong = RankVerdict(Verdict.INCORRECT, 3.0, 2e-4, "rank 1: off")
    oom = RankVerdict(Verdict.OOM, float("nan"), float("nan"), "rank 0: OutOfMemoryError")
    # one rank's pair: the rank nearest its own tolerance (1e-6 of 1e-4 beats 2e-6 of 3e-4)
    assert merge_verdicts([ok, RankVerdict(Verdict.OK, 2e-6, 3e-4)]) == ok
    idle = RankVerdict(Verdict.OK, 0.0, 2e-30)  # a rank with no rows: nothing to be off by
    assert merge_verdicts([idle, ok]) == ok and merge_verdicts([ok, idle]) == ok
    merged = merge_verdicts([ok, wrong])
    assert (merged.verdict, merged.max_abs_err, merged.detail) == (
        Verdict.INCORRECT,
        3.0,
        "rank 1: off",
    )
    merged = merge_verdicts([wrong, oom])  # a failure kind explains more than "incorrect"
    assert merged.verdict is Verdict.OOM and merged.detail.startswith("rank 0")
    assert merged.max_abs_err != merged.max_abs_err  # NaN counts as the worst error
    with pytest.raises(ValueError, match="verdict: 'fine' is not one of ok, incorrect"):
        Measurement(problem={}, name="x", verdict="fine")
    assert Measurement(problem={}, name="x", verdict=Verdict.OOM).to_dict()["verdict"] == "oom"


def test_a_routing_with_an_idle_rank_reports_one_ranks_error_and_tolerance():
    """Rank 1 receives no token: its tolerance (~0) must not sit beside rank 0's error."""
    from ficco.api import run
    from ficco.problem import Problem

    problem = Problem(
        pattern="a2a_gemm", m=8, n=16, k=16, world=2, dtype="fp32", experts=2,
        routing=((4, 0), (4, 0)),
    )  # fmt: skip
    results = run(problem, ["serial/nccl/cublas", "finer-c2-m/nccl/cublas"], backend="cpu")
    for r in results:
        assert r.verdict == "ok", r
        assert 0 < r.max_abs_err <= r.tolerance and r.tolerance > 1e-12, r
