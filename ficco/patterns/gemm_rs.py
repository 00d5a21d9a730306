"""gemm_rs: GEMM then reduce-scatter (row-linear: out-proj, FC2).

Rank r holds ``a [M, K]`` and ``b [K, N]`` (K is this rank's slice of the reduced
dimension); it produces ``reduce_scatter(a @ b)``, its rows ``[M/W, N]``. The collective
moves rows of C, so finer schedules cut M or N (not K).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns.spec import (
    BASELINE_ASYNC_TP,
    BASELINE_COMM,
    BASELINE_GEMM,
    BASELINE_SERIAL_EAGER,
    Collective,
    ModelSupport,
    PatternSpec,
    Ref,
    Sizes,
)
from ficco.space.schedule import Split

if TYPE_CHECKING:
    from ficco.problem import Problem


def comm_bytes(p: Problem) -> int:
    return dense.ring_comm_bytes(p, SPEC.moved_row_bytes(p))


def sizes(p: Problem) -> Sizes:
    return dense.sharded_sizes(p, SPEC.moved_row_bytes(p))


def reference(p: Problem, rank: int, inp) -> tuple:
    rows = slice(rank * p.m_shard, (rank + 1) * p.m_shard)
    parts = [(inp(r, "a")[rows], inp(r, "b")) for r in range(p.world)]
    exact = sum(a.double() @ b.double() for a, b in parts)
    plain = sum((a @ b).float() for a, b in parts).to(parts[0][0].dtype)
    return exact, plain


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

    serial_eager.out = c_shard
    async_tp.out = None
    return {
        BASELINE_GEMM: gemm_alone,
        BASELINE_COMM: comm_alone,
        BASELINE_SERIAL_EAGER: serial_eager,
        BASELINE_ASYNC_TP: async_tp,
    }


SPEC = register(
    PatternSpec(
        pattern=Pattern.GEMM_RS,
        collective=Collective.REDUCE_SCATTER,
        routed=False,
        rows_per_rank=True,
        splits=(Split.M, Split.N),
        fused=True,
        batched_blocks=False,
        in_selector=True,
        cost_model=ModelSupport.CALIBRATED,
        comm_alone=(BASELINE_COMM,),
        flops=dense.every_rank_gemm_flops,
        comm_bytes=comm_bytes,
        moved_dim="n",
        shard_rows=dense.shard_rows,
        serial_gemm_rows=dense.whole_m,
        one_step=dense.never,
        transfer_passes=dense.once,
        plan_key=dense.plan_key,
        extra_roundings=dense.reduced_roundings,
        sizes=sizes,
        lookup_sizes="gemm_rs",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=cuda_baselines,
        lowering=Ref("ficco.plan.dense:plan_gemm_rs"),
        scaled_inputs=True,
        problem_fields=(),
        buffers=Ref("ficco.plan.dense:gemm_rs_buffers"),
    )
)
