"""ficco.ops drops the per-group state of destroyed groups, and of any group on request."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from ficco.ops import groups, release, runner


@pytest.fixture()
def world_of_one():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        try:
            yield dist.group.WORLD
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def test_release_drops_only_the_named_group(world_of_one):
    cache = groups.group_cache(lambda key, _: key[0])
    sub = dist.new_group([0])
    cache[(world_of_one, 0)] = "world state"
    cache[(sub, 0)] = "sub state"
    assert release(sub) == 1
    assert list(cache.values()) == ["world state"]
    assert release() >= 1
    assert cache == {}


def test_destroyed_groups_are_pruned(world_of_one):
    cache = groups.group_cache(lambda key, _: key[0])
    cache[(world_of_one, 0)] = "state"
    assert groups.prune() == 0  # alive: kept
    dist.destroy_process_group()
    assert not groups.alive(world_of_one)
    assert groups.prune() == 1
    assert cache == {}


def _matmul_all_reduce_twice(a, b):
    from ficco.ops import matmul_all_reduce

    return matmul_all_reduce(a, b), matmul_all_reduce(a, b)


def test_an_op_call_plan_goes_with_its_group(world_of_one):
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    first, again = _matmul_all_reduce_twice(a, b)
    torch.testing.assert_close(first, a @ b)
    torch.testing.assert_close(again, first)
    owned = [c for c in runner._calls.values() if c.group is world_of_one]
    assert len(owned) == 1  # one signature, one cached call plan for this group
    assert release(world_of_one) >= 1
    assert not [c for c in runner._calls.values() if c.group is world_of_one]
    torch.testing.assert_close(_matmul_all_reduce_twice(a, b)[0], a @ b)  # rebuilt on use
    # a destroyed group's call plan is dropped by the next miss in a new world
    dist.destroy_process_group()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        torch.testing.assert_close(_matmul_all_reduce_twice(a, b)[0], a @ b)
        assert all(groups.alive(c.group) for c in runner._calls.values())
        assert not [c for c in runner._calls.values() if c.group is world_of_one]


def test_a_group_of_one_rank_runs_the_matmul(world_of_one):
    """Tensor parallelism of 1 is valid input: each op is its matmul, with gradients."""
    from ficco.ops import all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter

    torch.manual_seed(0)
    a = torch.randn(6, 16, requires_grad=True)
    b = torch.randn(16, 4, requires_grad=True)
    for op in (all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce):
        out = op(a, b)
        torch.testing.assert_close(out, a @ b)
        out.sum().backward()
        torch.testing.assert_close(a.grad, torch.ones(6, 4) @ b.t())
        torch.testing.assert_close(b.grad, a.t() @ torch.ones(6, 4))
        a.grad = b.grad = None
    with pytest.raises(ValueError, match="schedule: .*1 rank"):
        matmul_all_reduce(a.detach(), b.detach(), schedule="serial/nccl/cublas")


def test_calls_passing_the_group_object_hit_the_cache(world_of_one, monkeypatch):
    # Calls that passed a ProcessGroup (as a model's TP group usually is) were never cached:
    # every call agreed with the peers again (a collective and a host sync per op call,
    # ficco's block steps 2x serial's at 2048 tokens on 2 H200s). One miss, then hits.
    from ficco.ops import matmul_all_reduce

    misses = []
    monkeypatch.setattr(runner, "prune", lambda: misses.append(1) or 0)
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    for _ in range(3):
        torch.testing.assert_close(matmul_all_reduce(a, b, world_of_one), a @ b)
    assert len(misses) == 1
    key = runner.signature_key("matmul_all_reduce", a, b, world_of_one.group_name, "", "", ())
    assert runner.signature_key("matmul_all_reduce", a, b, world_of_one, "", "", ()) == key
