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
is the part's that came nearest its tolerance. Parts of different dtypes come as a tuple
(``ficco.execute.buffers.output_of``; the reference's ``exact`` and ``plain`` then too).

An FP8 part (:class:`~ficco.execute.buffers.Quantized`: gemm_ar's add_rms_norm_fp8 writes
its normed rows in e4m3 with a per-tensor scale) is dequantized, ``bits * scale`` (the values
a consumer reads), and compared with the float64 values element by element: its plain
reference is the working-dtype value before quantizing, whose tolerance as above
(``upstream``) bounds what the rounding starts from; rounding to the nearest FP8 value then
moves it by at most half a step of the format's precision. A max-abs tolerance would not do:
e4m3's step near the largest values (32 at 448) would hide a wrong scale on all the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ficco.execute.buffers import Quantized
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
    out: torch.Tensor | tuple,
    exact: torch.Tensor | tuple,
    plain: torch.Tensor | tuple,
    problem: Problem,
    schedule: Schedule,
) -> Check:
    if isinstance(out, tuple) or (isinstance(out, torch.Tensor) and out.dim() == 3):
        # parts (the module docstring): each checked on its own
        if len(out) != len(exact) or any(
            _bits(o).shape != e.shape for o, e in zip(out, exact, strict=False)
        ):
            return Check(float("inf"), 0.0, False)
        checks = [
            _check_part(o, e, p, problem, schedule)
            for o, e, p in zip(out, exact, plain, strict=True)
        ]
        nearest = max(checks, key=lambda c: _nearness(c.max_abs_err, c.tolerance))
        return Check(nearest.max_abs_err, nearest.tolerance, all(c.ok for c in checks))
    if isinstance(exact, tuple) or out.shape != exact.shape:
        return Check(float("inf"), 0.0, False)
    return _check_part(out, exact, plain, problem, schedule)


def _bits(part) -> torch.Tensor:
    return part.bits if isinstance(part, Quantized) else part


def _tolerance(exact, plain, eps: float, problem: Problem, schedule: Schedule) -> float:
    """The module docstring's ``tol`` for ``exact`` (float64) against its plain twin."""
    scale = exact.abs().max().item() if exact.numel() else 0.0
    plain_err = (plain.double() - exact).abs().max().item() if exact.numel() else 0.0
    summation_order = math.sqrt(problem.k) * ACCUMULATE_EPS * scale
    floor = max(plain_err, eps * scale, summation_order, 1e-30)
    return (2 + extra_roundings(problem, schedule)) * floor


def _check_part(
    out: torch.Tensor | Quantized,
    exact: torch.Tensor,
    plain: torch.Tensor,
    problem: Problem,
    schedule: Schedule,
) -> Check:
    if isinstance(out, Quantized):
        return _check_quantized(out, exact, plain, problem, schedule)
    exact = exact.to(out.device, torch.float64)
    eps = torch.finfo(out.dtype).eps
    tol = _tolerance(exact, plain.to(out.device), eps, problem, schedule)
    err = (out.double() - exact).abs().max().item() if exact.numel() else 0.0
    finite = bool(torch.isfinite(out).all()) if out.numel() else True
    return Check(err if finite else float("nan"), tol, finite and err <= tol)


def _check_quantized(
    out: Quantized, exact: torch.Tensor, plain: torch.Tensor, problem: Problem, schedule: Schedule
) -> Check:
    """An FP8 part against its float64 values element by element (the module docstring);
    the check shown is the element's that came nearest its own tolerance."""
    bits = out.bits
    if not exact.numel():
        return Check(0.0, 0.0, True)
    exact = exact.to(bits.device, torch.float64)
    fp8_scale = out.scale.to(torch.float64).abs()
    values = bits.double() * fp8_scale  # dequantized: what a consumer of the part reads
    # before quantizing: the working dtype's error, as the part in that dtype is allowed it
    upstream = _tolerance(exact, plain.to(bits.device), torch.finfo(plain.dtype).eps,
                          problem, schedule)  # fmt: skip
    # Why this bound: an FP8 format of m mantissa bits (e4m3: 3) rounds a value in
    # [2^e, 2^(e+1)) to a multiple of 2^(e-m), so to nearest it moves by at most half that
    # step, eps / 2 of the value (finfo's eps = 2^-m: 2^-4 for e4m3); below the normal range
    # the step is smallest_normal * eps (2^-9) absolute, half of it at most. Both in the
    # scaled units, so times the scale once dequantized. The value it rounds is off the exact
    # one by up to ``upstream`` already, which the relative half step can grow by as much.
    fp8 = torch.finfo(bits.dtype)
    half = fp8.eps / 2
    tol = (1 + half) * upstream + half * exact.abs() + half * fp8.smallest_normal * fp8_scale
    err = (values - exact).abs()
    if not bool(torch.isfinite(values).all()):
        return Check(float("nan"), upstream, False)
    worst = int(torch.argmax(err / tol))
    err_at, tol_at = err.flatten()[worst].item(), tol.flatten()[worst].item()
    return Check(err_at, tol_at, bool((err <= tol).all()))


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
