"""ag_gemm: all-gather then GEMM (sequence/tensor-parallel column-linear: QKV, FC1).

Rank r holds ``a_shard [M/W, K]`` and ``b [K, N]``; it produces ``c = all_gather(a) @ b``,
``[M, N]``. The collective moves rows of A, so finer schedules cut M or K (not N).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns.spec import BASELINE_ASYNC_TP, Collective, Ref, eager_baselines
from ficco.space.schedule import Split

if TYPE_CHECKING:
    from ficco.problem import Problem


def reference(p: Problem, rank: int, inp) -> tuple:
    import torch

    a = torch.cat([inp(r, "a_shard") for r in range(p.world)])
    b = inp(rank, "b")
    return a.double() @ b.double(), (a @ b)


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    import torch
    import torch.distributed as dist

    a_shard, b = tensors["a_shard"], tensors["b"]
    a_full = torch.empty((p.m, p.k), dtype=a_shard.dtype, device=device)
    dist.all_gather_into_tensor(a_full, a_shard.contiguous())
    exact = a_full.float() @ b.float()
    return exact, a_full @ b


def cuda_baselines(p: Problem, tensors: dict, device, group_name: str) -> dict:
    """The all-gather alone, cuBLAS alone, both serial, and PyTorch's async-TP
    ``fused_all_gather_matmul``."""
    import torch
    import torch.distributed as dist

    a_shard, b = tensors["a_shard"], tensors["b"]
    a_full = torch.empty((p.m, p.k), dtype=a_shard.dtype, device=device)
    c = torch.empty((p.m, p.n), dtype=a_shard.dtype, device=device)

    def gemm_alone():
        torch.mm(a_full, b, out=c)

    def comm_alone():
        dist.all_gather_into_tensor(a_full, a_shard)

    def serial_eager():
        dist.all_gather_into_tensor(a_full, a_shard)
        torch.mm(a_full, b, out=c)

    def async_tp():
        _, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(
            a_shard, [b], gather_dim=0, group_name=group_name
        )
        async_tp.out = out

    async_tp.out = None
    return {
        **eager_baselines(gemm_alone, comm_alone, serial_eager, c),
        BASELINE_ASYNC_TP: async_tp,
    }


SPEC = register(
    dense.spec(
        pattern=Pattern.AG_GEMM,
        collective=Collective.ALL_GATHER,
        splits=(Split.M, Split.K),
        flops=dense.gemm_flops,
        moved_dim="k",
        extra_roundings=dense.no_roundings,
        lookup_sizes="ag_gemm",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=cuda_baselines,
        lowering=Ref("ficco.plan.dense:plan_ag_gemm"),
        relay=True,
        buffers=Ref("ficco.plan.dense:ag_gemm_buffers"),
    )
)
