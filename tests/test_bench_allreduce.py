"""scripts/bench_allreduce.py part (b) without a GPU: its jobs are the enumerated space (the
symmetric-memory transports included), and a shape's row measures the best schedule against
the ideal of the fastest all-reduce alone. The CUDA baselines those rows read exist for
exactly the problems the space gives the kernels."""

import importlib.util
import math
import sys
from pathlib import Path

from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.space import Transport, enumerate_schedules

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "bench_allreduce", ROOT / "scripts" / "bench_allreduce.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_layer_jobs_time_every_enumerated_schedule_with_the_symm_transports():
    bench = _load()
    jobs = bench.layer_jobs(["llama3-70b"], (1, 64, 2048), 2)
    assert [p.m for p, _ in jobs] == [1, 1, 64, 64, 2048, 2048]
    for problem, schedules in jobs:
        fused = list(enumerate_schedules(problem, bench.fused_space()))
        assert schedules == list(enumerate_schedules(problem, bench.layer_space())) + fused
        assert all(s.compute.value == "fused" for s in fused)
        if problem.m >= 64:  # row chunks: the producer's epilogue all-reduces
            assert "finer-c2-m/ce/triton+fused" in {str(s) for s in fused}
        names = {str(s) for s in schedules}
        assert "serial/symm2/cublas" in names and "serial/nccl/cublas" in names
        transports = {s.transport for s in schedules}
        assert {Transport.SYMM1, Transport.SYMM2} <= transports
        assert {Transport.LAMPORT1, Transport.LAMPORT2} <= transports
        assert "serial/lamport1/cublas" in names
        if problem.m >= 64:  # row chunks exist: the kernels overlap the next chunk's GEMM
            assert "finer-c4-m/symm2/cublas+hi" in names


def _m(problem, name, ms, kind="schedule", verdict="ok"):
    return Measurement(problem.to_dict(), name, kind=kind, verdict=verdict, median_ms=ms)


def test_a_row_takes_the_ideal_from_the_fastest_all_reduce_alone():
    bench = _load()
    p = Problem(pattern="gemm_ar", m=16, n=8192, k=4096, world=2, name="llama3-70b.out")
    measured = [
        _m(p, "serial/nccl/cublas", 0.060),
        _m(p, "serial/symm2/cublas", 0.040),
        _m(p, "finer-c2-m/symm2/cublas+hi", 0.030),
        _m(p, "finer-c2-m/ce/cublas", 0.050, verdict="incorrect"),
        _m(p, "gemm_alone", 0.020, "baseline"),
        _m(p, "comm_alone", 0.032, "baseline"),
        _m(p, "comm_one_shot", 0.012, "baseline"),
        _m(p, "comm_two_shot", 0.010, "baseline"),
        _m(p, "serial_eager", 0.070, "baseline"),
        _m(p, "serial_graph", 0.050, "baseline"),
    ]
    row = bench.layer_row(p, measured)
    assert row["phase"] == "decode" and row["best"] == "finer-c2-m/symm2/cublas+hi"
    assert row["fastest_comm"] == "comm_two_shot" and row["best_transport"] == "symm2"
    assert math.isclose(row["ideal_ms"], 0.020)  # max(GEMM 0.020, two-shot 0.010)
    assert math.isclose(row["best_vs_ideal"], 1.5)
    assert math.isclose(row["best_vs_serial_graph"], 0.050 / 0.030)
    assert math.isclose(row["best_vs_serial_two_shot"], 0.040 / 0.030)
    summary = bench.layer_summary([row])
    assert summary["decode"]["incorrect"] == 1 and "prefill" not in summary
    assert summary["decode"]["best_transports"] == {"symm2": 1}


def test_the_kernel_comm_baselines_exist_where_the_space_allows_the_kernels():
    import torch

    from ficco.execute.allreduce import LAMPORT_ONE_SHOT, lamport_all_reduce_norm
    from ficco.patterns.gemm_ar import (
        BASELINE_COMM_LAMPORT,
        BASELINE_COMM_ONE_SHOT,
        BASELINE_COMM_TWO_SHOT,
        kernel_comm_parts,
    )

    def buffers(p):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
        return {
            "staging": torch.zeros(p.world * p.m, p.n, dtype=dtype),
            "c": torch.zeros(p.m, p.n, dtype=dtype),
            "partial": torch.zeros(p.m, p.n, dtype=dtype),
        }

    bf16 = Problem(pattern="gemm_ar", m=3, n=8, k=4, world=2)
    tensors = buffers(bf16)
    parts = kernel_comm_parts(bf16, tensors, "0")
    assert set(parts) == {BASELINE_COMM_ONE_SHOT, BASELINE_COMM_TWO_SHOT, BASELINE_COMM_LAMPORT}
    kind, src, dst, group = parts[BASELINE_COMM_ONE_SHOT].args
    # one-shot reads row block 0 of staging (where symm1's GEMM writes) into c
    assert src.data_ptr() == tensors["staging"].data_ptr() and src.shape == (3, 8)
    assert dst is tensors["c"] and group == "0"
    kind, src, dst, _ = parts[BASELINE_COMM_TWO_SHOT].args
    assert src is dst is tensors["c"]  # in place, as symm2 schedules reduce
    kind, src, dst, _ = parts[BASELINE_COMM_LAMPORT].args
    assert kind is LAMPORT_ONE_SHOT and src is tensors["partial"] and dst is tensors["c"]
    fp16 = Problem(pattern="gemm_ar", m=3, n=8, k=4, world=2, dtype="fp16")
    assert set(kernel_comm_parts(fp16, buffers(fp16), "0")) == {BASELINE_COMM_LAMPORT}
    # with the add_rms_norm epilogue: lamport's launch is the fused one, writing the
    # baselines' own y; the others all-reduce into c, then the unfused norm
    normed = Problem(pattern="gemm_ar", m=3, n=8, k=4, world=2, epilogue="add_rms_norm")
    tensors = buffers(normed)
    tensors["residual"] = torch.zeros(3, 8, dtype=torch.bfloat16)
    tensors["norm_weight"] = torch.ones(1, 8, dtype=torch.bfloat16)
    from ficco.patterns.gemm_ar import _Norm

    norm = _Norm(normed, tensors, "cpu")
    parts = kernel_comm_parts(normed, tensors, "0", norm)
    fused = parts[BASELINE_COMM_LAMPORT]
    assert fused.func is lamport_all_reduce_norm and fused.args[:2] == (
        LAMPORT_ONE_SHOT,
        tensors["partial"],
    )
    assert [a.data_ptr() for a in fused.args[5:7]] == [t.data_ptr() for t in norm.out]
    assert parts[BASELINE_COMM_TWO_SHOT].__name__ == "all_reduce_then_norm"


def test_part_a_measures_each_transport_in_its_range_and_compares_the_norms():
    bench = _load()
    assert set(bench.TRANSPORTS) >= {"lamport1", "lamport2", "fused_norm", "nccl_norm"}
    assert bench.applies("lamport1", 64 << 20) and not bench.applies("lamport2", 128 << 20)
    assert bench.applies("fused_norm", 8192) and not bench.applies("two_shot_norm", 8 << 20)
    assert bench.applies("nccl", 256 << 20)
    rows = [
        {"transport": t, "bytes": 8192, "world": 2, "graph": {"median_ms": ms}}
        for t, ms in (
            ("nccl", 0.0117),
            ("two_shot", 0.0084),
            ("lamport1", 0.0060),
            ("nccl_norm", 0.0160),
            ("two_shot_norm", 0.0130),
            ("fused_norm", 0.0065),
        )
    ]
    per = bench.summarize(rows)["graph"]["8192"]
    assert per["best"] == "lamport1"  # of the plain all-reduces: a norm row is other work
    assert math.isclose(per["nccl_over_best"], 0.0117 / 0.0060)
    assert per["fastest_unfused_norm"] == "two_shot_norm"
    assert math.isclose(per["unfused_over_fused_norm"], 0.0130 / 0.0065)
    assert "unfused_over_fused_norm" not in bench.summarize(rows[:3])["graph"]["8192"]
