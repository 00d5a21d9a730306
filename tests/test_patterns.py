"""The pattern registry: every pattern has a complete spec, found through one table.

A spec that lacks a part (a reference, its baselines, its ideal's collectives, its sizes, its
stdlib lookup twin, its lowering ...) is refused at registration or named by :func:`defects`;
the lookup twins compute every pattern's sizes exactly as the specs do; the registry reads
without torch; the ideal is one definition.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

import ficco.patterns as patterns
from ficco.export import lookup_features
from ficco.patterns import (
    SERIAL_PLAN_PARTS,
    Pattern,
    PatternSpec,
    Ref,
    ideal_ms,
    missing_parts,
    register,
    spec_of,
    spec_parts,
    specs,
)
from ficco.plan import LOWERINGS, build_plan
from ficco.problem import Problem
from ficco.select.features import FEATURE_PATTERNS
from ficco.space import Schedule

#: a spec's parts that are code: each must be callable once resolved
CODE_PARTS = (
    "flops",
    "comm_bytes",
    "shard_rows",
    "serial_gemm_rows",
    "one_step",
    "transfer_passes",
    "plan_key",
    "extra_roundings",
    "sizes",
    "reference",
    "reference_by_collectives",
)


def defects(spec: PatternSpec) -> list[str]:
    """Every part of ``spec`` that is missing or does not resolve (``[]``: complete)."""
    found = [f"{name}: missing" for name in missing_parts(spec)]
    for name in ("lowering", "buffers"):
        ref = getattr(spec, name)
        try:
            if not callable(ref.load()):
                found.append(f"{name}: {ref.target} is not callable")
        except (AttributeError, ImportError, ValueError) as err:
            found.append(f"{name}: {ref.target} does not resolve ({err})")
    found += [f"{name}: not callable" for name in CODE_PARTS if not callable(getattr(spec, name))]
    if not (callable(spec.cuda_baselines) or spec.cuda_baselines == SERIAL_PLAN_PARTS):
        found.append("cuda_baselines: neither a function nor SERIAL_PLAN_PARTS")
    if spec.lookup_sizes not in lookup_features.SIZES:
        found.append(f"lookup_sizes: no twin {spec.lookup_sizes!r} in lookup_features.SIZES")
    if spec.moved_dim not in ("k", "n"):
        found.append(f"moved_dim: {spec.moved_dim!r} is not k or n")
    return found


@pytest.mark.parametrize("pattern", list(Pattern), ids=str)
def test_every_pattern_has_a_complete_spec_in_its_own_module(pattern):
    spec = spec_of(pattern)
    assert spec.pattern is pattern
    assert type(spec).__module__ == "ficco.patterns.spec"
    assert sys.modules[patterns.MODULES[pattern]].SPEC is spec
    assert patterns.MODULES[pattern] == f"ficco.patterns.{pattern.value}"
    assert defects(spec) == []
    assert LOWERINGS[pattern] is spec.lowering.load()


def test_an_incomplete_spec_is_refused_and_its_gaps_named():
    whole = spec_of(Pattern.AG_GEMM)
    lacking = dataclasses.replace(whole, reference=None, cuda_baselines=None, comm_alone=())
    with pytest.raises(ValueError, match="spec lacks comm_alone, reference, cuda_baselines"):
        register(lacking)
    assert spec_of(Pattern.AG_GEMM) is whole  # the registry kept the complete one
    unresolved = dataclasses.replace(
        whole,
        lowering=Ref("ficco.plan.dense:plan_sp_moe"),
        buffers=Ref("ficco.plan.sp_moe:buffers"),
        lookup_sizes="sp_moe",
        sizes="rows, weights",
    )
    assert [d.split(":")[0] for d in defects(unresolved)] == [
        "lowering",
        "buffers",
        "sizes",
        "lookup_sizes",
    ]
    with pytest.raises(ValueError, match="a spec is registered already"):
        register(dataclasses.replace(whole))
    # every field is a part: none has a default that could hide a gap
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(PatternSpec)
    )
    assert len(spec_parts()) == len(dataclasses.fields(PatternSpec)) > 20


#: problems of every pattern for the parity checks: W = 2, 3, 4, ragged and skewed routings,
#: top-k, fp32, an M that W does not divide (gemm_ar)
SKEW = ((5, 0, 3, 2, 4, 6), (1, 9, 0, 4, 2, 4), (10, 2, 2, 2, 2, 2))
PARITY = (
    Problem(pattern="ag_gemm", m=8192, n=28672, k=8192, world=2),
    Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3, dtype="fp32"),
    Problem(pattern="gemm_rs", m=4096, n=8192, k=3584, world=4),
    Problem(pattern="gemm_rs", m=30, n=40, k=24, world=3, dtype="fp16"),
    Problem(pattern="gemm_ar", m=7, n=24, k=16, world=3),
    Problem(pattern="gemm_ar", m=1, n=8192, k=4096, world=2),
    Problem(pattern="gemm_ar", m=512, n=8192, k=3584, world=4, dtype="fp32"),
    *(
        Problem(pattern=p, m=4096, n=2048, k=7168, world=4, experts=16)
        for p in ("a2a_gemm", "gemm_a2a")
    ),
    *(
        Problem(pattern=p, m=60, n=40, k=24, world=3, experts=6, routing=SKEW)
        for p in ("a2a_gemm", "gemm_a2a")
    ),
    *(
        Problem(pattern=p, m=64, n=24, k=40, world=4, experts=8, top_k=2)
        for p in ("a2a_gemm", "gemm_a2a")
    ),
    *(Problem(pattern=p, m=70, n=24, k=40, world=2, experts=6) for p in ("a2a_gemm", "gemm_a2a")),
    # emb_a2a: skewed tables, a batch W does not divide, uneven bags; the MLPerf DLRM-DCNv2 size
    Problem(pattern="emb_a2a", m=10, n=8, k=3, world=3, tables=(50, 7, 300, 20, 9), bags="uniform"),
    Problem(
        pattern="emb_a2a", m=65536, n=128, k=8, world=8, tables=tuple(range(1000, 27000, 1000))
    ),
)


def test_the_parity_problems_cover_every_pattern():
    assert {p.pattern for p in PARITY} == set(Pattern)


@pytest.mark.parametrize("problem", PARITY, ids=lambda p: p.key)
def test_the_lookup_twin_computes_the_specs_sizes(problem):
    spec = spec_of(problem.pattern)
    twin = lookup_features.SIZES[spec.lookup_sizes]
    routing = [list(row) for row in problem.routing] if problem.routing else None
    if problem.tables:  # emb_a2a's layout argument: the tables' rows
        routing = list(problem.tables)
    args = (problem.m, problem.n, problem.k, problem.world, problem.dtype_bytes)
    got = twin(*args, problem.experts, routing)
    assert tuple(got) == tuple(spec.sizes(problem))
    assert all(type(v) is int for v in got)  # integers both sides: the features are exact


def test_the_lookup_lists_are_the_registrys():
    assert tuple(p.value for p in FEATURE_PATTERNS) == lookup_features.PATTERNS
    assert tuple(s.pattern for s in specs() if s.in_selector) == FEATURE_PATTERNS
    assert {s.pattern.value for s in specs() if s.routed} == lookup_features.ROUTED_PATTERNS
    assert set(lookup_features.SIZES) == {s.lookup_sizes for s in specs()}
    # the C header's sizes: a twin for every pattern a table answers (tests/test_export.py
    # compiles them and holds their answers to the Python lookup's)
    assert set(lookup_features.C_SIZES) == set(lookup_features.PATTERNS)


@pytest.mark.parametrize("problem", PARITY[:7] + PARITY[9:11], ids=lambda p: p.key)
def test_the_spec_buffers_are_what_every_plan_allocates(problem):
    buffers = spec_of(problem.pattern).buffers.load()
    for rank in range(problem.world):
        small = problem.m * problem.n * problem.k < 10**6
        if small:
            assert build_plan(problem, Schedule(), rank).buffers == buffers(problem, rank)
        names = [b.name for b in buffers(problem, rank)]
        assert len(names) == len(set(names)) and any(
            b.role == "output" for b in buffers(problem, rank)
        )


def test_the_ideal_is_the_gemm_against_the_patterns_fastest_collective_alone():
    times = {"gemm_alone": 0.6, "comm_alone": 0.9, "comm_two_shot": 0.7, "comm_one_shot": 0.8}
    assert ideal_ms("gemm_ar", times) == 0.7  # symmetric memory's two-shot beats NCCL's
    assert ideal_ms("ag_gemm", times) == 0.9  # not gemm_ar's collectives
    assert ideal_ms("gemm_ar", {**times, "comm_two_shot": math.nan}) == 0.8
    assert ideal_ms("gemm_rs", {"gemm_alone": 1.5, "comm_alone": 0.9}) == 1.5
    assert math.isnan(ideal_ms("gemm_rs", {"gemm_alone": 1.5}))
    assert math.isnan(ideal_ms("gemm_rs", {"comm_alone": 0.9, "gemm_alone": math.nan}))


def test_the_signature_and_the_frame_take_the_one_ideal():
    from ficco.measure.record import Measurement, signature
    from ficco.profile.frame import baseline_times

    p = Problem(pattern="gemm_ar", m=64, n=64, k=32, world=2)
    times = {"gemm_alone": 0.6, "comm_alone": 0.9, "comm_two_shot": 0.7}
    m = Measurement(problem=p.to_dict(), name="finer-c2-m/ce/cublas", median_ms=1.0, samples=3)
    sig = signature(m, times)
    assert sig["ideal_ms"] == 0.7 and sig["serial_ms"] == 1.5 and sig["t_comm_ms"] == 0.9
    assert sig["pct_ideal"] == pytest.approx((1.5 - 1) / (1.5 / 0.7 - 1))
    records = [
        {"kind": "baseline", "verdict": "ok", "name": name, "median_ms": ms,
         "problem": p.to_dict(), "problem_key": p.key, "fingerprint_id": "f"}
        for name, ms in {**times, "serial_eager": 1.4}.items()
    ]  # fmt: skip
    assert baseline_times(records) == {(p.key, "f"): times}


def test_the_registry_reads_without_torch():
    code = (
        "import sys\n"
        "import ficco.patterns as P\n"
        "from ficco.problem import Problem\n"
        "assert len(P.specs()) == len(P.Pattern)\n"
        "p = Problem(pattern='a2a_gemm', m=64, n=8, k=8, world=2, experts=4)\n"
        "assert P.spec_of(p.pattern).sizes(p).rows > 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
