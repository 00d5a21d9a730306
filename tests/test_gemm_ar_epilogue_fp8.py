"""gemm_ar's add_rms_norm_fp8 epilogue (``ficco.patterns.epilogues``): the normed rows in FP8
e4m3 with a per-tensor fp32 scale, the new residual in the problem's dtype. The field, the
buffers and plans (two output parts, the constant scale, the same tasks as add_rms_norm's),
verification of the FP8 part dequantized against float64 (a wrong scale, skipped saturation
or an unwritten element fails), the schedules on CPU ranks (nccl unfused, lamport1 and
lamport2 fused under the interpreter), a schedule that reads the wrong scale, and the
command line."""

import dataclasses
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from epilogue_ranks import play_ranks  # noqa: E402

from ficco.execute.buffers import Quantized, allocate, output_of  # noqa: E402
from ficco.execute.reference import reference_output  # noqa: E402
from ficco.execute.run import run_problem  # noqa: E402
from ficco.execute.verify import check_output  # noqa: E402
from ficco.patterns.epilogues import (  # noqa: E402
    NORM_EPS,
    NORM_FP8_RANGE,
    NORM_SCALE,
    Epilogue,
    add_rms_norm,
)
from ficco.plan import NormOp, Region, build_plan  # noqa: E402
from ficco.problem import Problem, torch_dtype  # noqa: E402
from ficco.space import Schedule, enumerate_schedules  # noqa: E402

E4M3_MAX = 448.0
SCALE = NORM_FP8_RANGE / E4M3_MAX


def fp8_problem(m=6, n=24, k=8, world=2, dtype="bf16", **kw) -> Problem:
    return Problem(pattern="gemm_ar", m=m, n=n, k=k, world=world, dtype=dtype,
                   epilogue="add_rms_norm_fp8", **kw)  # fmt: skip


def test_the_field_takes_it_and_keys_it():
    p = fp8_problem(m=4, n=8)
    assert p.epilogue is Epilogue.ADD_RMS_NORM_FP8
    assert p.key == "gemm_ar:m4:n8:k8:w2:bf16:add_rms_norm_fp8"
    assert Problem.from_dict(p.to_dict()) == p
    with pytest.raises(Exception, match="takes plain dtypes") as err:
        fp8_problem(m=4, n=16, k=16, dtype="fp8_e4m3")
    assert err.value.field == "epilogue"


# --- buffers and plans -------------------------------------------------------------------------


def test_the_output_is_two_parts_normed_in_e4m3_read_with_the_constant_scale():
    p = fp8_problem(m=5, n=16, world=3)
    plan = build_plan(p, Schedule(), 1)
    assert plan.output == ("normed", "new_residual") == plan.outputs
    bufs = {b.name: b for b in plan.buffers}
    assert (bufs["normed"].dtype, bufs["normed"].scale, bufs["normed"].shape) == (
        "fp8_e4m3", NORM_SCALE, (5, 16)
    )  # fmt: skip
    assert bufs["new_residual"].dtype is None and bufs["new_residual"].role == "output"
    assert (bufs[NORM_SCALE].role, bufs[NORM_SCALE].dtype) == ("constant", "fp32")
    assert "y" not in bufs and bufs["c"].role == "workspace"
    # allocated: the scale the same constant on every rank and for every seed
    tensors = [allocate(build_plan(p, Schedule(), r), seed=r) for r in range(3)]
    for t in tensors:
        assert (
            t["normed"].dtype == torch.float8_e4m3fn and t["new_residual"].dtype == torch.bfloat16
        )
        assert t[NORM_SCALE].dtype == torch.float32 and t[NORM_SCALE].item() == pytest.approx(SCALE)
        assert torch.equal(t[NORM_SCALE], tensors[0][NORM_SCALE])
        assert t["normed"].float().isnan().all()  # poisoned through its bytes
    normed, new_residual = output_of(plan, tensors[1])
    assert isinstance(normed, Quantized) and normed.scale is tensors[1][NORM_SCALE]
    assert new_residual is tensors[1]["new_residual"]


def test_the_plans_are_add_rms_norms_with_the_parts_and_the_scale():
    """Every legal schedule (W = 3, ragged M): the same tasks, streams and dependencies as
    the add_rms_norm plan's; each norm writes the same rows of the two parts in place of
    y's, and reads the scale."""
    p = fp8_problem(m=7, n=20, world=3)
    plain = dataclasses.replace(p, epilogue="add_rms_norm")
    for schedule in enumerate_schedules(p):
        fp8, y = build_plan(p, schedule, 2), build_plan(plain, schedule, 2)
        assert [(t.stream, t.deps) for t in fp8.tasks] == [(t.stream, t.deps) for t in y.tasks]
        for a, b in zip(fp8.tasks, y.tasks, strict=True):
            if not isinstance(b.op, NormOp):
                assert a.op == b.op
                continue
            rows = b.op.normed.rows
            assert a.op.normed == Region("normed", rows, (0, p.n))
            assert a.op.new_residual == Region("new_residual", rows, (0, p.n))
            assert a.op.scale == Region(NORM_SCALE, (0, 1), (0, 1)) and b.op.scale is None
            assert dataclasses.replace(a.op, normed=b.op.normed, new_residual=b.op.new_residual,
                                       scale=None) == b.op  # fmt: skip


# --- verification ------------------------------------------------------------------------------


def kernel_output(p: Problem, seed: int, scale: torch.Tensor | None) -> tuple:
    """``(normed, new_residual)`` of rank 0 as the kernels compute them: the rank-order fp32
    sum of the partials rounded once, then :func:`add_rms_norm` (with ``scale``: normed as
    FP8 bits; without: unquantized, unsaturated, in real units)."""
    from ficco.execute.buffers import input_seed, random_input

    dtype = torch_dtype(p.dtype)

    def inp(rank: int, name: str, shape) -> torch.Tensor:
        return random_input(shape, dtype, input_seed(seed, rank, name))

    partials = [inp(r, "a", (p.m, p.k)).float() @ inp(r, "b", (p.k, p.n)).float()
                for r in range(p.world)]  # fmt: skip
    residual, weight = inp(0, "residual", (p.m, p.n)), inp(0, "norm_weight", (1, p.n))
    return add_rms_norm(sum(partials).to(dtype), residual, weight, NORM_EPS, scale)


def scale_tensor(scale: float = SCALE) -> torch.Tensor:
    return torch.full((1, 1), scale, dtype=torch.float32)


def quantized(normed: torch.Tensor, scale: float, largest: float | None = E4M3_MAX) -> Quantized:
    """``normed`` (real units) quantized with ``scale`` (a wrong one where it differs from
    the problem's), saturated at ``largest`` (None: not saturated: a cast without
    saturation makes NaN of what passes e4m3's largest, having no infinity), read with the
    problem's scale."""
    scaled = normed.float() / scale
    if largest is not None:
        scaled = scaled.clamp(-largest, largest)
    bits = scaled.to(torch.float8_e4m3fn)  # torch's cast saturates: NaN put in by hand
    bits.view(torch.uint8)[scaled.abs() > E4M3_MAX] = 0x7F
    return Quantized(bits, scale_tensor())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_fp8_part_is_checked_dequantized_element_by_element(dtype):
    """The kernels' arithmetic passes; a wrong scale, a scale not applied, a skipped
    saturation or an unwritten element fails; a wrong residual fails on its own part."""
    p = fp8_problem(m=6, n=32, k=16, dtype=dtype)
    exact, plain = reference_output(p, 0, seed=1)
    assert isinstance(exact, tuple) and exact[0].dtype == torch.float64
    assert (exact[0].abs() >= E4M3_MAX * SCALE).sum() >= 2  # some elements saturate
    bits, new_residual = kernel_output(p, 1, scale_tensor())
    good = (Quantized(bits, scale_tensor()), new_residual)
    check = check_output(good, exact, plain, p, Schedule())
    assert check.ok and check.max_abs_err > 0, check
    normed, _ = kernel_output(p, 1, None)  # before quantizing
    assert check_output((quantized(normed, SCALE), new_residual), exact, plain, p, Schedule()).ok
    unwritten = bits.clone()
    unwritten.view(torch.uint8)[0, 0] = 0x7F  # e4m3fn's NaN: the poison
    wrong = {
        "scale 1.25x": quantized(normed, SCALE * 1.25),
        "scale 0.8x": quantized(normed, SCALE * 0.8),
        "no scale": quantized(normed, 1.0),
        "not saturated": quantized(normed, SCALE, largest=None),
        "saturated at e4m3fnuz's 240": quantized(normed, SCALE, largest=240.0),
        "unwritten": Quantized(unwritten, scale_tensor()),
    }
    for name, part in wrong.items():
        assert not check_output((part, new_residual), exact, plain, p, Schedule()).ok, name
    off = new_residual.clone()
    off[2, 3] += 0.5
    assert not check_output((good[0], off), exact, plain, p, Schedule()).ok


# --- the schedules on CPU ranks ----------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "m"), [("bf16", 8), ("fp32", 5)])
def test_nccl_lamport1_and_lamport2_schedules_verify_against_float64(dtype, m):
    """W = 2 ranks, each a process (lamport: the fused kernels under the interpreter over
    shared files, FP8 out); serial and row chunks of each transport, column chunks and rs_ag
    on nccl."""
    p = fp8_problem(m=m, n=24, k=8, dtype=dtype)
    texts = [f"{g}/{t}/cublas" for t in ("nccl", "lamport1", "lamport2")
             for g in ("serial", "finer-c2-m")]  # fmt: skip
    texts += ["finer-c2-n/nccl/cublas", "shard/nccl/cublas+rs_ag"] if m % 2 == 0 else []
    results = run_problem(p, [Schedule.parse(t) for t in texts], backend="cpu")
    assert [r.schedule for r in results] == texts
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def read_the_wrong_scale(plan):
    """Every norm reads norm_weight's first element as its scale: the wrong scale, as a
    kernel passed the wrong pointer would."""
    tasks = []
    for task in plan.tasks:
        if isinstance(task.op, NormOp):
            wrong = dataclasses.replace(task.op, scale=Region("norm_weight", (0, 1), (0, 1)))
            task = dataclasses.replace(task, op=wrong)
        tasks.append(task)
    return dataclasses.replace(plan, tasks=tuple(tasks))


def test_a_schedule_that_reads_the_wrong_scale_is_incorrect():
    p = fp8_problem(m=4, n=32, k=16, dtype="fp32")
    texts = ["finer-c2-m/nccl/cublas", "serial/lamport1/cublas"]  # unfused, fused
    results = run_problem(
        p, [Schedule.parse(t) for t in texts], backend="cpu", plan_hook=read_the_wrong_scale
    )
    assert [r.verdict.value for r in results] == ["incorrect", "incorrect"], results


@pytest.mark.parametrize(
    ("world", "schedule"),
    [(2, "finer-c2-m/lamport1/cublas"), (3, "serial/lamport2/cublas")],  # 5 rows: 2, 2, 1
)
def test_the_fused_fp8_kernels_through_the_schedule_path_in_one_process(world, schedule):
    p = fp8_problem(m=5, n=40, k=8, world=world, dtype="bf16")
    checks = play_ranks(p, Schedule.parse(schedule))
    assert all(c.ok for c in checks), checks


def test_the_command_line_runs_it():
    from click.testing import CliRunner

    from ficco.cli import main

    args = ["run", "gemm_ar", "--m", "4", "--n", "32", "--k", "8", "-w", "2", "--dtype", "fp32"]
    args += ["--epilogue", "add_rms_norm_fp8", "--backend", "cpu", "-s", "serial/nccl/cublas"]
    ran = CliRunner().invoke(main, [*args, "--json"])
    assert ran.exit_code == 0, ran.output
    answer = json.loads(ran.output)
    assert answer["problem"]["epilogue"] == "add_rms_norm_fp8"
    assert [r["verdict"] for r in answer["results"]] == ["ok"], answer["results"]
