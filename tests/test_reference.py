"""The GPU reference (through collectives, from this rank's own tensors) agrees with the CPU
one (float64, from regenerated inputs) for every pattern, on gloo ranks."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_ops import exit_without_teardown

from ficco.execute.buffers import allocate
from ficco.execute.reference import reference_by_collectives, reference_output
from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Schedule

PROBLEMS = [
    dict(pattern="ag_gemm", m=24, n=16, k=8),
    dict(pattern="gemm_rs", m=24, n=16, k=8),
    dict(pattern="gemm_ar", m=12, n=16, k=8),
    # the residual add and RMSNorm after the all-reduce: y [2, M, N]; FP8: its two parts
    dict(pattern="gemm_ar", m=12, n=16, k=8, epilogue="add_rms_norm"),
    dict(pattern="gemm_ar", m=12, n=16, k=8, epilogue="add_rms_norm_fp8"),
    dict(pattern="a2a_gemm", m=48, n=16, k=8, experts=6),
    dict(pattern="gemm_a2a", m=48, n=16, k=8, experts=6),
    # skewed routing: rank s sends routing[s][e] tokens to expert e (some blocks empty)
    dict(pattern="a2a_gemm", m=30, n=8, k=8, experts=3, routing=((7, 0, 3), (1, 9, 0), (4, 2, 4))),
    dict(pattern="gemm_a2a", m=30, n=8, k=8, experts=3, routing=((7, 0, 3), (1, 9, 0), (4, 2, 4))),
]


def parts(output) -> tuple:
    return output if isinstance(output, tuple) else (output,)


def _rank(rank: int, world: int, init: str, seed: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    for spec in PROBLEMS:
        if "routing" in spec and len(spec["routing"]) != world:
            continue
        p = Problem(world=world, dtype="fp32", **spec)
        plan = build_plan(p, Schedule(), rank)
        tensors = allocate(plan, seed)  # the inputs as the executors hold them
        want_exact, want_plain = reference_output(p, rank, seed)
        got_exact, got_plain = reference_by_collectives(p, tensors, torch.device("cpu"))
        # an output of parts (gemm_ar's FP8 norm: Plan.output a tuple) part by part
        assert len(parts(want_exact)) == len(plan.outputs) == len(parts(got_exact)), p.key
        for got, want in zip(parts(got_exact), parts(want_exact), strict=True):
            assert got.shape == want.shape, (p.key, got.shape, want.shape)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        for got, want in zip(parts(got_plain), parts(want_plain), strict=True):
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)
    dist.barrier()
    exit_without_teardown()


@pytest.mark.parametrize("world", [2, 3])
def test_reference_by_collectives_matches_the_float64_reference(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank, (world, os.path.join(tmp, "rdv"), 7), nprocs=world, start_method="forkserver"
        )


def test_plan_baselines_serial_eager_is_verified_on_a_poisoned_output():
    from ficco.execute.baselines import BASELINE_SERIAL_EAGER, plan_baselines

    out = torch.zeros(3)
    calls, poisoned = [], []

    def run_serial_plan(mode: str = "full") -> None:
        calls.append(mode)
        if mode == "full":
            poisoned.append(bool(torch.isnan(out).all()))
            out.copy_(torch.arange(3.0))

    base = plan_baselines(run_serial_plan, out)
    assert set(base) == {"gemm_alone", "comm_alone", BASELINE_SERIAL_EAGER}
    base[BASELINE_SERIAL_EAGER]()
    assert base[BASELINE_SERIAL_EAGER].out is out and out.tolist() == [0.0, 1.0, 2.0]
    base[BASELINE_SERIAL_EAGER]()  # later (timed) calls do not poison
    base["gemm_alone"]()
    assert calls == ["full", "full", "gemm"]
    assert poisoned == [True, False]  # only the verified first call starts from NaN
