"""gemm_rs: GEMM then reduce-scatter (row-linear: out-proj, FC2).

Rank r holds ``a [M, K]`` and ``b [K, N]`` (K is this rank's slice of the reduced
dimension); it produces ``reduce_scatter(a @ b)``, its rows ``[M/W, N]``. The collective
moves rows of C, so finer schedules cut M or N (not K).
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
    rows = slice(rank * p.m_shard, (rank + 1) * p.m_shard)
    return dense.summed_partials([(inp(r, "a")[rows], inp(r, "b")) for r in range(p.world)])


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    import torch
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    partial = a.float() @ b.float()
    exact = torch.empty((p.m_shard, p.n), dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(exact, partial)
    plain_partial = a @ b
    plain = torch.empty((p.m_shard, p.n), dtype=a.dtype, device=device)
    dist.reduce_scatter_tensor(plain, plain_partial)
    return exact, plain


def cuda_baselines(p: Problem, tensors: dict, device, group_name: str) -> dict:
    """cuBLAS alone, the reduce-scatter alone, both serial, and PyTorch's async-TP
    ``fused_matmul_reduce_scatter``."""
    import torch
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    partial = torch.empty((p.m, p.n), dtype=a.dtype, device=device)
    c_shard = torch.empty((p.m_shard, p.n), dtype=a.dtype, device=device)

    def gemm_alone():
        torch.mm(a, b, out=partial)

    def comm_alone():
        dist.reduce_scatter_tensor(c_shard, partial)

    def serial_eager():
        torch.mm(a, b, out=partial)
        dist.reduce_scatter_tensor(c_shard, partial)

    def async_tp():
        async_tp.out = torch.ops.symm_mem.fused_matmul_reduce_scatter(
            a, b, "sum", scatter_dim=0, group_name=group_name
        )

    async_tp.out = None
    return {
        **eager_baselines(gemm_alone, comm_alone, serial_eager, c_shard),
        BASELINE_ASYNC_TP: async_tp,
    }


SPEC = register(
    dense.spec(
        pattern=Pattern.GEMM_RS,
        collective=Collective.REDUCE_SCATTER,
        splits=(Split.M, Split.N),
        flops=dense.every_rank_gemm_flops,
        moved_dim="n",
        extra_roundings=dense.reduced_roundings,
        lookup_sizes="gemm_rs",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=cuda_baselines,
        lowering=Ref("ficco.plan.dense:plan_gemm_rs"),
        relay=True,
        buffers=Ref("ficco.plan.dense:gemm_rs_buffers"),
    )
)
