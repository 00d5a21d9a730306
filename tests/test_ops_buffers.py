"""ficco.ops' symmetric buffers come from size classes: token counts that change every step
share a few allocations (each one rendezvous), handed out as views of their first rows."""

import types

import torch

import ficco
from ficco.ops import cuda as ops_cuda
from ficco.plan import build_plan
from ficco.space import Schedule


def test_class_rows_are_powers_of_two_from_the_minimum():
    assert [ops_cuda.class_rows(r) for r in (1, 64, 65, 100, 128, 129, 5000)] == [
        64, 64, 128, 128, 128, 256, 8192,
    ]  # fmt: skip


class FakeGroup:
    """Hashable by identity, like a ProcessGroup."""

    group_name = "g0"


def test_counts_of_one_class_share_one_allocation(monkeypatch):
    made = []

    def empty(shape, dtype, device):
        made.append(tuple(shape))
        return torch.zeros(shape, dtype=dtype)

    fake = types.SimpleNamespace(empty=empty, rendezvous=lambda t, name: ("handle", t.shape))
    monkeypatch.setattr(torch.distributed, "_symmetric_memory", fake, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed._symmetric_memory", fake)
    monkeypatch.setattr(ops_cuda, "_pool", {})
    monkeypatch.setattr(ops_cuda, "_symmetric", {})
    monkeypatch.setattr(ops_cuda, "shares_gpu", lambda group: False)  # an NCCL group's path
    group = FakeGroup()
    schedule = Schedule.parse("shard/ce/cublas")
    views = {}
    for tokens in (200, 240, 256, 200, 300):  # shard rows 100, 120, 128, 100, 150
        p = ficco.Problem(pattern="ag_gemm", m=tokens, n=16, k=32, world=2)
        tensors, handles = ops_cuda.symmetric_buffers(build_plan(p, schedule, 0), group, "cpu")
        views[tokens] = tensors["a_shard"]
        assert tensors["a_shard"].shape == (tokens // 2, 32)
        assert handles["a_shard"][0] == "handle"
    # 100, 120 and 128 rows share the 128-row class; 150 rows need the 256-row class
    assert made == [(128, 32), (256, 32)]
    assert views[200].data_ptr() == views[240].data_ptr() == views[256].data_ptr()
    assert views[300].data_ptr() != views[200].data_ptr()
