"""One op call: the problem of the call, its schedule, its cached plan, its buffers, the run.

The plan of (problem, schedule, rank) is built once and cached (:func:`plan_for`); the plan's
buffers are the caller's tensors (inputs, used in place) plus a fresh workspace and output per
call (the output is handed to the caller, and the gathered ``a_full`` is kept for the weight
gradient, so neither may be reused by the next call). The one interpreter
(``ficco.execute.interpreter``) runs the plan through the CPU primitives on the caller's group
(``ficco.ops.cpu``).

On CUDA tensors the same plan runs through ficco's CUDA primitives on the caller's NCCL group
and stream, with symmetric-memory buffers made once per (problem, group) (``ficco.ops.cuda``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from ficco.execute.interpreter import interpret
from ficco.ops.choice import Choice, check_enabled, choose
from ficco.ops.cpu import GroupCpuPrimitives
from ficco.ops.groups import group_cache, prune
from ficco.plan import Plan, build_plan
from ficco.problem import Problem
from ficco.space import Schedule

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def resolve_group(group: dist.ProcessGroup | str | None) -> dist.ProcessGroup:
    """The caller's group: a ProcessGroup, its ``group_name``, or None for the default group."""
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError("group: torch.distributed is not initialized (init_process_group)")
        return dist.group.WORLD
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(group)
    return group


def dtype_name(field: str, tensor: torch.Tensor) -> str:
    if tensor.dtype not in _DTYPE_NAMES:
        raise ValueError(
            f"{field}: dtype {tensor.dtype} is not supported; ficco.ops takes "
            f"{', '.join(map(str, _DTYPE_NAMES))}"
        )
    return _DTYPE_NAMES[tensor.dtype]


def check_operands(a: torch.Tensor, b: torch.Tensor, a_field: str) -> str:
    """The common dtype name of ``a @ b``; refuses mismatches with the field and rule."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"{a_field}, b: must be 2-D matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"b: has {b.shape[0]} rows but {a_field} has {a.shape[1]} columns (a @ b needs them "
            "equal)"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"b: dtype {b.dtype} differs from {a_field}'s {a.dtype}")
    if a.device != b.device:
        raise ValueError(f"b: on {b.device}, {a_field} on {a.device}: must be on one device")
    return dtype_name(a_field, a)


@lru_cache(maxsize=256)
def plan_for(problem: Problem, schedule: Schedule, rank: int) -> Plan:
    """The plan of one (problem, schedule, rank), built once per process."""
    return build_plan(problem, schedule, rank)


_runs: dict[str, int] = {}


def next_run(pg: dist.ProcessGroup) -> int:
    """The index of this call among the calls on ``group``: every rank calls the ops of a group
    in the same order, so the index (which offsets the message tags) agrees across ranks."""
    name = pg.group_name
    _runs[name] = _runs.get(name, 0) + 1
    return _runs[name]


def decide(problem: Problem, schedule: str, table: str, device: torch.device, group) -> Choice:
    choice = choose(problem, schedule, table, device.type)
    if check_enabled():
        mine = torch.tensor([choice.digest], dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(problem.world)]
        dist.all_gather(every, mine, group=group)
        if len({int(t) for t in every}) != 1:
            raise RuntimeError(
                f"ficco.ops: ranks took different decisions for {problem.key} (this rank "
                f"{choice.schedule}, hashes {[int(t) for t in every]}): check that every rank "
                "reads the same table and ficco version"
            )
    return choice


def execute(plan: Plan, tensors: dict, group: dist.ProcessGroup, device: torch.device) -> None:
    """Run ``plan`` over ``tensors`` (buffer name -> tensor) on ``group``, on CPU or CUDA."""
    if device.type == "cuda":
        from ficco.ops.cuda import run_plan_cuda

        run_plan_cuda(plan, tensors, group, device)
    else:
        interpret(GroupCpuPrimitives(plan, tensors, next_run(pg=group), group))


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What every call of one signature runs: the group, the problem, the choice, the plan."""

    group: dist.ProcessGroup
    rank: int
    problem: Problem | None
    """None (with choice and plan) for a group of one rank: the call is its matmul."""
    choice: Choice | None
    plan: Plan | None


#: (pattern, a shape, b shape, dtype, device type, group, schedule, table) -> CallPlan. A
#: step calls the same few shapes again and again: after the first call, one dict lookup
#: replaces resolving the group, checking operands, building the Problem and the choice.
_calls: dict[tuple, CallPlan] = group_cache(lambda key, call: call.group)


def call_plan(
    pattern: str, a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str
) -> CallPlan:
    """The (cached) CallPlan of one op call; the first call of a signature checks it fully."""
    key = (pattern, a.shape, b.shape, a.dtype, a.device.type, group, schedule, table)
    hit = _calls.get(key)
    pg = resolve_group(group)
    # a group name outlives its group: after destroy_process_group and a new init, the new
    # default group is named "0" again, so a hit counts only for the very same group
    if hit is not None and hit.group is pg:
        if check_enabled() and hit.problem is not None:  # rank agreement, every call if asked
            decide(hit.problem, schedule, table, a.device, hit.group)
        return hit
    prune()  # a miss is rare: drop what destroyed groups left behind
    world, rank = pg.size(), pg.rank()
    a_field = "a_shard" if pattern == "ag_gemm" else "a"
    dtype = check_operands(a, b, a_field)
    if world == 1:
        # a group of one rank (tensor parallelism of 1): the op is its matmul, nothing to overlap
        if schedule:
            raise ValueError(
                f"schedule: {schedule!r} given for a group of 1 rank, which has no "
                "communication to schedule (pass no schedule: the op runs its matmul)"
            )
        call = CallPlan(pg, rank, None, None, None)
        if isinstance(group, str) or group is None:
            _calls[key] = call
        return call
    rows, k = a.shape
    if pattern == "gemm_rs" and rows % world:
        raise ValueError(
            f"a: has {rows} rows, which {world} ranks cannot share evenly (reduce_scatter gives "
            "every rank M/W rows: M must be divisible by W)"
        )
    m = rows * world if pattern == "ag_gemm" else rows
    problem = Problem(pattern=pattern, m=m, n=b.shape[1], k=k, world=world, dtype=dtype)
    choice = decide(problem, schedule, table, a.device, pg)
    call = CallPlan(pg, rank, problem, choice, plan_for(problem, choice.schedule, rank))
    if isinstance(group, str) or group is None:  # a ProcessGroup key would pin the group
        _calls[key] = call
    return call


def run_ag_gemm(
    a_shard: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c [M, N], a_full [M, K])``: ``c = all_gather(a_shard) @ b`` on ``group``."""
    call = call_plan("ag_gemm", a_shard, b, group, schedule, table)
    if call.plan is None:
        return a_shard @ b, a_shard.clone()  # a custom op may not return an alias of an input
    problem, rank = call.problem, call.rank
    S = a_shard.shape[0]  # noqa: N806 - the plan's names
    a_full = a_shard.new_empty((problem.m, problem.k))
    tensors = {
        "a_shard": a_shard,
        "b": b,
        "a_full": a_full,
        "c": a_shard.new_empty((problem.m, problem.n)),
    }
    execute(call.plan, tensors, call.group, a_shard.device)
    # overlapped plans read the local shard in place and leave its rows of a_full unwritten
    a_full[rank * S : (rank + 1) * S].copy_(a_shard)
    return tensors["c"], a_full


def run_gemm_rs(a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str) -> torch.Tensor:
    """``reduce_scatter(a @ b)`` on ``group``: this rank's rows, ``[M/W, N]``."""
    call = call_plan("gemm_rs", a, b, group, schedule, table)
    if call.plan is None:
        return a @ b
    problem = call.problem
    S, N = problem.m_shard, problem.n  # noqa: N806
    tensors = {
        "a": a,
        "b": b,
        "partial": a.new_empty((problem.m, N)),
        "staging": a.new_empty((problem.world * S, N)),
        "c_shard": a.new_empty((S, N)),
    }
    execute(call.plan, tensors, call.group, a.device)
    return tensors["c_shard"]


def run_gemm_ar(a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str) -> torch.Tensor:
    """``all_reduce(a @ b)`` on ``group``: ``[M, N]`` on every rank (a row-parallel linear
    without sequence parallelism, as inference engines run it)."""
    call = call_plan("gemm_ar", a, b, group, schedule, table)
    if call.plan is None:
        return a @ b
    tensors = {"a": a, "b": b}
    for spec in call.plan.buffers:
        if spec.role != "input":
            tensors[spec.name] = a.new_empty(spec.shape)
    execute(call.plan, tensors, call.group, a.device)
    return tensors["c"]
