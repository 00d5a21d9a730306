"""The buffers a backend allocates once per problem serve every schedule it runs: a buffer
one schedule's plan makes peer-visible (a relay's ``a_full``, pushed into by the previous
rank) is allocated peer-visible (symmetric memory on GPUs), and only then."""

import pytest

from ficco.execute.buffers import allocate, harness_plan
from ficco.execute.measure import measure_problem
from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Schedule

AG = Problem(pattern="ag_gemm", m=64, n=16, k=8, world=4, dtype="fp32")
RELAY = Schedule.parse("shard/ce/cublas+relay")
SHARD = Schedule.parse("shard/ce/cublas")


@pytest.mark.parametrize("rank", [0, 3])
def test_a_buffer_peer_visible_in_a_schedules_plan_is_allocated_peer_visible(rank):
    assert build_plan(AG, RELAY, rank).buffers != build_plan(AG, SHARD, rank).buffers
    alone = {b.name: b for b in harness_plan(AG, rank, [SHARD]).buffers}
    with_relay = {b.name: b for b in harness_plan(AG, rank, [SHARD, RELAY]).buffers}
    assert not alone["a_full"].peer_visible and with_relay["a_full"].peer_visible
    # nothing else changes: names, shapes and roles are the serial plan's
    assert {n: (b.shape, b.role) for n, b in with_relay.items()} == {
        b.name: (b.shape, b.role) for b in build_plan(AG, Schedule(), rank).buffers
    }
    made = []

    def peer_visible_empty(shape, dtype, device, name):
        made.append(name)
        import torch

        return torch.empty(shape, dtype=dtype)

    allocate(harness_plan(AG, rank, [RELAY]), 0, peer_visible_empty=peer_visible_empty)
    assert sorted(made) == ["a_full", "a_shard"]


class _Allocated(Exception):
    pass


class RecordingBackend:
    """Stands in for a backend: records what ``allocate`` was asked for, then stops."""

    def allocate(self, problem, seed, schedules=()):
        self.asked = (problem, list(schedules))
        raise _Allocated


def test_a_problems_buffers_are_allocated_for_the_schedules_it_runs():
    backend = RecordingBackend()
    with pytest.raises(_Allocated):
        measure_problem(backend, AG, [SHARD, RELAY], 0, None, lambda message: None)
    assert backend.asked == (AG, [SHARD, RELAY])
