"""The one RankContext set-up (``ficco.execute.cuda_setup.rank_context``), without a GPU: the
streams and the SM count come from torch.cuda, stood in for here."""

import types

import torch

from ficco.execute.cuda_setup import STREAM_PRIORITIES, rank_context
from ficco.space import Priority


def test_every_context_gets_its_streams_at_each_priority_and_the_sm_count(monkeypatch):
    made = []

    class Stream:
        def __init__(self, device, priority=0):
            made.append((device, priority))
            self.priority = priority

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d: types.SimpleNamespace(multi_processor_count=7),
    )
    ctx = rank_context(1, 3, "cuda:0", "group", host_group="host", shares_gpu=True)
    assert (ctx.rank, ctx.world, ctx.group, ctx.group_hi, ctx.host_group) == (
        1,
        3,
        "group",
        "group",  # no high-priority group given: the group itself
        "host",
    )
    assert ctx.sm_count == 7 and ctx.shares_gpu
    for streams in (ctx.comm, ctx.signal):
        assert {p: s.priority for p, s in streams.items()} == {
            Priority.NORMAL: 0,
            Priority.HIGH: -1,
        }
        assert streams["high"] is streams[Priority.HIGH]  # keyed by the priority's word
    assert len(made) == 2 * len(STREAM_PRIORITIES)
    assert rank_context(0, 2, "cuda:0", "g", group_hi="g_hi").group_hi == "g_hi"


def test_the_ops_context_on_a_callers_group_is_the_one_set_up(monkeypatch):
    # ficco.ops' CUDA path builds its context through cuda_setup.rank_context too: the
    # caller's group at both priorities, the fence rendezvoused on it, no zero-CTA group
    import ficco.ops.cuda as ops_cuda
    from ficco.execute import cuda_setup

    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority=0: priority)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d: types.SimpleNamespace(multi_processor_count=5),
    )
    monkeypatch.setattr(ops_cuda.dist, "get_backend", lambda group: "nccl")
    fenced = []
    monkeypatch.setattr(cuda_setup, "rendezvous_fence", fenced.append)
    monkeypatch.setattr(ops_cuda, "_contexts", {})

    class Group:  # hashable: contexts are kept per (group, device)
        def rank(self):
            return 1

        def size(self):
            return 2

    group = Group()
    device = torch.device("cuda", 0)
    ctx = ops_cuda.rank_context(group, device)
    assert (ctx.rank, ctx.world, ctx.group, ctx.group_hi, ctx.sm_count) == (1, 2, group, group, 5)
    assert ctx.comm == ctx.signal == {Priority.NORMAL: 0, Priority.HIGH: -1}
    assert "zero-CTA" in ctx.nccl_ce_error and fenced == [ctx]
    assert ops_cuda.rank_context(group, device) is ctx  # made once per (group, device)
