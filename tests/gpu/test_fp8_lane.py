"""FP8 (e4m3) schedules of the five GEMM patterns on GPUs (the ``lane`` fixture: one GPU per
rank, and ranks that share a GPU): fp8 rows moved with their row scales by every transport
the lane has, each chunk GEMM through ``torch._scaled_mm`` or (``triton`` schedules) ficco's
Triton FP8 GEMM, bf16 partials reduced, verified
against the reference from the dequantized inputs; the replay of a captured graph is
verified too (one round, no warm-up: timings are not the point).

Row/column scales for every pattern, and one tensor/tensor case. Schedules a lane cannot
take come back ``unavailable`` naming why (ranks that share a GPU: symmetric memory's
all-reduces and NCCL's copy engine need distinct GPUs). e5m2 is refused on GPUs, naming
cuBLASLt's missing e5m2 x e5m2 GEMM.

By default each problem runs a covering set (every value of every schedule axis its legal
schedules take, and every transport at every granularity: about 15 each; the twelve
one-GPU problems of W = 2 and 3 took about 10 s on one H100). With ``FICCO_FP8_LANE_ALL=1``
every legal schedule runs (65 to 170 per problem: W = 2's six problems passed on one H100,
while at W = 3 one problem took 10 to 23 s on H200s, more than the lane's budget).
The lane stage's cap is shared with other tests: once ``FICCO_FP8_LANE_BUDGET_S`` (default
60) seconds have gone since this module's first problem started, the problems left are skipped,
saying so, rather than letting the stage's cap cut every test's report."""

import os
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(1)]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.execute.cuda_shared import NEEDS_DISTINCT_GPUS, shared_capability  # noqa: E402
from ficco.patterns import spec_of  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Gemm, Schedule, enumerate_schedules  # noqa: E402

EVERY_SCHEDULE = os.environ.get("FICCO_FP8_LANE_ALL") == "1"
AXES = ("granularity", "chunks", "split", "transport", "order", "compute", "all_reduce")
AXES += ("comm_priority",)
OPTIONS = RunOptions(timing=TimingOptions(rounds=1, warmup=0))
BUDGET_S = float(os.environ.get("FICCO_FP8_LANE_BUDGET_S", "60"))
STARTED: list[float] = []


def within_budget() -> None:
    """Skip, saying so, once this module's budget is spent."""
    STARTED[:] = STARTED or [time.monotonic()]
    spent = time.monotonic() - STARTED[0]
    if spent > BUDGET_S:
        pytest.skip(
            f"the fp8 lane's budget is spent ({spent:.0f} s of FICCO_FP8_LANE_BUDGET_S={BUDGET_S:g})"
        )


#: (pattern, a_scale, b_scale): row/column everywhere, plus one tensor/tensor
CASES = [
    ("ag_gemm", "row", "column"),
    ("gemm_rs", "row", "column"),
    ("gemm_ar", "row", "column"),
    ("a2a_gemm", "row", "column"),
    ("gemm_a2a", "row", "column"),
    ("ag_gemm", "tensor", "tensor"),
]


def covering(schedules):
    """cuBLAS schedules that together take every value of every axis that occurs, and every
    transport with every granularity (each transport chunked too), serial first; then Triton
    schedules (ficco's FP8 GEMM) taking every granularity and compute."""
    chosen, seen = [], set()
    for s in sorted(schedules, key=lambda s: s != Schedule()):  # stable: the rest in order
        if s.gemm is Gemm.TRITON:
            values = {("triton", s.granularity), ("triton", s.compute)}
        else:
            values = {(axis, getattr(s, axis)) for axis in AXES}
            values.add(("transport x granularity", (s.transport, s.granularity)))
        if values - seen:
            chosen.append(s)
            seen |= values
    return chosen


def fp8_problem(pattern: str, world: int, a_scale: str, b_scale: str, dtype="fp8_e4m3"):
    # M, N, K multiples of 16 and of every chunk count: every chunk GEMM is _scaled_mm-aligned
    kw = {"experts": 2 * world} if spec_of(pattern).routed else {}
    return Problem(pattern=pattern, m=32 * world, n=64, k=64, world=world, dtype=dtype,
                   a_scale=a_scale, b_scale=b_scale, **kw)  # fmt: skip


def fp8_refusal():
    """Why this GPU or torch runs no e4m3 GEMM (None: it does)."""
    from ficco.kernels.scaled_mm import gpu_refusal

    return gpu_refusal("fp8_e4m3", torch.device("cuda", 0))


@pytest.mark.parametrize(("pattern", "a_scale", "b_scale"), CASES,
                         ids=[f"{p}-{a}-{b}" for p, a, b in CASES])  # fmt: skip
def test_fp8_schedules_verify_on_gpus(pattern, a_scale, b_scale, lane):
    if (reason := fp8_refusal()) is not None:
        pytest.skip(f"this GPU or torch has no FP8 GEMM: {reason}")
    within_budget()
    problem = fp8_problem(pattern, lane.world, a_scale, b_scale)
    legal = list(enumerate_schedules(problem))
    schedules = legal if EVERY_SCHEDULE else covering(legal)
    assert Schedule() in schedules and len(schedules) >= 4
    by = {m.name: m for m in lane.run(problem, schedules, OPTIONS)}
    bad = []
    for s in schedules:
        m = by[str(s)]
        why = shared_capability(problem, s) if lane.shared else None
        if why is not None:  # this lane cannot take it: refused, naming why
            if m.verdict != "unavailable" or NEEDS_DISTINCT_GPUS not in m.detail:
                bad.append((str(s), m.verdict, m.detail))
            continue
        if s.transport.value == "nccl_ce" and m.verdict == "unavailable" and m.detail:
            continue  # NCCL's zero-CTA policy, probed at set-up: this machine's NCCL refuses it
        if m.verdict != "ok":
            bad.append((str(s), m.verdict, m.detail))
    assert not bad, f"{problem.key}: {len(bad)} of {len(schedules)} schedules: {bad[:5]}"


def test_fp8_e5m2_is_refused_on_gpus_naming_why(lane):
    within_budget()
    problem = fp8_problem("ag_gemm", lane.world, "row", "column", dtype="fp8_e5m2")
    (m,) = [m for m in lane.run(problem, [Schedule()], OPTIONS) if m.name == str(Schedule())]
    assert m.verdict == "unavailable" and "e5m2" in m.detail and "_scaled_mm" in m.detail, m
