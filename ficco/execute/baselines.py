"""Baselines every measurement shows beside the schedules.

``gemm_alone`` and ``comm_alone`` (the undecomposed GEMM and collective, each isolated: the
``t_gemm`` and ``t_comm`` of every signature) on every backend; on CUDA also ``serial_eager``
(serial NCCL collective then cuBLAS, issued the plain eager way), ``serial_graph`` (the same,
captured in a CUDA graph where NCCL allows it) and ``async_tp`` (PyTorch's
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``). The isolated parts get
captured twins (``@graph``) timed beside them. On CPU the parts are the ``serial/nccl/cublas``
plan's collective and GEMM tasks run through the interpreter (modes ``comm`` and ``gemm``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ficco.measure.record import BASELINE_ASYNC_TP, BASELINE_COMM, BASELINE_GEMM
from ficco.problem import Pattern, Problem

#: baseline: serial NCCL collective then cuBLAS, issued the plain eager way
BASELINE_SERIAL_EAGER = "serial_eager"
#: baseline: the same serial NCCL + cuBLAS captured in a CUDA graph (where NCCL allows it)
BASELINE_SERIAL_GRAPH = "serial_graph"
#: suffix of the captured twin of an isolated part (gemm_alone, comm_alone), timed beside it
GRAPHED_PART = "@graph"
#: baselines (gemm_ar on CUDA): the whole [M, N] all-reduce alone through symmetric memory's
#: one-shot / two-shot kernel, beside NCCL's ``comm_alone``: the ideal of a problem is its
#: GEMM alone against the fastest all-reduce alone
BASELINE_COMM_ONE_SHOT = "comm_one_shot"
BASELINE_COMM_TWO_SHOT = "comm_two_shot"
#: the isolated parts: each gets a captured twin, and keeps the faster of the two issues
ISOLATED_PARTS = (BASELINE_GEMM, BASELINE_COMM, BASELINE_COMM_ONE_SHOT, BASELINE_COMM_TWO_SHOT)

__all__ = [
    "BASELINE_ASYNC_TP",
    "BASELINE_COMM",
    "BASELINE_COMM_ONE_SHOT",
    "BASELINE_COMM_TWO_SHOT",
    "BASELINE_GEMM",
    "BASELINE_SERIAL_EAGER",
    "BASELINE_SERIAL_GRAPH",
    "GRAPHED_PART",
    "ISOLATED_PARTS",
    "cuda_baselines",
    "plan_baselines",
    "plan_part_baselines",
]


def plan_part_baselines(run_serial_plan: Callable[..., None]) -> dict[str, Callable[[], None]]:
    """``gemm_alone`` and ``comm_alone`` as the serial plan's parts: ``run_serial_plan(mode)``
    interprets the ``serial/nccl/cublas`` plan in that mode."""
    return {
        BASELINE_GEMM: functools.partial(run_serial_plan, "gemm"),
        BASELINE_COMM: functools.partial(run_serial_plan, "comm"),
    }


def plan_baselines(run_serial_plan: Callable[..., None], output) -> dict[str, Callable[[], None]]:
    """The parts of :func:`plan_part_baselines` plus ``serial_eager``: the whole serial plan,
    whose output tensor ``output`` is verified like a schedule's."""

    first = [True]

    def serial_eager() -> None:
        if first[0]:  # the first call is the verified one: it must write every element
            output.fill_(float("nan"))
            first[0] = False
        run_serial_plan()

    serial_eager.out = output
    return {**plan_part_baselines(run_serial_plan), BASELINE_SERIAL_EAGER: serial_eager}


def cuda_baselines(
    problem: Problem, tensors: dict, device, group_name: str
) -> dict[str, Callable[[], None]]:
    """name -> callable issuing the baseline on the current stream; the output tensor each
    writes (for verification) is attribute ``out`` of the callable where it has one."""
    import torch
    import torch.distributed as dist

    t = tensors
    runners: dict[str, Callable] = {}
    if problem.pattern is Pattern.AG_GEMM:
        a_shard, b = t["a_shard"], t["b"]
        a_full = torch.empty((problem.m, problem.k), dtype=a_shard.dtype, device=device)
        c = torch.empty((problem.m, problem.n), dtype=a_shard.dtype, device=device)

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

        serial_eager.out = c
    elif problem.pattern is Pattern.GEMM_AR:
        # PyTorch has no fused matmul + all-reduce (async-TP covers AG and RS): no async_tp
        a, b = t["a"], t["b"]
        c = torch.empty((problem.m, problem.n), dtype=a.dtype, device=device)

        def gemm_alone():
            torch.mm(a, b, out=c)

        def comm_alone():
            dist.all_reduce(c)

        def serial_eager():
            torch.mm(a, b, out=c)
            dist.all_reduce(c)

        serial_eager.out = c
        return {
            BASELINE_GEMM: gemm_alone,
            BASELINE_COMM: comm_alone,
            BASELINE_SERIAL_EAGER: serial_eager,
            **_symm_comm_parts(problem, tensors, group_name),
        }
    else:
        a, b = t["a"], t["b"]
        partial = torch.empty((problem.m, problem.n), dtype=a.dtype, device=device)
        c_shard = torch.empty((problem.m_shard, problem.n), dtype=a.dtype, device=device)

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
    runners[BASELINE_GEMM] = gemm_alone
    runners[BASELINE_COMM] = comm_alone
    runners[BASELINE_SERIAL_EAGER] = serial_eager
    runners[BASELINE_ASYNC_TP] = async_tp
    return runners


def _symm_comm_parts(problem: Problem, tensors: dict, group_name: str) -> dict[str, Callable]:
    """gemm_ar's whole all-reduce alone through each symmetric-memory kernel, on the buffers
    its symm1 / symm2 schedules use (``ficco.plan.allreduce``), where the space allows them
    (fp32 or bf16, aligned)."""
    from ficco.execute.allreduce import ONE_SHOT, TWO_SHOT, cuda_symm_all_reduce
    from ficco.space import Schedule, Transport, is_legal

    c = tensors["c"]
    staged = tensors["staging"][: problem.m]  # row block 0: where the one-shot GEMM writes
    parts: dict[str, Callable] = {}
    if is_legal(problem, Schedule(transport=Transport.SYMM1)):
        parts[BASELINE_COMM_ONE_SHOT] = functools.partial(
            cuda_symm_all_reduce, ONE_SHOT, staged, c, group_name
        )
    if is_legal(problem, Schedule(transport=Transport.SYMM2)):
        parts[BASELINE_COMM_TWO_SHOT] = functools.partial(
            cuda_symm_all_reduce, TWO_SHOT, c, c, group_name
        )
    return parts
