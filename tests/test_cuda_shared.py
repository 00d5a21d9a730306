"""Ranks that share a GPU (``ficco.execute.cuda_shared``) without a GPU: what is unavailable
and why, the verification-only note on every measurement and the store's refusal of it, and
a fix its one-GPU run found in the CUDA primitives (a reduction that wrote into its input)."""

import types

import pytest
import torch
from measuring_rank import serve_measure_jobs

from ficco.backends import backend_spec
from ficco.execute.buffers import view
from ficco.execute.cpu import CpuBackend
from ficco.execute.cuda import CudaPrimitives
from ficco.execute.cuda_shared import (
    ASYNC_TP_REASON,
    FUSED_REASON,
    LAMPORT_REASON,
    NCCL_CE_REASON,
    SYMM_REASON,
    VERIFICATION_ONLY,
    host_comm,
    shared_capability,
    shared_gpu,
)
from ficco.execute.pool import RankPool
from ficco.execute.run import measure_in
from ficco.measure.record import VERIFICATION_ONLY as FIELD
from ficco.measure.record import Measurement
from ficco.plan import ReduceOp, Region, build_plan
from ficco.problem import Problem
from ficco.profile.store import MemoryStore
from ficco.space import Schedule


@pytest.mark.parametrize(
    ("pattern", "schedule", "reason"),
    [
        ("ag_gemm", "finer-c4-m/ce/triton+fused", FUSED_REASON),
        ("gemm_ar", "finer-c2-m/symm1/cublas", SYMM_REASON),
        ("gemm_ar", "serial/symm2/cublas", SYMM_REASON),
        ("gemm_ar", "finer-c2-m/lamport1/cublas", LAMPORT_REASON),
        ("gemm_ar", "serial/lamport2/triton", LAMPORT_REASON),
        ("gemm_rs", "shard/nccl_ce/cublas", NCCL_CE_REASON),
        ("ag_gemm", "finer-c4-m/ce/cublas", None),
        ("a2a_gemm", "shard/seg/cublas", None),
        ("gemm_rs", "finer-c2-m/nccl/triton", None),
    ],
)
def test_what_needs_distinct_gpus_is_named(pattern, schedule, reason):
    extra = {"experts": 4} if "a2a" in pattern else {}
    p = Problem(pattern=pattern, m=64, n=32, k=16, world=2, dtype="fp32", **extra)
    assert shared_capability(p, Schedule.parse(schedule)) == reason
    if reason:
        assert "needs distinct GPUs" in reason
    assert "needs distinct GPUs" in ASYNC_TP_REASON


def test_gloo_plans_are_told_from_one_sided_ones():
    p = Problem(pattern="gemm_rs", m=64, n=32, k=16, world=2, dtype="fp32")
    assert host_comm(build_plan(p, Schedule.parse("serial/nccl/cublas"), 0))
    assert host_comm(build_plan(p, Schedule.parse("finer-c2-m/nccl/cublas"), 0))
    assert not host_comm(build_plan(p, Schedule.parse("finer-c2-m/ce/cublas"), 0))


class NotedCpuBackend(CpuBackend):
    timing_note = VERIFICATION_ONLY


def noted_rank(rank, world, init_file, conn, options):
    from ficco.execute.cpu_group import init_gloo_rank

    init_gloo_rank(rank, world, init_file, options.timeout_s)
    backend = NotedCpuBackend(rank, world)
    serve_measure_jobs(backend, conn)


def test_verification_only_runs_say_so_and_a_store_refuses_them():
    from ficco.execute import RunOptions, TimingOptions

    problem = Problem(pattern="ag_gemm", m=32, n=16, k=16, world=2, dtype="fp32")
    schedules = [Schedule.parse(s) for s in ("serial/nccl/cublas", "finer-c2-m/ce/cublas")]
    options = RunOptions(timeout_s=60)
    with RankPool(
        2, noted_rank, (options,), timeout_s=120, startup_s=60, preload=backend_spec("cpu").preload
    ) as pool:
        measured = measure_in(pool, problem, schedules, TimingOptions(rounds=1, warmup=0))
    assert not isinstance(measured, str), measured
    assert {m.name for m in measured} >= {str(s) for s in schedules}
    assert all(m.extra[FIELD] == VERIFICATION_ONLY for m in measured)
    store = MemoryStore()
    for m in measured:
        with pytest.raises(ValueError, match="verification_only"):
            store.append(m)
    assert len(store) == 0
    plain = measured[0]
    del plain.extra[FIELD]
    store.append(plain)  # the same record without the note is kept
    assert len(store) == 1


def test_a_reduction_leaves_its_inputs_as_they_were():
    """gemm_ar's direct all-reduce pushes the whole partial to every peer while it reduces:
    an fp32 reduction of 3+ inputs once summed into its first input (``.float()`` of an fp32
    tensor is the tensor itself), so a push still in flight sent a half-reduced partial
    (incorrect at W = 4 on one GPU)."""
    tensors = {
        "partial": torch.randn(4, 3),
        "staging": torch.randn(3, 4, 3),
        "out": torch.full((4, 3), float("nan")),
    }
    before = tensors["partial"].clone()
    inputs = (Region("partial", (0, 4), (0, 3)),) + tuple(
        Region("staging", (0, 4), (0, 3), index=i) for i in range(3)
    )
    op = ReduceOp(inputs=inputs, out=Region("out", (0, 4), (0, 3)))
    prims = types.SimpleNamespace(view=lambda region: view(tensors, region))
    CudaPrimitives.reduce(prims, op)
    assert torch.equal(tensors["partial"], before)
    torch.testing.assert_close(tensors["out"], before + tensors["staging"].sum(0))


def test_a_measurement_without_the_note_is_not_refused():
    m = Measurement(
        problem=Problem(pattern="ag_gemm", m=32, n=16, k=16, world=2).to_dict(),
        name="serial/nccl/cublas",
        kind="schedule",
        verdict="ok",
    )
    assert MemoryStore().append(m)["name"] == "serial/nccl/cublas"


def test_signal_channels_agree_between_ranks_under_a_skewed_routing():
    """Every push's signal channel is the same on its sender and its receiver: channels once
    numbered the tags of each rank's own plan, and with this skewed routing at W = 8 (empty
    chunks left out on some ranks) they disagreed and every one-sided finer-c4 schedule hung."""
    from ficco.plan.tags import signal_channel
    from ficco.routing import with_skewed_routing

    p = Problem(pattern="gemm_a2a", m=1024, n=96, k=64, world=8, dtype="fp32", experts=16)
    p = with_skewed_routing(p, top_k=2, alpha=1.2, seed=8)
    for name in ("finer-c4-m/ce/cublas", "finer-c4-m/seg/cublas", "finer-c2-m/ce/cublas"):
        s = Schedule.parse(name)
        plans = [build_plan(p, s, r) for r in range(8)]
        tag_sets = {frozenset(x.tag for x in plan.transfers()) for plan in plans}
        pushes = [
            (r, x)
            for r, plan in enumerate(plans)
            for x in plan.transfers()
            if x.direction == "send" and x.initiator == "sender"
        ]
        assert pushes
        for r, x in pushes:
            waits = [
                y
                for y in plans[x.peer].transfers()
                if y.direction == "recv" and y.peer == r and y.tag == x.tag
            ]
            assert len(waits) == 1
            assert signal_channel(x.tag, s.chunks) == signal_channel(waits[0].tag, s.chunks)
        channels = [signal_channel(x.tag, s.chunks) for _, x in pushes]
        assert len({(r, x.peer, c) for (r, x), c in zip(pushes, channels, strict=True)}) == len(
            pushes
        )
        if name == "finer-c4-m/ce/cublas":
            assert len(tag_sets) > 1  # the ranks' plans hold different tag sets


def test_every_rank_takes_one_gpu_also_on_a_host_of_several(monkeypatch):
    """Ranks spread over a host's GPUs mixed devices in one rank's work (seen on two H100s),
    so every rank takes the same GPU; a bad FICCO_SHARED_GPU is refused naming the rule."""
    monkeypatch.delenv("FICCO_SHARED_GPU", raising=False)
    assert shared_gpu(2) == 0  # not rank % GPUs
    monkeypatch.setenv("FICCO_SHARED_GPU", "1")
    assert shared_gpu(2) == 1
    for bad in ("2", "-1", "x"):
        monkeypatch.setenv("FICCO_SHARED_GPU", bad)
        with pytest.raises(ValueError, match="FICCO_SHARED_GPU.*GPU index below"):
            shared_gpu(2)
