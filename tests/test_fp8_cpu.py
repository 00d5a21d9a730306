"""Scaled (fp8) problems run for real over gloo and verified: every pattern at W = 2 and 3,
schedules covering every axis value the rules allow (each value once, ficco's Triton FP8
GEMM and its fused kernel by as few schedules as take them: ``tests/covering.py``), both
scale granularities on each side, both fp8 dtypes; one rank pool per world (set-up paid
once).

Every legal schedule (not a covering set) verifies too; that takes minutes on 2 cores, so it
is a command rather than a test, e.g.
``ficco run gemm_ar --m 24 --n 32 --k 48 -w 2 --dtype fp8_e4m3 --a-scale row --b-scale
column --backend cpu --all``."""

import pytest
from covering import covering

from ficco.execute.run import run_problem
from ficco.patterns import Pattern, spec_of
from ficco.problem import Problem
from ficco.space import Gemm, Schedule, enumerate_schedules
from ficco.verdict import Verdict


def measurements(problem, schedules):
    """Each schedule's measurement, verified in the session's rank pool of the world
    (tests/conftest.py); a run that failed as a whole is a failure here, with its reason."""
    results = run_problem(problem, schedules, backend="cpu")
    assert all(r.measurement is not None for r in results), [
        (r.schedule, r.detail) for r in results
    ]
    return [r.measurement for r in results]


AXES = ("granularity", "chunks", "split", "transport", "order", "compute", "all_reduce")
AXES += ("comm_priority", "gemm")

#: per world, the (dtype, a_scale, b_scale) of each pattern's problem, in enum order: each
#: granularity of each side and each fp8 dtype occurs at both worlds
SCALINGS = {
    2: [("fp8_e4m3", "row", "column"), ("fp8_e4m3", "tensor", "tensor"), ("fp8_e5m2", "row", "tensor")],
    3: [("fp8_e4m3", "tensor", "column"), ("fp8_e5m2", "row", "column"), ("fp8_e4m3", "row", "tensor")],
}  # fmt: skip


def problems(world: int) -> list[Problem]:
    out = []
    fp8_patterns = [p for p in Pattern if spec_of(p).scaled_inputs]
    for i, pattern in enumerate(fp8_patterns):
        dtype, a_scale, b_scale = SCALINGS[world][i % len(SCALINGS[world])]
        kw = {"experts": 2 * world} if spec_of(pattern).routed else {}
        out.append(
            Problem(
                pattern=pattern,
                m=12 * world,
                n=32,
                k=48,
                world=world,
                dtype=dtype,
                a_scale=a_scale,
                b_scale=b_scale,
                **kw,
            )  # fmt: skip
        )
    if world == 2:  # one row per rank: its row scale must still travel with it
        one = Problem(pattern="ag_gemm", m=2, n=32, k=48, world=2, dtype="fp8_e4m3", a_scale="row")
        out.append(one)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"w{w}")
def verified(request):
    """(problem, legal schedules, schedules run, measurements) of every fp8 problem of one
    world, run in the session's rank pool of that world (tests/conftest.py)."""
    out = []
    for p in problems(request.param):
        legal = list(enumerate_schedules(p))
        chosen = covering(legal, AXES, first=Schedule())
        out.append((p, legal, chosen, measurements(p, chosen)))
    return out


def test_every_fp8_pattern_verifies_schedules_covering_every_axis(verified):
    for problem, _, schedules, measurements in verified:
        assert [m.name for m in measurements] == [str(s) for s in schedules]
        bad = [(m.name, m.verdict, m.detail) for m in measurements if m.verdict != Verdict.OK]
        assert not bad, problem.key


def test_the_covered_schedules_span_the_space_the_rules_allow(verified):
    for _, legal, schedules, _ in verified:
        assert Schedule() in schedules
        # ficco's Triton FP8 GEMM (the interpreter on CPU) and the fused kernel take fp8
        assert {s.gemm for s in legal} == {Gemm.CUBLAS, Gemm.TRITON}
        for axis in AXES:
            assert {getattr(s, axis) for s in schedules} == {getattr(s, axis) for s in legal}
    covered = {(p.dtype, p.a_scale.value, p.b_scale.value) for p, *_ in verified}
    assert {d for d, _, _ in covered} == {"fp8_e4m3", "fp8_e5m2"}
    assert {a for _, a, _ in covered} == {"tensor", "row"}
    assert {b for _, _, b in covered} == {"tensor", "column"}
