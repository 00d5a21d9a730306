"""The cost model prices FP8 (scaled) problems: moved inputs at one byte an element, the GEMM
at FP8's roof, whose figures (``ficco.model.fp8``) are the committed one-GPU measurements'."""

import json
import math
import statistics
from pathlib import Path

import pytest

from ficco.model import fp8
from ficco.model.predict import predictor
from ficco.patterns import spec_of
from ficco.problem import Problem
from ficco.space import Schedule

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return predictor("h200x2")


def _problem(pattern, dtype="bf16", **scales):
    return Problem(pattern=pattern, m=4096, n=8192, k=8192, world=2, dtype=dtype, **scales)


def test_the_fp8_figures_are_the_committed_measurements():
    fp8_rows = json.loads((ROOT / fp8.FP8_GEMM_SOURCE).read_text())["rows"]
    bf16_ms = {
        (r["M"], r["N"], r["K"]): r["cublas_ms"]
        for r in json.loads((ROOT / fp8.BF16_GEMM_SOURCE).read_text())["rows"]
    }
    speedups = [
        bf16_ms[(r["M"], r["N"], r["K"])] / r["scaled_mm_ms"]
        for r in fp8_rows
        if 2 * r["M"] * r["N"] * r["K"] >= fp8.COMPUTE_BOUND_FLOPS
    ]
    assert len(speedups) == 30
    assert statistics.median(speedups) == pytest.approx(fp8.FP8_OVER_BF16_CUBLAS, abs=1e-4)
    kernels = json.loads((ROOT / fp8.FP8_TRITON_SOURCE).read_text())["summary"]["fp8_full"]
    assert kernels["shapes"] == 40
    own = kernels["matmul_vs_library_geomean"]
    assert 1 / own == pytest.approx(fp8.FP8_TRITON_VS_CUBLAS, rel=1e-4)


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs"])
def test_predict_answers_fp8_problems(model, pattern):
    bf16 = model.predict(_problem(pattern))
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        p = model.predict(_problem(pattern, dtype, a_scale="row", b_scale="column"))
        assert p.times and all(math.isfinite(t.ms) and t.ms > 0 for t in p.times)
        assert 0 < p.ideal_ms <= p.serial_ms and math.isfinite(p.serial_ms)
        # the same shape's GEMM at FP8's roof: faster than bf16's, by at most the roof ratio
        gemm8, gemm16 = model.parts_ms(p.problem)[0], model.parts_ms(bf16.problem)[0]
        assert gemm16 / fp8.FP8_OVER_BF16_CUBLAS * 0.95 < gemm8 < gemm16
        d = p.to_dict()
        assert d["basis"] == p.basis and "uncalibrated FP8 model" in d["basis"]
        assert fp8.FP8_GEMM_SOURCE in d["basis"]
    assert bf16.basis is None and "basis" not in bf16.to_dict()


def test_fp8_ag_gemm_moves_about_half_the_bytes(model):
    bf16 = _problem("ag_gemm")
    row = _problem("ag_gemm", "fp8_e4m3", a_scale="row", b_scale="column")
    tensor = _problem("ag_gemm", "fp8_e4m3")
    spec = spec_of(bf16.pattern)
    moved = [spec.moved_row_bytes(p) for p in (bf16, row, tensor)]
    assert moved == [2 * 8192, 8192 + 4, 8192]  # a row of A: K elements, plus its fp32 scale
    comm = [model.parts_ms(p)[1] for p in (bf16, row, tensor)]
    # half the bytes; the collective's fixed cost (launch, ring latency) keeps it above half
    assert 0.5 < comm[2] / comm[0] < 0.6 and comm[2] < comm[1] < comm[0] * 0.6
    # the bytes are the price: fp8 at twice the K moves bf16's bytes, in bf16's time
    wide = Problem(pattern="ag_gemm", m=4096, n=8192, k=16384, world=2, dtype="fp8_e4m3")
    assert model.parts_ms(wide)[1] == pytest.approx(comm[0], rel=1e-12)
    # gemm_rs moves the bf16 product whatever the inputs
    rs = [model.parts_ms(_problem("gemm_rs", d))[1] for d in ("bf16", "fp8_e4m3")]
    assert rs[0] == rs[1]


def test_the_triton_fp8_gemm_is_priced_from_its_own_ratio(model):
    costs = model.costs
    shape = (4096, 8192, 8192)
    triton = Schedule.parse("shard/ce/triton")
    ratio = costs.gemm_ms(triton, *shape, True) / costs.cublas_ms(*shape, True)
    assert ratio == pytest.approx(fp8.FP8_TRITON_VS_CUBLAS)
    bf16_ratio = costs.gemm_ms(triton, *shape) / costs.cublas_ms(*shape)
    assert bf16_ratio == pytest.approx(model.params.gemm["triton_vs_cublas"])


def test_fp32_is_still_refused_and_a_gpu_without_fp8_figures_is_named(model):
    with pytest.raises(ValueError, match="dtype: the cost model is calibrated on 2-byte"):
        model.predict(_problem("ag_gemm", "fp32"))
    other = fp8.Machine(**_fields(model.machine))
    assert fp8.fp8_roof_ratio(other) == (1979 / 989, False)
    bare = _fields(model.machine) | {"tflops": None}
    with pytest.raises(ValueError, match="no measured FP8 GEMM"):
        fp8.fp8_roof_ratio(fp8.Machine(**bare))


def _fields(machine):
    from dataclasses import fields

    return {f.name: getattr(machine, f.name) for f in fields(machine)} | {"gpu": "Other GPU"}
