"""The model's tasks of overlapped ag_gemm and gemm_rs schedules written straight from the
schedule (``ficco.model.dense``) are the generic path's (``build_plan`` -> ``CostModel.lower``
-> ``SimGraph``) position for position and float for float: the graph (kinds, dependencies,
lanes), each task's work for the schedule's GEMM kind, and the eager host's issue end, on
every such schedule of ``PREDICTED_SPACE`` from W = 2 to 64, on one node and across nodes
(peers beyond the node take the slower link), with ragged chunks."""

from __future__ import annotations

import pytest

from ficco.model import SHIPPED_PARAMS, Predictor, load_machine, load_params
from ficco.model.costs import CostModel, issue_end_ms
from ficco.model.dense import has_dense_lowering, lower_dense
from ficco.model.predict import PREDICTED_SPACE
from ficco.model.simulate import SimGraph, SimTask
from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Schedule, enumerate_schedules

#: (W, machine, (m, n, k)): sizes that cut raggedly along every split (S = 777 rows, N = 1000
#: and K = 999 columns: the last chunk is smaller), on one node and on 2, 4 and 8 nodes (W =
#: 12 puts the node boundary inside the peers' range)
WORLDS = (
    (2, "h200x2", (777 * 2, 1000, 999)),
    (3, "h200x4", (777 * 3, 1000, 999)),
    (4, "h200x4", (777 * 4, 1000, 999)),
    (8, "h200x8", (777 * 8, 1000, 999)),
    (12, "h200x8n2", (777 * 12, 1000, 999)),
    (16, "h200x8n2", (777 * 16, 1000, 999)),
    (32, "h200x8n4", (777 * 32, 1000, 999)),
    (64, "h200x8n8", (777 * 64, 1000, 999)),
)


def generic(costs: CostModel, problem: Problem, schedule: Schedule) -> tuple:
    tasks = costs.lower(build_plan(problem, schedule, 0), schedule)
    return SimGraph(tasks).structure, [t.work_ms for t in tasks], issue_end_ms(tasks)


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs"])
@pytest.mark.parametrize(("world", "machine", "mnk"), WORLDS, ids=lambda v: str(v))
def test_dense_lowering_is_the_generic_lowering(pattern, world, machine, mnk):
    costs = CostModel(load_machine(machine), load_params(SHIPPED_PARAMS))
    m, n, k = mnk
    problem = Problem(pattern=pattern, m=m, n=n, k=k, world=world)
    checked, kinds = 0, set()
    for s in enumerate_schedules(problem, PREDICTED_SPACE):
        if not has_dense_lowering(problem, s):
            continue
        lowered = lower_dense(costs, problem, s)
        structure, work, issue_end = generic(costs, problem, s)
        assert lowered.graph.structure == structure, str(s)
        assert lowered.work_for(costs, s) == work, str(s)  # floats, exactly
        assert lowered.issue_end_ms() == issue_end, str(s)
        checked += 1
        kinds.add((s.granularity.value, s.split.value, s.compute.value, s.order.value))
        kinds.add((s.transport.value, s.gemm.value))
    # every overlapped shape of the space was compared: shard and finer, both splits, per
    # chunk and merged, both orders (W >= 3), both transports and GEMM kinds
    assert ("ce", "triton") in kinds and ("nccl", "cublas") in kinds
    splits = {kind[1] for kind in kinds if len(kind) == 4}
    assert splits == ({"m", "k"} if pattern == "ag_gemm" else {"m", "n"})
    assert {kind[2] for kind in kinds if len(kind) == 4} == {"per_chunk", "merged"}
    if world > 2:
        assert {kind[3] for kind in kinds if len(kind) == 4} == {"ring", "all_peers"}
    assert checked >= (40 if world > 2 else 20)


def test_a_peer_on_another_node_costs_more_to_reach():
    """The link class changes within the peers (the point of building per class)."""
    costs = CostModel(load_machine("h200x8n2"), load_params(SHIPPED_PARAMS))
    problem = Problem(pattern="ag_gemm", m=4096 * 16, n=14336, k=4096, world=16)
    lowered = lower_dense(costs, problem, Schedule.parse("shard/ce/cublas"))
    pulls = lowered.work[:15]  # peers 1 .. 15: 1 .. 7 on rank 0's node
    assert len(set(pulls[:7])) == 1 and len(set(pulls[7:])) == 1
    assert pulls[7] > pulls[0]


def test_only_overlapped_dense_schedules_have_a_dense_lowering():
    costs = CostModel(load_machine("h200x2"), load_params(SHIPPED_PARAMS))
    ag = Problem(pattern="ag_gemm", m=4096, n=1024, k=1024, world=2)
    assert not has_dense_lowering(ag, Schedule())
    with pytest.raises(ValueError, match="schedule: serial/nccl/cublas of ag_gemm has no dense"):
        lower_dense(costs, ag, Schedule())
    fused = next(s for s in enumerate_schedules(ag) if s.compute.value == "fused")
    assert not has_dense_lowering(ag, fused)
    ar = Problem(pattern="gemm_ar", m=4096, n=1024, k=1024, world=2)
    shard = Schedule.parse("shard/ce/cublas")
    assert has_dense_lowering(ag, shard) and not has_dense_lowering(ar, shard)


def test_predict_refuses_an_illegal_schedule_it_is_given():
    """Given schedules, not enumerated ones, are checked before their tasks are written."""
    pr = Predictor(load_machine("h200x4"), load_params(SHIPPED_PARAMS))
    problem = Problem(pattern="ag_gemm", m=30, n=40, k=72, world=3)
    illegal = Schedule(granularity="finer", chunks=64, transport="ce")
    with pytest.raises(ValueError, match="is illegal for ag_gemm.*chunks_fit_extent"):
        pr.predict(problem, [illegal])


def test_a_graph_from_parts_refuses_parts_that_disagree():
    # two tasks on one lane, the second waiting on the first
    kinds, dependents, unmet, queues = ["sm", "ce"], [[1], []], [0, 1], [[0, 1]]
    graph = SimGraph.from_parts(kinds, dependents, unmet, queues)
    assert graph.makespan_ms([1.0, 2.0]) == 3.0
    assert (
        graph.structure
        == SimGraph([SimTask(0, "a", 1.0, "sm"), SimTask(1, "a", 2.0, "ce", (0,))]).structure
    )
    with pytest.raises(ValueError, match="tasks: 2 kinds, 1 dependents lists, 2 dependency"):
        SimGraph.from_parts(kinds, [[1]], unmet, queues)
    with pytest.raises(ValueError, match="3 lane places"):
        SimGraph.from_parts(kinds, dependents, unmet, [[0, 1], [1]])
    with pytest.raises(ValueError, match="tasks: 2 dependencies counted, 1 listed"):
        SimGraph.from_parts(kinds, dependents, [1, 1], queues)


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs"])
def test_predict_on_given_schedules_gives_each_schedules_own_time(pattern):
    """Beyond the predicted space (every transport, 16 chunks, SM reserves: the Triton twins
    recost their GEMMs), given rather than enumerated: each time is the schedule's own."""
    params = load_params(SHIPPED_PARAMS)
    problem = Problem(pattern=pattern, m=777 * 12, n=1000, k=999, world=12)
    schedules = [s for s in enumerate_schedules(problem) if s.compute.value != "fused"]
    assert {s.transport.value for s in schedules} >= {"ce", "nccl", "nccl_ce"}
    assert len({s.sm_reserve for s in schedules}) > 1
    fast = Predictor(load_machine("h200x8n2"), params).predict(problem, schedules)
    assert len(fast.times) == len(schedules)
    for t in fast.times:
        alone = Predictor(load_machine("h200x8n2"), params).schedule_time(
            problem, Schedule.parse(t.schedule)
        )
        assert (t.ms, t.gpu_ms, t.host_ms, t.graphed) == (
            alone.ms,
            alone.gpu_ms,
            alone.host_ms,
            alone.graphed,
        ), t.schedule
