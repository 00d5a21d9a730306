"""The cost model prices emb_a2a: embedding pooling by the bytes it gathers and writes over the
machine description's gather bandwidth (fitted on one H100, derived for the H200s), its
transfers as calibrated; every schedule of the predicted space gets a time."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, load_machine, load_params, machine_names
from ficco.model.gather import PROFILE, derived_entry, fit_gather
from ficco.model.predict import PREDICTED_SPACE
from ficco.model.simulate import makespan_ms
from ficco.patterns import emb_a2a as emb
from ficco.plan import PoolOp, build_plan
from ficco.problem import Problem
from ficco.space import Schedule, enumerate_schedules

TABLES = (400_000, 3_000, 60, 90_000, 1_000_000, 12)


def emb_problem(**kw) -> Problem:
    base = dict(pattern="emb_a2a", m=8192, n=128, k=8, world=2, tables=TABLES, dtype="bf16")
    return Problem(**{**base, **kw})


def predictor(name: str = "h200x2") -> Predictor:
    return Predictor(load_machine(name), load_params(SHIPPED_PARAMS))


def test_every_shipped_machines_gather_entry_is_derived_from_the_h100_profile():
    fit = fit_gather(json.loads(PROFILE.read_text()))
    # the Triton kernel streams near the H100's HBM figure, torch's EmbeddingBag far below it
    assert 0.8 < fit.triton_eff < 1.1 and 0.1 < fit.torch_eff < 0.4 and fit.points == 6
    for name in machine_names():
        data = json.loads(_raw(name))
        assert data["gather"] == derived_entry(data["hbm_gbs"], fit), name
        gather = load_machine(name).gather
        assert gather.derived and gather.source.startswith("derived, not measured"), name


def _raw(name: str) -> str:
    from ficco.model.machine import MACHINES_DIR

    return (MACHINES_DIR / f"{name}.json").read_text()


def test_the_model_counts_the_rows_the_bags_gather():
    """Per-table fixed bag sizes: the model's count is the drawn bags' own (uniform bags: the
    mean, k per bag)."""
    p = Problem(pattern="emb_a2a", m=10, n=8, k=3, world=2, tables=(50, 7, 300), bags=(3, 1, 2))
    for rank, (t0, t1) in enumerate(emb.table_ranges(p)):
        offsets = emb.lookups(p, rank)["offsets"]
        for bags in [(0, (t1 - t0) * p.m), (3, 14), (9, 11)]:
            if bags[1] <= (t1 - t0) * p.m:
                drawn = int(offsets[bags[1]] - offsets[bags[0]])
                assert emb.gathered_rows(p, rank, bags) == drawn, (rank, bags)
    uniform = dataclasses.replace(p, bags="uniform")
    assert emb.gathered_rows(uniform, 0, (0, 20)) == 20 * 3


def test_pooling_costs_grow_with_its_bytes_and_triton_pools_faster_than_torch():
    costs = predictor().costs
    triton = Schedule.parse("shard/ce/triton")
    assert costs.pool_ms(None, 2e8) > costs.pool_ms(None, 1e8) > costs.pool_ms(None, 0) > 0
    assert costs.pool_ms(None, 1e8) > costs.pool_ms(triton, 1e8)


def test_every_schedule_of_the_predicted_space_gets_a_time():
    for name, world in (("h200x2", 2), ("h200x8", 8)):
        p = emb_problem(world=world, tables=TABLES + TABLES[:2])
        prediction = predictor(name).predict(p)
        expected = {str(s) for s in enumerate_schedules(p, PREDICTED_SPACE)}
        assert {t.schedule for t in prediction.times} == expected and len(expected) > 20
        assert all(math.isfinite(t.ms) and t.ms > 0 for t in prediction.times)
        assert prediction.to_dict()["pattern_calibrated"] is False  # reused, not calibrated


def test_more_bytes_take_longer_and_no_schedule_beats_its_own_lanes():
    pr = predictor()
    small, large = emb_problem(), emb_problem(k=32)  # 4x the rows gathered
    t_small = {t.schedule: t for t in pr.predict(small).times}
    t_large = {t.schedule: t for t in pr.predict(large).times}
    # the GPU's time grows; an eager schedule's host issue may still bound both
    assert all(t_large[s].gpu_ms > t_small[s].gpu_ms for s in t_small)
    assert all(t_large[s].ms >= t_small[s].ms for s in t_small)
    # a captured schedule pays no host issue, so its time grows with the GPU's (serial NCCL is
    # issued eagerly: NCCL all-to-alls are kept out of graphs, and its host issue bounds both)
    assert t_large["serial/ce/cublas"].ms > t_small["serial/ce/cublas"].ms
    assert not t_small["serial/nccl/cublas"].graphed and t_small["serial/ce/cublas"].graphed
    wide = emb_problem(n=256)  # twice the bytes gathered and moved
    assert pr.parts_ms(wide)[0] > pr.parts_ms(small)[0]
    assert pr.parts_ms(wide)[1] > pr.parts_ms(small)[1]
    for p in (small, large, wide):
        prediction = pr.predict(p)
        assert prediction.ideal_ms <= prediction.serial_ms
        serial = {t.schedule: t for t in prediction.times}["serial/nccl/cublas"]
        assert serial.ms >= prediction.ideal_ms
        # overlapped: never below the busiest lane's work (the overlapped bound)
        for text in ("shard/ce/cublas", "finer-c4-m/ce/triton", "finer-c2-m/nccl/cublas+merged"):
            s = Schedule.parse(text)
            tasks = pr.costs.lower(build_plan(p, s, 0), s)
            lanes = {t.lane for t in tasks}
            busiest = max(sum(t.work_ms for t in tasks if t.lane == lane) for lane in lanes)
            assert makespan_ms(tasks, pr.costs.slowdown) >= busiest - 1e-12, text
            pools = [t for t in build_plan(p, s, 0).tasks if isinstance(t.op, PoolOp)]
            assert len(pools) >= 2, text  # chunked: pooling overlaps the pushes


def test_a_machine_without_a_gather_entry_refuses_emb_a2a_naming_it(tmp_path):
    from ficco.model.machine import MACHINES_DIR

    data = json.loads((MACHINES_DIR / "h200x2.json").read_text())
    del data["gather"]
    path = tmp_path / "nogather.json"
    path.write_text(json.dumps(data))
    pr = Predictor(load_machine(path), load_params(SHIPPED_PARAMS))
    with pytest.raises(ValueError, match="has no gather entry"):
        pr.predict(emb_problem())
    ag = Problem(pattern="ag_gemm", m=4096, n=4096, k=4096, world=2)
    assert pr.predict(ag).times  # the other patterns need no gather figure
    data["gather"] = {**json.loads(_raw("h200x2"))["gather"], "triton_gbs": 0}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bandwidths must be > 0"):
        load_machine(path)


def test_a_batch_chunks_runs_are_priced_together():
    """A batch chunk (split b) moves a run per table under one tag: an NCCL batch of them
    costs all their bytes, so b and m chunkings move the same bytes in all."""
    pr, p = predictor(), emb_problem(world=2)
    link = {}
    for text in ("finer-c2-m/nccl/cublas", "finer-c2-b/nccl/cublas", "finer-c2-b/ce/cublas"):
        s = Schedule.parse(text)
        tasks = pr.costs.lower(build_plan(p, s, 0), s)
        link[text] = sum(ms for t in tasks if t.lane == "comm" for _, _, ms in t.terms)
        assert {str(s) for s in enumerate_schedules(p, PREDICTED_SPACE)} >= {text}
    m, b = link["finer-c2-m/nccl/cublas"], link["finer-c2-b/nccl/cublas"]
    assert b == pytest.approx(m, rel=1e-9) and m > 0
    assert link["finer-c2-b/ce/cublas"] > 0
