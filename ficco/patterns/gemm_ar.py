"""gemm_ar: GEMM then all-reduce (row-linear in tensor-parallel inference without sequence
parallelism; decode M = 1 ... 512).

Rank r holds ``a [M, K]`` and ``b [K, N]`` (K is this rank's slice of the reduced dimension,
as for gemm_rs); it produces ``all_reduce(a @ b) [M, N]`` on every rank. M need not divide
by W: only the schedules that reduce-scatter and then all-gather (``+rs_ag``) cut M into W
shards, and a rule refuses them otherwise. Its direct schedules cut the whole M and all-reduce
each chunk at once (one step); ``+rs_ag`` schedules are gemm_rs's plus an all-gather, so each
chunk crosses the links twice. Its ideal is the GEMM alone against the fastest all-reduce
alone: NCCL's, or symmetric memory's one-shot or two-shot kernel where the space allows them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns.spec import BASELINE_COMM, Collective, ModelSupport, Ref, Sizes, eager_baselines
from ficco.space.schedule import AllReduce, Compute, Split

if TYPE_CHECKING:
    from ficco.problem import Problem
    from ficco.space.schedule import Schedule

#: baselines (CUDA): the whole [M, N] all-reduce alone through symmetric memory's one-shot /
#: two-shot kernel, beside NCCL's ``comm_alone``
BASELINE_COMM_ONE_SHOT = "comm_one_shot"
BASELINE_COMM_TWO_SHOT = "comm_two_shot"


def comm_bytes(p: Problem) -> int:
    """A bandwidth-optimal all-reduce (ring, or reduce-scatter + all-gather) receives
    2 (W-1)/W of the M x N partial, rounded up."""
    return -(-2 * (p.world - 1) * p.m * p.n // p.world) * p.output_bytes


def direct(schedule: Schedule | None = None) -> bool:
    """Chunks all-reduced whole (not ``+rs_ag``): no shards, one step."""
    return schedule is None or schedule.all_reduce is AllReduce.DIRECT


def shard_rows(p: Problem, schedule: Schedule | None = None) -> int:
    return p.m if direct(schedule) else p.m_shard


def transfer_passes(schedule: Schedule | None = None) -> int:
    return 1 if direct(schedule) else 2  # each reduced chunk is all-gathered too


def plan_key(p: Problem, s: Schedule) -> tuple:
    """``+rs_ag`` plans are gemm_rs's; the direct plan never visits peers in an order."""
    if s.all_reduce is AllReduce.RS_AG:
        return dense.plan_key(p, s)
    if s.compute is not Compute.FUSED:
        return (s.transport, None)
    return (s.transport, s.order)


def sizes(p: Problem) -> Sizes:
    """The whole M computed; a peer's share of the reduced [M, N] is ceil(M/W) rows."""
    shard_bytes = -(-p.m // p.world) * p.n * p.output_bytes
    return Sizes(p.m, p.k * p.n, p.comm_bytes_per_rank(), shard_bytes, 0)


def reference(p: Problem, rank: int, inp) -> tuple:
    return dense.summed_partials([(inp(r, "a"), inp(r, "b")) for r in range(p.world)])


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    exact = a.float() @ b.float()
    dist.all_reduce(exact)
    plain = a @ b
    dist.all_reduce(plain)
    return exact, plain


def cuda_baselines(p: Problem, tensors: dict, device, group_name: str) -> dict:
    """cuBLAS alone, NCCL's all-reduce alone, both serial, and the symmetric-memory
    all-reduces alone (PyTorch has no fused matmul + all-reduce: no async_tp)."""
    import torch
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    c = torch.empty((p.m, p.n), dtype=a.dtype, device=device)

    def gemm_alone():
        torch.mm(a, b, out=c)

    def comm_alone():
        dist.all_reduce(c)

    def serial_eager():
        torch.mm(a, b, out=c)
        dist.all_reduce(c)

    return {
        **eager_baselines(gemm_alone, comm_alone, serial_eager, c),
        **symm_comm_parts(p, tensors, group_name),
    }


def symm_comm_parts(p: Problem, tensors: dict, group_name: str) -> dict[str, Callable]:
    """The whole all-reduce alone through each symmetric-memory kernel, on the buffers its
    symm1 / symm2 schedules use (``ficco.plan.allreduce``), where the space allows them
    (fp32 or bf16, aligned)."""
    from ficco.space import Schedule, Transport, is_legal

    # the executor's kernels, named (Ref) as the lowering is: execution sits above the patterns
    one_shot, two_shot, cuda_symm_all_reduce = (
        Ref(f"ficco.execute.allreduce:{name}").load()
        for name in ("ONE_SHOT", "TWO_SHOT", "cuda_symm_all_reduce")
    )
    c = tensors["c"]
    staged = tensors["staging"][: p.m]  # row block 0: where the one-shot GEMM writes
    kernels = (
        (BASELINE_COMM_ONE_SHOT, Transport.SYMM1, one_shot, staged),
        (BASELINE_COMM_TWO_SHOT, Transport.SYMM2, two_shot, c),
    )
    return {
        name: functools.partial(cuda_symm_all_reduce, kernel, source, c, group_name)
        for name, transport, kernel, source in kernels
        if is_legal(p, Schedule(transport=transport))
    }


SPEC = register(
    dense.spec(
        pattern=Pattern.GEMM_AR,
        collective=Collective.ALL_REDUCE,
        rows_per_rank=False,  # only +rs_ag cuts M into W shards (a rule refuses it otherwise)
        splits=(Split.M, Split.N),
        in_selector=False,  # no measured profiles yet: tables cannot answer it
        cost_model=ModelSupport.REUSED,
        comm_alone=(BASELINE_COMM, BASELINE_COMM_ONE_SHOT, BASELINE_COMM_TWO_SHOT),
        flops=dense.every_rank_gemm_flops,
        comm_bytes=comm_bytes,
        moved_dim="n",
        shard_rows=shard_rows,
        one_step=direct,
        transfer_passes=transfer_passes,
        plan_key=plan_key,
        extra_roundings=dense.reduced_roundings,
        sizes=sizes,
        lookup_sizes="gemm_ar",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=cuda_baselines,
        lowering=Ref("ficco.plan.allreduce:plan_gemm_ar"),
        buffers=Ref("ficco.plan.allreduce:ar_buffers"),
    )
)
