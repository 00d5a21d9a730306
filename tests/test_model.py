"""The cost model: simulator, calibration on synthetic records, parameters file, predict CLI,
recommend's model fallback, machine descriptions."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ficco.model import (
    SHIPPED_PARAMS,
    Predictor,
    SimTask,
    load_machine,
    load_params,
    params_from_dict,
    simulate,
)
from ficco.problem import Problem
from ficco.space import Schedule

# --- simulator on hand-built plans ---


def test_one_lane_runs_serially_and_sums():
    tasks = [SimTask(0, "compute", 1.0, "sm"), SimTask(1, "compute", 2.5, "sm")]
    result = simulate(tasks)
    assert result.makespan_ms == pytest.approx(3.5)
    assert result.start_ms[1] == pytest.approx(1.0)


def test_two_lanes_without_contention_overlap_perfectly():
    tasks = [SimTask(0, "compute", 3.0, "sm"), SimTask(1, "comm", 2.0, "ce")]
    assert simulate(tasks).makespan_ms == pytest.approx(3.0)


def test_dependencies_are_respected_across_lanes():
    tasks = [
        SimTask(0, "comm", 2.0, "ce"),
        SimTask(1, "compute", 1.0, "sm", deps=(0,)),
        SimTask(2, "compute", 1.0, "sm"),  # queued behind task 1 on the compute lane
    ]
    result = simulate(tasks)
    assert result.start_ms[1] == pytest.approx(2.0)
    assert result.start_ms[2] == pytest.approx(3.0)
    assert result.makespan_ms == pytest.approx(4.0)


def test_contention_slows_both_while_they_overlap():
    tasks = [SimTask(0, "compute", 2.0, "sm"), SimTask(1, "comm", 1.0, "nccl")]
    # nccl at half rate while the GEMM runs: 1 ms of work takes 2 ms; the GEMM at 1/1.5 rate
    result = simulate(tasks, {("sm", "nccl"): 0.5, ("nccl", "sm"): 1.0})
    assert result.finish_ms[1] == pytest.approx(2.0)
    # the GEMM did 2 / 1.5 ms of work by then, the rest alone
    assert result.finish_ms[0] == pytest.approx(2.0 + (2.0 - 2.0 / 1.5))


def test_a_cycle_is_refused_by_name():
    tasks = [SimTask(0, "a", 1.0, "sm", deps=(1,)), SimTask(1, "b", 1.0, "sm", deps=(0,))]
    with pytest.raises(ValueError, match="can never start"):
        simulate(tasks)


def test_host_issue_times_delay_starts_unless_ignored():
    tasks = [SimTask(0, "compute", 1.0, "sm", issue_ms=5.0)]
    assert simulate(tasks).makespan_ms == pytest.approx(6.0)
    assert simulate(tasks, issue=False).makespan_ms == pytest.approx(1.0)


# --- calibration reproduces the parameters that made synthetic records ---


def _records_from(predictor: Predictor, problems: list[Problem], names: list[str]) -> list[dict]:
    """Records whose comm-side task times the model itself computes (the synthetic truth)."""
    from ficco.plan import build_plan

    records = []
    for p in problems:
        for name in names:
            s = Schedule.parse(name)
            tasks = predictor.costs.lower(build_plan(p, s, 0))
            comm = sum(t.work_ms for t in tasks if t.terms)
            gemm = sum(t.work_ms for t in tasks if not t.terms and t.lane == "compute")
            records.append(
                {
                    "problem": p.to_dict(),
                    "name": name,
                    "kind": "schedule",
                    "verdict": "ok",
                    "median_ms": predictor.schedule_time(p, s).ms,
                    "gemm_tasks_alone_ms": gemm,
                    "comm_tasks_alone_ms": comm,
                }
            )
    return records


def test_transfer_fit_recovers_synthetic_fixed_costs_and_efficiencies():
    from ficco.model.calibrate import fit_transfers, samples_from_records
    from ficco.model.costs import CostModel

    params = load_params(SHIPPED_PARAMS)
    truth = dict(params.transfer, ce_fixed_ms=0.011, ce_eff=0.7, p2p_fixed_ms=0.025, p2p_eff=0.45)
    truth.update(all_gather_fixed_ms=0.03, all_gather_eff=0.6)
    # a pushed copy-engine copy (gemm_rs) is its own class beside the pulled one (ag_gemm)
    truth.update(ce_push_fixed_ms=0.017, ce_push_eff=0.9, reduce_fixed_ms=0.004, reduce_eff=0.55)
    machine = load_machine("h200x2")
    # no span overhead in the truth: the synthetic comm sums are the isolated spans themselves
    host = dict(params.host, span_ms=0.0)
    predictor = Predictor(machine, dataclasses.replace(params, transfer=truth, host=host))
    problems = [
        Problem(pattern="ag_gemm", m=m, n=4096, k=k, world=2)
        for m in (512, 2048, 8192)
        for k in (1024, 4096, 8192)
    ]
    names = ["serial/nccl/cublas", "shard/ce/cublas", "finer-c4-m/ce/cublas", "shard/nccl/cublas"]
    records = _records_from(predictor, problems, names)
    scatters = [Problem(pattern="gemm_rs", m=p.m, n=p.n, k=p.k, world=2) for p in problems]
    # at W = 2 each push comes with one reduction: the NCCL scatters (p2p + the same
    # reduction) separate the reduction's fixed cost from the push's
    rs_names = ["serial/ce/cublas", "shard/ce/cublas", "finer-c4-m/ce/cublas", "shard/nccl/cublas"]
    records += _records_from(predictor, scatters, rs_names)
    samples, _ = samples_from_records(records)
    fitted = fit_transfers(samples, CostModel(machine, params))
    keys = ("ce_fixed_ms", "ce_eff", "p2p_fixed_ms", "p2p_eff", "all_gather_eff")
    for key in (*keys, "ce_push_fixed_ms", "ce_push_eff", "reduce_fixed_ms", "reduce_eff"):
        assert fitted[key] == pytest.approx(truth[key], rel=1e-3), key


# --- the parameters file ---


def test_shipped_parameters_load_and_a_corrupt_file_is_refused(tmp_path):
    params = load_params(SHIPPED_PARAMS)
    assert params.machine == "h200x2"
    data = json.loads(SHIPPED_PARAMS.read_text())
    bad = tmp_path / "model.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_params(bad)
    wrong = dict(data, schema="ficco.model/0")
    with pytest.raises(ValueError, match="schema must be"):
        params_from_dict(wrong)
    missing = json.loads(json.dumps(data))
    del missing["transfer"]["ce_eff"]
    with pytest.raises(ValueError, match=r"missing \['ce_eff'\]"):
        params_from_dict(missing)
    negative = json.loads(json.dumps(data))
    negative["contention"]["ce_gemm"] = -1
    with pytest.raises(ValueError, match="contention.ce_gemm must be finite and >= 0"):
        params_from_dict(negative)


# --- predictions ---


def test_serial_prediction_is_gemm_plus_collective_and_ideal_bounds_it():
    pr = Predictor(load_machine("h200x2"), load_params(SHIPPED_PARAMS))
    p = Problem(pattern="ag_gemm", m=8192, n=8192, k=8192, world=2)
    prediction = pr.predict(p)
    gemm, comm = pr.parts_ms(p)
    assert prediction.serial_ms == pytest.approx(gemm + comm)
    assert prediction.ideal_ms == pytest.approx(max(gemm, comm))
    assert prediction.best.ms == min(t.ms for t in prediction.times)
    assert prediction.best.ms < prediction.serial_ms  # an overlapped schedule wins here (FACTS)


def test_a_problem_larger_than_the_machine_is_refused():
    pr = Predictor(load_machine("h200x2"), load_params(SHIPPED_PARAMS))
    with pytest.raises(ValueError, match="world: 4 ranks do not fit machine h200x2"):
        pr.predict(Problem(pattern="ag_gemm", m=8192, n=8192, k=8192, world=4))


def test_machine_descriptions_load_and_say_whether_measured():
    w8 = load_machine("h200x8")
    assert (w8.world, w8.measured) == (8, False)
    cluster = load_machine("h200x8n4")
    assert cluster.world == 32 and cluster.link_between(0, 9).gbs_per_direction == 50
    assert cluster.link_between(0, 7).gbs_per_direction == 450
    assert load_machine("h200x2").measured
    with pytest.raises(ValueError, match="no description named 'h100x3'"):
        load_machine("h100x3")


def test_a_multi_node_machine_without_a_nic_is_refused(tmp_path):
    from ficco.model.machine import MACHINES_DIR

    data = json.loads((MACHINES_DIR / "h200x8n2.json").read_text())
    del data["links"]["nic"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="needs a nic entry"):
        load_machine(path)


# --- the CLI and recommend ---


def test_predict_cli_prints_every_schedule_and_the_winner():
    from ficco.cli import main

    result = CliRunner().invoke(
        main,
        [
            "predict",
            "ag_gemm",
            "--m",
            "8192",
            "--n",
            "8192",
            "--k",
            "8192",
            "--world",
            "8",
            "--machine",
            "h200x8",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["machine"] == "h200x8" and out["machine_measured"] is False
    assert out["best"] == out["times"][0]["schedule"]
    assert len(out["times"]) > 10 and out["serial_ms"] > out["ideal_ms"] > 0
    text = CliRunner().invoke(
        main,
        ["predict", "gemm_rs", "--m", "4096", "--n", "8192", "--k", "4096", "--world", "2"],
    )
    assert text.exit_code == 0 and "predicted winner: " in text.output


def test_predict_and_recommend_fallback_import_no_torch():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from ficco.cli import main\n"
        "r = CliRunner().invoke(main, ['predict', 'ag_gemm', '--m', '4096', '--n', '4096',"
        " '--k', '4096', '--world', '4', '--machine', 'h200x4'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in ('torch', 'triton', 'sklearn', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_recommend_without_a_table_answers_from_the_model_and_says_so():
    import ficco.api as api

    rec = api.recommend(Problem(pattern="gemm_rs", m=8192, n=8192, k=2048, world=4), "h200x4")
    assert "cost model" in rec.reason and any("source: model" in n for n in rec.notes)
    assert Schedule.parse(rec.schedule)
    assert rec.predicted_speedup is not None and math.isfinite(rec.predicted_speedup)


def test_reduction_traffic_follows_the_executor():
    from ficco.model.costs import reduce_traffic

    assert reduce_traffic(2) == (1, 3)  # one add: read two chunks, write one
    # fp32 accumulator: cast (1 + 2), three adds (3 x (2 + 1 + 2)), cast back (2 + 1)
    assert reduce_traffic(4) == (5, 21)


def test_fused_schedules_are_left_out_and_refused_by_name():
    import pytest

    import ficco
    from ficco.model import predictor

    p = ficco.Problem(pattern="ag_gemm", m=4096, n=4096, k=4096, world=2)
    predicted = predictor("h200x2").predict(p)
    assert predicted.times and not any("+fused" in t.schedule for t in predicted.times)
    with pytest.raises(ValueError, match="fused"):
        predictor("h200x2").schedule_time(p, ficco.Schedule.parse("shard/ce/triton+fused"))
