"""Verdicts: is a schedule's output the GEMM+collective it claims to be?

The tolerance comes from the data: the plain computation in the working dtype (serial
collective, one matmul) differs from the float64 result by ``plain_err``; a schedule may add
one rounding per extra partial sum it keeps in the working dtype (K-split accumulation,
reduce-scatter partials). A correct GEMM chunk may also sum its K products in another order
than the one matmul did: a BLAS runs a one- or two-row chunk as a matrix-vector product
whose running sum carries about sqrt(K) more rounding error (measured on CPU, fp32,
K = 7168: 1.7e-3 against the blocked matmul's 1.3e-4). Recursive summation of K terms with
random rounding signs errs by about ``sqrt(K) * u * |C|`` in the accumulation precision ``u``
(fp32 for every dtype here), so

    tol = (2 + extra_roundings) * max(plain_err, eps * max|exact|, sqrt(K) * u_fp32 * max|exact|)

A wrong chunk, a missed chunk or an unwritten element is off by O(|C|), far above that.

An output of several parts (a leading dimension: gemm_ar's add_rms_norm epilogue writes
``y [2, M, N]``, the normed rows and the new residual) is checked part by part, each against
its own scale and plain error (the normed rows are O(weight), the residual O(|C|): one
tolerance over both would let a wrong norm pass under the residual's), and the check shown
is the part's that came nearest its tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ficco.patterns import spec_of
from ficco.problem import Problem
from ficco.space import Schedule, Split
from ficco.verdict import Verdict

#: GEMMs accumulate in fp32 whatever the element type (tensor cores, CPU BLAS, ficco's Triton)
ACCUMULATE_EPS = torch.finfo(torch.float32).eps


@dataclass(frozen=True, slots=True)
class Check:
    max_abs_err: float
    tolerance: float
    ok: bool


def extra_roundings(problem: Problem, schedule: Schedule) -> int:
    """A K split keeps chunks - 1 partial sums in the working dtype; the pattern adds its own
    (a reduction of W partials: W - 1)."""
    extra = schedule.chunks - 1 if schedule.split is Split.K else 0
    return extra + spec_of(problem.pattern).extra_roundings(problem)


def check_output(
    out: torch.Tensor,
    exact: torch.Tensor,
    plain: torch.Tensor,
    problem: Problem,
    schedule: Schedule,
) -> Check:
    if out.shape != exact.shape:
        return Check(float("inf"), 0.0, False)
    if out.dim() == 3:  # parts (the module docstring): each checked on its own
        checks = [
            _check_part(o, e, p, problem, schedule)
            for o, e, p in zip(out, exact, plain, strict=True)
        ]
        nearest = max(checks, key=lambda c: _nearness(c.max_abs_err, c.tolerance))
        return Check(nearest.max_abs_err, nearest.tolerance, all(c.ok for c in checks))
    return _check_part(out, exact, plain, problem, schedule)


def _check_part(
    out: torch.Tensor,
    exact: torch.Tensor,
    plain: torch.Tensor,
    problem: Problem,
    schedule: Schedule,
) -> Check:
    exact = exact.to(out.device, torch.float64)
    eps = torch.finfo(out.dtype).eps
    scale = exact.abs().max().item() if exact.numel() else 0.0
    plain_err = (plain.to(out.device).double() - exact).abs().max().item() if exact.numel() else 0.0
    summation_order = math.sqrt(problem.k) * ACCUMULATE_EPS * scale
    floor = max(plain_err, eps * scale, summation_order, 1e-30)
    tol = (2 + extra_roundings(problem, schedule)) * floor
    err = (out.double() - exact).abs().max().item() if exact.numel() else 0.0
    finite = bool(torch.isfinite(out).all()) if out.numel() else True
    return Check(err if finite else float("nan"), tol, finite and err <= tol)


@dataclass(frozen=True, slots=True)
class RankVerdict:
    """One rank's judgement of one candidate (exchanged between ranks, then merged)."""

    verdict: Verdict
    max_abs_err: float = math.nan
    tolerance: float = math.nan
    detail: str = ""


def judge(check: Check | None, failure: Verdict | None = None, detail: str = "") -> RankVerdict:
    """This rank's verdict from its check, or from the failure it raised."""
    if failure is not None or check is None:
        return RankVerdict(failure or Verdict.ERROR, detail=detail)
    verdict = Verdict.OK if check.ok else Verdict.INCORRECT
    return RankVerdict(verdict, check.max_abs_err, check.tolerance, detail)


def _closeness(r: RankVerdict) -> tuple[int, float]:
    """How near a rank's error came to its tolerance (NaN errors last, as the worst)."""
    return _nearness(r.max_abs_err, r.tolerance)


def _nearness(err: float, tol: float) -> tuple[int, float]:
    """How near an error came to its tolerance (NaN errors last, as the worst)."""
    if err != err:
        return (1, math.inf)
    if not tol > 0:  # no tolerance: any error at all is the worst
        return (0, math.inf if err > 0 else 0.0)
    return (0, err / tol)


def merge_verdicts(per_rank: list[RankVerdict]) -> RankVerdict:
    """One verdict for a candidate: ok only if every rank verified its part. The error and
    tolerance shown are one rank's pair, the rank whose error came nearest its own tolerance
    (NaN counts as worst): each rank's tolerance scales with its own output, so the worst
    error beside another rank's tolerance would compare two ranks (a rank with no rows, whose
    tolerance is ~0, beside the others' errors); a failure kind (oom, launch, ...) explains
    more than "incorrect" on another rank, so it wins, with its rank's detail."""
    nearest = max(per_rank, key=_closeness)
    worst, tol = nearest.max_abs_err, nearest.tolerance
    failed = [r for r in per_rank if r.verdict is not Verdict.OK]
    if not failed:
        return RankVerdict(Verdict.OK, worst, tol)
    first = next((r for r in failed if r.verdict is not Verdict.INCORRECT), failed[0])
    return RankVerdict(first.verdict, worst, tol, first.detail)
