"""gemm_ar: GEMM then all-reduce (row-linear in tensor-parallel inference without sequence
parallelism; decode M = 1 ... 512).

Rank r holds ``a [M, K]`` and ``b [K, N]`` (K is this rank's slice of the reduced dimension,
as for gemm_rs); it produces ``all_reduce(a @ b) [M, N]`` on every rank. M need not divide
by W: only the schedules that reduce-scatter and then all-gather (``+rs_ag``) cut M into W
shards, and a rule refuses them otherwise. Its direct schedules cut the whole M and all-reduce
each chunk at once (one step); ``+rs_ag`` schedules are gemm_rs's plus an all-gather, so each
chunk crosses the links twice. Its ideal is the GEMM alone against the fastest all-reduce
alone: NCCL's, symmetric memory's one-shot or two-shot kernel, or ficco's lamport one-shot,
where the space allows them.

A problem may state an epilogue (its field ``epilogue``, ``ficco.patterns.epilogues``):
``add_rms_norm`` adds ``residual [M, N]`` and ``norm_weight [1, N]`` to every rank's inputs
and makes its output ``y [2, M, N]`` (the normed rows, the new residual). Its references
apply the epilogue to the all-reduced sum, and every baseline that all-reduces applies it
too (``comm_alone`` is then NCCL's all-reduce and the unfused epilogue; ``comm_lamport`` the
one fused launch), so the ideal and the fused-versus-unfused comparison count it alike.
``add_rms_norm_fp8`` also adds the constant ``norm_scale [1, 1]`` and makes the output two
parts, ``normed [M, N]`` in FP8 e4m3 and ``new_residual [M, N]`` (its baselines' too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns.epilogues import (
    FIELD,
    MAX_FUSED_NORM_COLUMNS,
    NORM_EPS,
    NORM_SCALE,
    add_rms_norm,
    has_fp8_norm,
    has_norm,
    norm_fp8_scale,
    normed_outputs,
)
from ficco.patterns.spec import BASELINE_COMM, Collective, ModelSupport, Ref, Sizes, eager_baselines
from ficco.space.schedule import AllReduce, Compute, Split

if TYPE_CHECKING:
    from ficco.problem import Problem
    from ficco.space.schedule import Schedule

#: baselines (CUDA): the whole [M, N] all-reduce alone through symmetric memory's one-shot /
#: two-shot kernel, beside NCCL's ``comm_alone``
BASELINE_COMM_ONE_SHOT = "comm_one_shot"
BASELINE_COMM_TWO_SHOT = "comm_two_shot"
#: baseline: the whole all-reduce alone through ficco's lamport one-shot kernel (with the
#: add_rms_norm epilogue: the fused kernel, one launch), on every backend that runs it
BASELINE_COMM_LAMPORT = "comm_lamport"


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
    exact, plain = dense.summed_partials([(inp(r, "a"), inp(r, "b")) for r in range(p.world)])
    if not has_norm(p):
        return exact, plain
    scale = inp(rank, NORM_SCALE) if has_fp8_norm(p) else None
    return normed_outputs(
        exact, plain, inp(rank, "residual"), inp(rank, "norm_weight"), fp8_scale=scale
    )


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    exact = a.float() @ b.float()
    dist.all_reduce(exact)
    plain = a @ b
    dist.all_reduce(plain)
    if not has_norm(p):
        return exact, plain
    residual, weight, scale = (tensors.get(n) for n in ("residual", "norm_weight", NORM_SCALE))
    return normed_outputs(exact, plain, residual, weight, fp8_scale=scale)


def constant_inputs(p: Problem, rank: int, name: str):
    """The values of a ``constant`` input (``ficco.execute.buffers.constant_input``): the
    add_rms_norm_fp8 epilogue's scale."""
    if name != NORM_SCALE or not has_fp8_norm(p):
        raise KeyError(f"{p.key} has no constant input {name!r}")
    return norm_fp8_scale()


class _Norm:
    """The unfused add_rms_norm epilogue of the baselines: ``norm(summed)`` writes
    ``normed`` and ``new_residual`` (the baselines' own) from this rank's residual and weight
    (and scale: add_rms_norm_fp8). ``out``: the output as verification reads it, ``y
    [2, M, N]`` or the parts (``ficco.execute.buffers.output_of``)."""

    def __init__(self, p: Problem, tensors: dict, device) -> None:
        import torch

        self.residual, self.weight = tensors["residual"], tensors["norm_weight"]
        self.scale = tensors[NORM_SCALE] if has_fp8_norm(p) else None
        if self.scale is None:
            self.out = torch.empty((2, p.m, p.n), dtype=self.residual.dtype, device=device)
            self.normed, self.new_residual = self.out
            return
        quantized = Ref("ficco.execute.buffers:Quantized").load()
        self.normed = torch.empty((p.m, p.n), dtype=torch.float8_e4m3fn, device=device)
        self.new_residual = torch.empty_like(self.residual)
        self.out = (quantized(self.normed, self.scale), self.new_residual)

    def __call__(self, summed) -> None:
        normed, new_residual = add_rms_norm(
            summed, self.residual, self.weight, NORM_EPS, self.scale
        )
        self.normed.copy_(normed)
        self.new_residual.copy_(new_residual)

    def after(self, all_reduce: Callable[[], None], summed) -> Callable[[], None]:
        """``all_reduce`` then the epilogue on ``summed``, what it wrote."""

        def all_reduce_then_norm() -> None:
            all_reduce()
            self(summed)

        return all_reduce_then_norm


def cuda_baselines(p: Problem, tensors: dict, device, group_name: str) -> dict:
    """cuBLAS alone, NCCL's all-reduce alone, both serial, and the kernel all-reduces alone
    (PyTorch has no fused matmul + all-reduce: no async_tp). With the add_rms_norm epilogue
    every all-reduce is followed by it (the serial baseline's output is then ``y``, or
    add_rms_norm_fp8's parts)."""
    import torch
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]
    c = torch.empty((p.m, p.n), dtype=a.dtype, device=device)
    norm = _Norm(p, tensors, device) if has_norm(p) else None

    def gemm_alone():
        torch.mm(a, b, out=c)

    def all_reduce():
        dist.all_reduce(c)

    comm_alone = norm.after(all_reduce, c) if norm else all_reduce

    def serial_eager():
        torch.mm(a, b, out=c)
        comm_alone()

    return {
        **eager_baselines(gemm_alone, comm_alone, serial_eager, norm.out if norm else c),
        **kernel_comm_parts(p, tensors, group_name, norm),
    }


def kernel_comm_parts(
    p: Problem, tensors: dict, group_name: str, norm: _Norm | None = None
) -> dict[str, Callable]:
    """The whole all-reduce alone through each kernel transport, on the buffers its
    schedules use (``ficco.plan.allreduce``), where the space allows them: symmetric
    memory's one-shot and two-shot (fp32 or bf16, aligned) and ficco's lamport one-shot.
    ``norm``: the epilogue each is followed by; the lamport kernel runs it in its launch."""
    from ficco.space import Schedule, Transport, is_legal

    # the executor's kernels, named (Ref) as the lowering is: execution sits above the patterns
    one_shot, two_shot, lamport, cuda_symm_all_reduce, lamport_norm = (
        Ref(f"ficco.execute.allreduce:{name}").load()
        for name in (
            "ONE_SHOT",
            "TWO_SHOT",
            "LAMPORT_ONE_SHOT",
            "cuda_symm_all_reduce",
            "lamport_all_reduce_norm",
        )
    )
    c = tensors["c"]
    staged = tensors["staging"][: p.m]  # row block 0: where the one-shot GEMM writes
    kernels = (
        (BASELINE_COMM_ONE_SHOT, Transport.SYMM1, one_shot, staged),
        (BASELINE_COMM_TWO_SHOT, Transport.SYMM2, two_shot, c),
        (BASELINE_COMM_LAMPORT, Transport.LAMPORT1, lamport, tensors["partial"]),
    )
    out = {}
    for name, transport, kernel, source in kernels:
        if not is_legal(p, Schedule(transport=transport)):
            continue
        run = functools.partial(cuda_symm_all_reduce, kernel, source, c, group_name)
        if norm is not None and kernel.fuses_add_rms_norm and p.n <= MAX_FUSED_NORM_COLUMNS:
            weight = norm.weight.view(-1)
            run = functools.partial(
                lamport_norm, kernel, source, norm.residual, weight, NORM_EPS, norm.normed,
                norm.new_residual, group_name, norm.scale,
            )  # fmt: skip
        elif norm is not None:
            run = norm.after(run, c)
        out[name] = run
    return out


SPEC = register(
    dense.spec(
        pattern=Pattern.GEMM_AR,
        collective=Collective.ALL_REDUCE,
        rows_per_rank=False,  # only +rs_ag cuts M into W shards (a rule refuses it otherwise)
        splits=(Split.M, Split.N),
        in_selector=False,  # no measured profiles yet: tables cannot answer it
        cost_model=ModelSupport.REUSED,
        comm_alone=(
            BASELINE_COMM,
            BASELINE_COMM_ONE_SHOT,
            BASELINE_COMM_TWO_SHOT,
            BASELINE_COMM_LAMPORT,
        ),
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
        problem_fields=(FIELD,),
    )
)
