"""The CUDA baselines of a scaled (fp8) problem: serial NCCL + ``torch._scaled_mm``, and
PyTorch async-TP's ``fused_all_gather_scaled_matmul`` / ``fused_scaled_matmul_reduce_scatter``
where the installed torch has them.

The same names as a plain problem's baselines (``gemm_alone``, ``comm_alone``,
``serial_eager``, ``async_tp``), chosen by the pattern's collective: an all-gather moves the
fp8 shard and, with row-wise scales, its scales (as bytes: NCCL gathers them whatever their
type); a reduce-scatter or all-reduce moves and reduces the bf16 product. The all-to-all
patterns' baselines are their serial plans, which the CUDA executor does not run for fp8:
they are unavailable with that reason. Every baseline is refused, naming the cause, where
the GPU or the torch cannot run FP8 GEMMs (``ficco.kernels.scaled_mm.gpu_refusal``), and on
any device other than a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ficco.execute.scaled import row_scales, scale_name
from ficco.kernels.scaled_mm import gpu_refusal, scaled_matmul
from ficco.patterns import spec_of
from ficco.patterns.spec import (
    BASELINE_ASYNC_TP,
    BASELINE_COMM,
    BASELINE_GEMM,
    Collective,
    eager_baselines,
)
from ficco.plan import Region
from ficco.problem import Problem, torch_dtype
from ficco.verdict import Unavailable

#: async-TP's scaled ops, by the collective they fuse
ASYNC_TP_SCALED_OPS = {
    Collective.ALL_GATHER: "fused_all_gather_scaled_matmul",
    Collective.REDUCE_SCATTER: "fused_scaled_matmul_reduce_scatter",
}


def _refused(reason: str) -> Callable[[], None]:
    def baseline() -> None:
        raise Unavailable(reason)

    return baseline


def async_tp_scaled_op(collective: Collective):
    """torch's async-TP scaled op fusing ``collective`` (None where this torch lacks it)."""
    name = ASYNC_TP_SCALED_OPS.get(collective)
    if name is None:
        return None
    try:
        import torch.distributed._symmetric_memory  # noqa: F401 - registers torch.ops.symm_mem
    except ImportError:
        return None
    return getattr(getattr(torch.ops, "symm_mem", None), name, None)


def _vector_scales(a_scale, b_scale, m: int, n: int):
    """Both scalar or both vectors, as ``_scaled_mm`` (and async-TP inside) takes them."""
    if a_scale.numel() == 1 and b_scale.numel() == 1:
        return a_scale.reshape(()), b_scale.reshape(())
    return (
        a_scale.reshape(-1, 1).expand(m, 1).contiguous(),
        b_scale.reshape(1, -1).expand(1, n).contiguous(),
    )


def scaled_cuda_baselines(problem: Problem, tensors: dict, device, group_name: str) -> dict:
    """name -> callable issuing the baseline (``out``: the tensor it writes, verified)."""
    device = torch.device(device)
    if device.type != "cuda":
        reason = f"the {problem.dtype} baselines (torch._scaled_mm, async-TP) run on GPUs only"
        return {name: _refused(reason) for name in (BASELINE_GEMM, BASELINE_COMM)}
    reason = gpu_refusal(problem.dtype, device)
    if reason is not None:
        return {name: _refused(reason) for name in (BASELINE_GEMM, BASELINE_COMM)}
    collective = spec_of(problem.pattern).collective
    if collective is Collective.ALL_GATHER:
        return _all_gather(problem, tensors, device, group_name)
    if collective.reduces:
        return _reduced(problem, tensors, device, group_name, collective)
    reason = (
        f"{problem.pattern}'s baselines are its serial plan, which the CUDA executor does not "
        f"run for {problem.dtype} yet"
    )
    return {name: _refused(reason) for name in (BASELINE_GEMM, BASELINE_COMM)}


def _all_gather(p: Problem, tensors: dict, device, group_name: str) -> dict:
    import torch.distributed as dist

    a_shard, b = tensors["a_shard"], tensors["b"]  # a_shard [M/W, K] fp8, b [K, N] fp8
    a_full = tensors["a_full"]  # [M, K] fp8
    shard_scale = tensors[scale_name("a_shard")]  # [M/W, 1] or [1, 1]
    full_scale = tensors[scale_name("a_full")]  # [M, 1] or [1, 1] (the shared one)
    b_scale = tensors[scale_name("b")]
    per_row = row_scales(p, tensors, Region("a_full", (0, p.m), (0, p.k))) is not None
    c = torch.empty((p.m, p.n), dtype=torch_dtype(p.output_dtype), device=device)
    b = b.t().contiguous().t()  # column-major once, as cuBLASLt's FP8 GEMM takes it

    def gather() -> None:
        dist.all_gather_into_tensor(a_full.view(torch.uint8), a_shard.view(torch.uint8))
        if per_row:  # the rows' scales travel with them
            dist.all_gather_into_tensor(full_scale, shard_scale)

    def gemm_alone() -> None:  # the gathered scales are on the GPU: never read on the host
        scaled_matmul(a_full, b, full_scale, b_scale, c.dtype, out=c, check_values=False)

    def serial_eager() -> None:
        gather()
        gemm_alone()

    out = eager_baselines(gemm_alone, gather, serial_eager, c)
    op = async_tp_scaled_op(Collective.ALL_GATHER)
    if op is None:
        out[BASELINE_ASYNC_TP] = _refused(
            "this torch has no torch.ops.symm_mem.fused_all_gather_scaled_matmul"
        )
        return out
    a_scale, b_vec = _vector_scales(shard_scale, b_scale, p.m_shard, p.n)

    def async_tp() -> None:
        _, (result,) = op(
            a_shard, [b], a_scale, [b_vec], 0, group_name,
            [None], [None], [c.dtype], [False],
        )  # fmt: skip
        async_tp.out = result

    async_tp.out = None
    out[BASELINE_ASYNC_TP] = async_tp
    return out


def _reduced(p: Problem, tensors: dict, device, group_name: str, collective: Collective) -> dict:
    import torch.distributed as dist

    a, b = tensors["a"], tensors["b"]  # a [M, K] fp8 (this rank's K slice), b [K, N] fp8
    a_scale, b_scale = tensors[scale_name("a")], tensors[scale_name("b")]
    partial = torch.empty((p.m, p.n), dtype=torch_dtype(p.output_dtype), device=device)
    scattered = collective is Collective.REDUCE_SCATTER
    out_rows = p.m_shard if scattered else p.m
    result = torch.empty((out_rows, p.n), dtype=partial.dtype, device=device)
    b = b.t().contiguous().t()  # column-major once, as cuBLASLt's FP8 GEMM takes it

    def gemm_alone() -> None:  # no host read of the scales: it would break a graph's capture
        scaled_matmul(a, b, a_scale, b_scale, partial.dtype, out=partial, check_values=False)

    def comm_alone() -> None:  # bf16 partials, reduced by NCCL
        if scattered:
            dist.reduce_scatter_tensor(result, partial)
        else:
            result.copy_(partial)
            dist.all_reduce(result)

    def serial_eager() -> None:
        gemm_alone()
        comm_alone()

    out = eager_baselines(gemm_alone, comm_alone, serial_eager, result)
    if not scattered:  # PyTorch has no fused scaled matmul + all-reduce
        return out
    op = async_tp_scaled_op(Collective.REDUCE_SCATTER)
    if op is None:
        out[BASELINE_ASYNC_TP] = _refused(
            "this torch has no torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter"
        )
        return out
    a_vec, b_vec = _vector_scales(a_scale, b_scale, p.m, p.n)

    def async_tp() -> None:
        async_tp.out = op(
            a, b, a_vec, b_vec, "sum", 0, 0, group_name, [p.m, p.n],
            None, None, partial.dtype, False,
        )  # fmt: skip

    async_tp.out = None
    out[BASELINE_ASYNC_TP] = async_tp
    return out
