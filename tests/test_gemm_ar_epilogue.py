"""gemm_ar's add_rms_norm epilogue as a problem field (``ficco.patterns.epilogues``): the
field (key, dict, refusals), the plans (a norm behind every whole-row write of ``c``,
the lamport kernels' all-reduces fused with it, column chunks normed once at the end, the output
``y``), verification part by part (a wrong epilogue fails), the schedules verified on CPU
ranks against float64 at W = 2 and 4 in bf16 and fp32, the fused kernel through the
schedule path under the interpreter, the baselines (the unfused sequence, the fused
``comm_lamport``), the shapes CSV column, and the cost model's refusal."""

import dataclasses
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from epilogue_ranks import play_ranks  # noqa: E402

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.execute.reference import reference_output  # noqa: E402
from ficco.execute.run import run_problem  # noqa: E402
from ficco.execute.verify import check_output  # noqa: E402
from ficco.patterns.epilogues import MAX_FUSED_NORM_COLUMNS, NORM_EPS, Epilogue  # noqa: E402
from ficco.plan import CollectiveOp, LocalCopyOp, NormOp, Region, build_plan  # noqa: E402
from ficco.plan.ops import GEMM_OPS  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Gemm, Schedule, SpaceOptions, Transport, enumerate_schedules  # noqa: E402
from ficco.validate import InputError  # noqa: E402


def normed_problem(m=6, n=24, k=8, world=2, dtype="bf16", epilogue="add_rms_norm", **kw):
    return Problem(pattern="gemm_ar", m=m, n=n, k=k, world=world, dtype=dtype,
                   epilogue=epilogue, **kw)  # fmt: skip


# --- the field ---------------------------------------------------------------------------------


def test_the_epilogue_is_a_gemm_ar_field_written_only_when_stated():
    plain = Problem(pattern="gemm_ar", m=4, n=8, k=8, world=2)
    assert plain.epilogue is Epilogue.NONE
    # problems without it keep the key and dict they had before the field existed
    assert plain.key == "gemm_ar:m4:n8:k8:w2:bf16" and "epilogue" not in plain.to_dict()
    normed = dataclasses.replace(plain, epilogue="add_rms_norm")
    assert normed.epilogue is Epilogue.ADD_RMS_NORM and normed != plain
    assert normed.key == "gemm_ar:m4:n8:k8:w2:bf16:add_rms_norm"
    assert normed.to_dict()["epilogue"] == "add_rms_norm"
    assert Problem.from_dict(normed.to_dict()) == normed
    assert Problem.from_dict(plain.to_dict()) == plain


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        (dict(pattern="gemm_ar", epilogue="layer_norm"), "epilogue", "must be one of none"),
        (dict(pattern="gemm_ar", dtype="fp8_e4m3", epilogue="add_rms_norm"), "epilogue",
         "takes plain dtypes"),
        (dict(pattern="gemm_rs", epilogue="add_rms_norm"), "epilogue", "only gemm_ar takes it"),
    ],
)  # fmt: skip
def test_a_bad_epilogue_is_refused_naming_the_field(kwargs, field, rule):
    with pytest.raises(InputError, match=rule) as err:
        Problem(**{"m": 4, "n": 16, "k": 16, "world": 2, **kwargs})
    assert err.value.field == field


def test_the_shapes_csv_carries_the_epilogue_column(tmp_path):
    from ficco.workloads import read_shapes_csv, write_shapes_csv

    problems = [
        normed_problem(name="l.o_proj"),
        normed_problem(name="l.o_proj_fp8", epilogue="add_rms_norm_fp8"),
        Problem(pattern="gemm_ar", m=6, n=24, k=8, world=2, name="l.down"),
        Problem(pattern="ag_gemm", m=8, n=24, k=8, world=2, name="l.qkv"),
    ]
    path = tmp_path / "shapes.csv"
    write_shapes_csv(problems, path)
    assert path.read_text().splitlines()[0].endswith(",experts,epilogue")
    assert read_shapes_csv(path) == problems
    write_shapes_csv(problems[2:], path)  # no problem states it: no column
    assert "epilogue" not in path.read_text()


# --- the plans ---------------------------------------------------------------------------------


def ops_of(plan, kind):
    return [t.op for t in plan.tasks if isinstance(t.op, kind)]


def test_every_schedule_writes_every_element_of_y_once_after_c_is_final():
    """Every legal schedule of two problems (W = 2 and 3, a ragged M): the norms cover every
    row once, each reads whole rows, and each waits on the tasks that wrote them."""
    for p in (normed_problem(m=6, n=24, world=2), normed_problem(m=7, n=20, world=3)):
        for schedule in enumerate_schedules(p):
            plan = build_plan(p, schedule, 1)
            assert plan.output == "y" and plan.buffer("y").shape == (2, p.m, p.n)
            assert plan.buffer("c").role == "workspace"
            covered = torch.zeros(p.m, dtype=torch.int64)
            for task in plan.tasks:
                op = task.op
                if not isinstance(op, NormOp):
                    continue
                (r0, r1), whole = op.summed.rows, (0, p.n)
                assert op.summed.cols == op.residual.cols == op.normed.cols == whole
                assert (op.normed.index, op.new_residual.index) == (0, 1)
                assert op.eps == NORM_EPS and op.weight == Region("norm_weight", (0, 1), whole)
                assert task.deps, (str(schedule), task)
                covered[r0:r1] += 1
            assert (covered == 1).all(), (str(schedule), covered)


def test_the_lamport_kernels_fuse_the_norm_into_each_chunk_and_the_others_norm_after():
    p = normed_problem(m=9, n=16)
    for transport in ("lamport1", "lamport2"):
        fused = build_plan(p, Schedule.parse(f"finer-c2-m/{transport}/cublas"), 0)
        assert not ops_of(fused, CollectiveOp)  # the all-reduce is the norm's own launch
        kind = Transport(transport).traits.all_reduce_kind
        assert [(n.all_reduce, n.summed) for n in ops_of(fused, NormOp)] == [
            (kind, Region("partial", (0, 5), (0, 16))),
            (kind, Region("partial", (5, 9), (0, 16))),
        ]
    for transport in ("nccl", "symm1", "symm2"):
        plan = build_plan(p, Schedule.parse(f"finer-c2-m/{transport}/cublas"), 0)
        kinds = [type(t.op).__name__ for t in plan.tasks]
        # each chunk: its GEMM, its all-reduce into c, that chunk's norm right behind it
        assert kinds == ["GemmOp", "CollectiveOp", "NormOp"] * 2, transport
        assert all(n.all_reduce is None and n.summed.buffer == "c" for n in ops_of(plan, NormOp))
    # column chunks: no row is whole before the last one, one norm over all rows after both
    split_n = build_plan(p, Schedule.parse("finer-c2-n/nccl/cublas"), 0)
    (norm,) = ops_of(split_n, NormOp)
    assert norm.summed == Region("c", (0, 9), (0, 16)) and len(split_n.tasks[-1].deps) == 2
    # rows wider than the fused kernels': lamport1 all-reduces, then the norm runs unfused
    wide = normed_problem(m=1, n=MAX_FUSED_NORM_COLUMNS + 8)
    plan = build_plan(wide, Schedule.parse("serial/lamport1/cublas"), 0)
    assert [type(t.op).__name__ for t in plan.tasks] == ["GemmOp", "CollectiveOp", "NormOp"]


def test_the_residual_and_weight_are_the_same_on_every_rank_and_a_is_not():
    """Tensor-parallel decode replicates the hidden state and the norm weight (the two-shot
    kernel adds each owner's residual to the rows it reduces): drawn alike on every rank."""
    from ficco.execute.buffers import allocate

    p = normed_problem(m=3, n=8, world=3)
    ranks = [allocate(build_plan(p, Schedule(), r), seed=5) for r in range(3)]
    for name in ("residual", "norm_weight"):
        assert all(torch.equal(t[name], ranks[0][name]) for t in ranks[1:]), name
    assert not torch.equal(ranks[0]["a"], ranks[1]["a"])
    exact = [reference_output(p, r, seed=5)[0] for r in range(3)]
    assert all(torch.equal(e, exact[0]) for e in exact[1:])  # one output, on every rank


# --- verification ------------------------------------------------------------------------------


def test_a_wrong_epilogue_fails_verification_part_by_part():
    """The reference's plain output passes; the same with the norm skipped, the weight
    dropped or the residual not added fails (each part checked against its own scale)."""
    p = normed_problem(m=4, n=32, k=16, world=2, dtype="fp32")
    exact, plain = reference_output(p, 0, seed=1)
    schedule = Schedule()
    assert check_output(plain.clone(), exact, plain, p, schedule).ok
    skipped = plain.clone()
    skipped[0] = skipped[1]  # normed = the new residual, not normalized
    weightless = plain.clone()
    x = plain[1].double()
    weightless[0] = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)).float()
    no_residual = plain.clone()
    from ficco.execute.buffers import input_seed, random_input

    residual = random_input((4, 32), torch.float32, input_seed(1, 0, "residual"))
    no_residual[1] -= residual
    for wrong in (skipped, weightless, no_residual):
        check = check_output(wrong, exact, plain, p, schedule)
        assert not check.ok and check.max_abs_err > check.tolerance


def skip_the_norm(plan):
    """After every norm task, its new residual copied over its normed rows: the rows stored
    as if the norm were skipped (the residual added, nothing else wrong)."""
    tasks = list(plan.tasks)
    for task in plan.tasks:
        if isinstance(task.op, NormOp):
            skipped = LocalCopyOp(task.op.new_residual, task.op.normed)
            tasks.append(dataclasses.replace(task, id=len(tasks), op=skipped, deps=(task.id,)))
    return dataclasses.replace(plan, tasks=tuple(tasks))


def test_a_schedule_whose_norm_is_skipped_is_incorrect():
    p = normed_problem(m=4, n=32, k=16, world=2, dtype="fp32")
    (result,) = run_problem(
        p, [Schedule.parse("finer-c2-m/nccl/cublas")], backend="cpu", plan_hook=skip_the_norm
    )
    assert result.verdict.value == "incorrect", result


# --- the schedules on CPU ranks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "dtype", "m"), [(2, "bf16", 8), (2, "fp32", 6), (4, "bf16", 4), (4, "fp32", 4)]
)
def test_nccl_lamport1_and_lamport2_schedules_verify_against_float64(world, dtype, m):
    """Every rank a process (lamport: the kernels under the interpreter over shared files,
    with the fused epilogue); serial and row chunks of each transport, column
    chunks and rs_ag on nccl (few rows at W = 4: the interpreter runs a program a row)."""
    p = normed_problem(m=m, n=24, k=8, world=world, dtype=dtype)
    texts = [f"{g}/{t}/cublas" for t in ("nccl", "lamport1", "lamport2")
             for g in ("serial", "finer-c2-m")]  # fmt: skip
    texts += ["finer-c2-n/nccl/cublas", "shard/nccl/cublas+rs_ag"]
    results = run_problem(p, [Schedule.parse(t) for t in texts], backend="cpu")
    assert [r.schedule for r in results] == texts
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def test_every_transport_verifies_with_the_epilogue():
    p = normed_problem(m=6, n=24, k=8, world=2, dtype="fp32")
    space = SpaceOptions(gemms=(Gemm.CUBLAS,), chunk_counts=(2,))
    schedules = [s for s in enumerate_schedules(p, space) if s.comm_priority.value == "normal"]
    assert {s.transport.value for s in schedules} >= {"ce", "nccl", "symm1", "symm2", "lamport1"}
    results = run_problem(p, schedules, backend="cpu")
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


@pytest.mark.parametrize(
    ("world", "schedule"),
    [
        (2, "serial/lamport1/cublas"),
        (4, "finer-c2-m/lamport1/cublas"),
        (3, "serial/lamport2/cublas"),  # 5 rows: slices of 2, 2, 1 rows
        (4, "finer-c2-m/lamport2/cublas"),  # a chunk of 2 rows: two slices empty
    ],
)
def test_the_fused_kernels_through_the_schedule_path_in_one_process(world, schedule):
    """Every rank's lamport plan played in this process under the interpreter: each norm
    task is the fused kernel's launch on the plan's buffers, each rank's y verified."""
    p = normed_problem(m=5, n=40, k=8, world=world, dtype="fp32")
    checks = play_ranks(p, Schedule.parse(schedule))
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("epilogue", ["add_rms_norm", "add_rms_norm_fp8"])
def test_the_baselines_time_the_unfused_sequence_beside_the_fused_launch(epilogue):
    """comm_alone is the serial plan's all-reduce and its unfused norm; comm_lamport the
    serial lamport1 plan's, the fused launch; the serial baseline's output is y (FP8: its
    parts)."""
    p = normed_problem(m=4, n=32, k=8, world=2, dtype="fp32", epilogue=epilogue)
    serial = Schedule.parse("serial/nccl/cublas")
    # what the interpreter's comm mode runs: every task but the GEMMs
    comm = [t.op for t in build_plan(p, serial, 0).tasks if not isinstance(t.op, GEMM_OPS)]
    assert [type(op).__name__ for op in comm] == ["CollectiveOp", "NormOp"]
    timing = TimingOptions(rounds=1, warmup=0)
    results = run_problem(p, [serial], backend="cpu", options=RunOptions(timing=timing))
    by = {r.schedule: r for r in results}
    for name in ("serial/nccl/cublas", "gemm_alone", "comm_alone", "comm_lamport"):
        assert by[name].ok, (name, by[name].detail)


def test_the_cost_model_refuses_the_epilogue_by_name():
    from ficco.model.predict import predict_problem

    for epilogue in ("add_rms_norm", "add_rms_norm_fp8"):
        with pytest.raises(
            ValueError, match=f"epilogue: the cost model has no price for {epilogue}"
        ):
            predict_problem(normed_problem(m=4, n=64, k=64, world=2, epilogue=epilogue))
    plain = Problem(pattern="gemm_ar", m=4, n=64, k=64, world=2)
    assert predict_problem(plain).times  # the problem without it is predicted as before


def test_the_command_line_takes_the_epilogue_and_says_so():
    from click.testing import CliRunner

    from ficco.cli import main

    runner = CliRunner()
    shown = runner.invoke(main, ["run", "--help"], terminal_width=200)
    # the choices are the declaration's (every Epilogue value), in the option and the CSV's
    assert "--epilogue [none|add_rms_norm|add_rms_norm_fp8]" in shown.output
    assert "add_rms_norm_fp8, the same with normed in FP8 e4m3" in shown.output
    swept = runner.invoke(main, ["sweep", "--help"], terminal_width=200)
    want = "(epilogue: gemm_ar, none | add_rms_norm | add_rms_norm_fp8, default none)"
    assert want in " ".join(swept.output.split())
    args = ["run", "gemm_ar", "--m", "4", "--n", "32", "--k", "8", "-w", "2", "--dtype", "fp32"]
    args += ["--epilogue", "add_rms_norm", "--backend", "cpu", "-s", "finer-c2-m/nccl/cublas"]
    ran = runner.invoke(main, [*args, "--json"])
    assert ran.exit_code == 0, ran.output
    answer = json.loads(ran.output)
    assert answer["problem"]["epilogue"] == "add_rms_norm"
    assert [r["verdict"] for r in answer["results"]] == ["ok"], answer["results"]
