"""The CUDA path of an op call: ficco's own CUDA primitives on the caller's NCCL group.

``ficco.execute.cuda.CudaPrimitives`` runs a plan given a rank context (streams, groups, a
symmetric-memory fence) and buffers (peer-visible ones in symmetric memory, with their
rendezvous handles). Here both are built around the caller's group instead of ficco's pools:

- one context per (group, device), made on the group's first call: two side streams per
  priority, the caller's group for both priorities (no second high-priority communicator is
  created behind the caller's back), a 16-int symmetric fence rendezvoused on the group;
- the peer-visible buffers of a problem (``a_shard`` of ag_gemm, ``staging`` of gemm_rs) in
  symmetric memory, allocated and rendezvoused once per (group, buffer, size class of its
  rows, dtype) and reused by every later call whose rows fall in that class; the caller's ``a_shard`` is copied into its
  symmetric buffer on the caller's stream. Other workspaces and the output are fresh tensors
  from the caching allocator (the output is the caller's; ``a_full`` is kept for backward).

The plan runs on the caller's current stream, forking the side streams and joining them
before it returns. First calls rendezvous (a collective on the group): make them, once per
shape, before any CUDA-graph capture. ``nccl_ce`` schedules need ficco's probed zero-CTA
communicator and are refused (``ficco.ops.choice.backend_limit``).

Not run on CPU-only machines: ``tests/gpu/test_ops_gpu.py`` exercises it on 2 GPUs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ficco.execute.backend import Buffers
from ficco.execute.interpreter import interpret
from ficco.ops.groups import group_cache, prune
from ficco.plan import Plan
from ficco.problem import Problem

# keyed by the group object, not its name: a re-created default group is named "0" again
# (the caches drop a destroyed group's entries: ficco.ops.groups)
_contexts: dict[tuple[dist.ProcessGroup, int], object] = group_cache(lambda key, _: key[0])
_symmetric: dict[tuple[Problem, dist.ProcessGroup], tuple[dict, dict]] = group_cache(
    lambda key, _: key[1]
)


def shares_gpu(group: dist.ProcessGroup) -> bool:
    """A gloo group on CUDA tensors: ranks that share a GPU (``ficco.execute.cuda_shared``:
    CUDA IPC for symmetric memory, gloo for NCCL; for verification)."""
    return dist.get_backend(group) == "gloo"


def rank_context(group: dist.ProcessGroup, device: torch.device):
    """The rank context of ``group`` on ``device`` (made once, by
    ``ficco.execute.cuda_setup.rank_context``; a collective the first time)."""
    key = (group, device.index)
    if key not in _contexts and shares_gpu(group):
        from ficco.execute.cuda_shared import group_context

        prune()
        _contexts[key] = group_context(group, device)
    if key not in _contexts:
        prune()
        from ficco.execute import cuda_setup

        # the caller's group serves both priorities: no second high-priority communicator is
        # created behind the caller's back
        ctx = cuda_setup.rank_context(
            group.rank(),
            group.size(),
            device,
            group,
            nccl_ce_error="ficco.ops does not create a zero-CTA NCCL communicator",
        )
        cuda_setup.rendezvous_fence(ctx)
        _contexts[key] = ctx
    return _contexts[key]


#: Rows of a symmetric buffer are rounded up to a power of two, at least this many: token
#: counts that change every step share a few buffers (and rendezvous a few times) instead of
#: one buffer per count.
MIN_CLASS_ROWS = 64
#: (group, buffer, class shape, dtype, device) -> (tensor, handle)
_pool: dict[tuple, tuple] = group_cache(lambda key, _: key[0])


def class_rows(rows: int) -> int:
    """The size class of ``rows``: the next power of two, at least ``MIN_CLASS_ROWS``."""
    return max(MIN_CLASS_ROWS, 1 << max(0, rows - 1).bit_length())


def symmetric_buffers(plan: Plan, group: dist.ProcessGroup, device: torch.device):
    """``(tensors, handles)`` of the plan's peer-visible buffers: views of the first rows of
    buffers allocated once per (group, buffer name, size class, dtype) and rendezvoused then
    (a collective: every rank makes the same calls in the same order, so the same classes).
    A view starts at its allocation's first element, so a peer's view of the same shape (what
    ``get_buffer`` returns) is the peer's copy of it."""
    key = (plan.problem, group)
    if key not in _symmetric:
        import torch.distributed._symmetric_memory as symm_mem

        from ficco.problem import torch_dtype

        dtype = torch_dtype(plan.problem.dtype)
        tensors, handles = {}, {}
        for spec in plan.buffers:
            if spec.peer_visible:
                rows, *rest = spec.shape
                shape = (class_rows(rows), *rest)
                slot = (group, spec.name, shape, dtype, str(device))
                if slot not in _pool and shares_gpu(group):
                    from ficco.execute.cuda_shared import ipc_buffer

                    _pool[slot] = ipc_buffer(shape, dtype, device, group)
                if slot not in _pool:
                    whole = symm_mem.empty(shape, dtype=dtype, device=device)
                    _pool[slot] = (whole, symm_mem.rendezvous(whole, group.group_name))
                whole, handles[spec.name] = _pool[slot]
                tensors[spec.name] = whole[:rows]
        _symmetric[key] = (tensors, handles)
    return _symmetric[key]


def run_plan_cuda(
    plan: Plan, tensors: dict[str, torch.Tensor], group: dist.ProcessGroup, device
) -> None:
    """Run ``plan`` on the caller's stream; ``tensors``: the caller's inputs and this call's
    workspaces and output by buffer name. Peer-visible buffers run in symmetric ones (an
    input copied in; an output, which gemm_ar's is, copied back out into the caller's
    tensor: the symmetric one is reused by the next call)."""
    from ficco.execute.cuda import CudaPrimitives

    ctx = rank_context(group, device)
    handles: dict = {}
    bound = dict(tensors)
    if plan.schedule.transport.traits.symmetric_memory:
        symmetric, handles = symmetric_buffers(plan, group, device)
        # every peer is past its previous call's reads of our buffers before we overwrite them
        # (its previous call joined its side streams into the stream this barrier runs on)
        ctx.fence.barrier(channel=2)
        for name, buf in symmetric.items():
            if plan.buffer(name).role == "input":
                buf.copy_(tensors[name])
            bound[name] = buf
    bufs = Buffers(bound, handles=handles)
    if ctx.shares_gpu:
        from ficco.execute.cuda_shared import group_primitives

        interpret(group_primitives(ctx, plan, bufs))
    else:
        interpret(CudaPrimitives(ctx, plan, bufs))
    for name, buf in bound.items():
        if buf is not tensors[name] and plan.buffer(name).role == "output":
            tensors[name].copy_(buf)
