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
