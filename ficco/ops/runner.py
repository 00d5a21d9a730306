"""One op call: the ranks' agreement, the call's problem and schedule, its cached plan, the
plan's buffers, the run.

The first call of a signature (op, shapes, dtype, group, schedule, table, rows) exchanges it
with the group's other ranks (``ficco.ops.agree``: a disagreement raises on every rank), then
decides (``ficco.ops.choice``) and builds the plan of (problem, schedule, rank) once
(:func:`plan_for`); later calls of the signature are one dict lookup. The call's tensors are
the plan's buffers (``Plan.buffers``): the caller's inputs, used in place, and a fresh tensor
for every other buffer of its spec (the output is handed to the caller, and the gathered
``a_full`` is kept for the weight gradient, so neither may be reused by the next call). The
one interpreter (``ficco.execute.interpreter``) runs the plan through the CPU primitives on
the caller's group (``ficco.execute.cpu``), or through ficco's CUDA primitives on the
caller's NCCL group and stream (``ficco.ops.cuda``).

Shapes: ``a [..., K]`` has its leading dimensions flattened into rows (row-major), the first
one being the dimension sharded across ranks. Uneven shards (``rows``: every rank's size of
that first dimension) run as the even problem of the largest shard: each rank's rows are
padded with zeros to the largest count before the plan runs, and the padding is cut from the
result (one copy of the output, and of ``a`` for a reduce-scatter), so every schedule carries
them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from ficco.execute.cpu import CpuPrimitives
from ficco.execute.interpreter import interpret
from ficco.ops.agree import Signature, agree, agree_decision, hosts
from ficco.ops.choice import Choice, Target, check_enabled, choose
from ficco.ops.groups import group_cache, prune
from ficco.ops.observe import count, profiled, record_name, tally_key
from ficco.plan import Plan, build_plan
from ficco.problem import Problem, split_evenly
from ficco.space import Schedule

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: op -> pattern
PATTERNS = {
    "all_gather_matmul": "ag_gemm",
    "matmul_reduce_scatter": "gemm_rs",
    "matmul_all_reduce": "gemm_ar",
}
#: the group backends each device's tensors travel on (cuda on gloo: ranks sharing a GPU)
_CARRIERS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo")}


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
    """The common dtype name of ``a @ b`` (``a [..., rows, K]``); refuses mismatches with the
    field and rule."""
    if a.dim() < 2 or b.dim() != 2:
        raise ValueError(
            f"{a_field}, b: {a_field} must be [..., rows, K] and b [K, N], got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[-1] != b.shape[0]:
        raise ValueError(
            f"b: has {b.shape[0]} rows but {a_field} has {a.shape[-1]} columns (a @ b needs "
            "them equal)"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"b: dtype {b.dtype} differs from {a_field}'s {a.dtype}")
    if a.device != b.device:
        raise ValueError(f"b: on {b.device}, {a_field} on {a.device}: must be on one device")
    return dtype_name(a_field, a)


def check_group(pg: dist.ProcessGroup, device: torch.device) -> Target:
    """The target of ``device``'s tensors on ``pg`` (hosts still to count); refuses a group
    whose backend cannot carry them (the same answer on every rank)."""
    backend = str(dist.get_backend(pg))
    carriers = _CARRIERS.get(device.type, ())
    if not any(c in backend for c in carriers):
        raise ValueError(
            f"group: its backend {backend!r} cannot carry {device.type} tensors (ficco.ops runs "
            "cpu tensors on gloo groups, cuda tensors on NCCL groups, or on gloo groups of "
            "ranks that share a GPU)"
        )
    return Target(device.type, shares_gpu=device.type == "cuda" and "nccl" not in backend)


def even_rows(total: int, world: int) -> list[int]:
    """Every rank's share of ``total`` rows as ``torch.tensor_split`` deals them (the first
    ``total % world`` ranks one more): a ``rows=`` for a length W does not divide."""
    return split_evenly(total, world)


def shard_rows(op: str, a: torch.Tensor, rows: tuple[int, ...], world: int) -> tuple[int, ...]:
    """Every rank's size of the sharded first dimension (the operands already agreed)."""
    if op == "matmul_all_reduce":
        if rows:
            raise ValueError("rows: matmul_all_reduce shards no rows (every rank gets all M)")
        return ()
    if rows:
        if len(rows) != world or min(rows) < 0:
            raise ValueError(
                f"rows: {list(rows)} must give one count >= 0 per rank of the group ({world})"
            )
        if op == "matmul_reduce_scatter" and sum(rows) != a.shape[0]:
            raise ValueError(
                f"rows: {list(rows)} sums to {sum(rows)}, but a's first dimension has "
                f"{a.shape[0]} (the reduce-scatter deals them out)"
            )
        return rows
    if op == "all_gather_matmul":
        return (a.shape[0],) * world
    if a.shape[0] % world:
        raise ValueError(
            f"a: has {a.shape[0]} rows, which {world} ranks cannot share evenly (pass rows= "
            f"with every rank's count, e.g. rows={even_rows(a.shape[0], world)})"
        )
    return (a.shape[0] // world,) * world


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


def execute(plan: Plan, tensors: dict, group: dist.ProcessGroup, device: torch.device) -> None:
    """Run ``plan`` over ``tensors`` (buffer name -> tensor) on ``group``, on CPU or CUDA."""
    if device.type == "cuda":
        from ficco.ops.cuda import run_plan_cuda

        run_plan_cuda(plan, tensors, group, device)
    else:
        interpret(CpuPrimitives(plan, tensors, next_run(pg=group), group=group))


def bind(plan: Plan, inputs: dict[str, torch.Tensor], like: torch.Tensor) -> dict:
    """The plan's buffers: ``inputs`` by name (checked against their specs), a fresh tensor
    (``like``'s dtype and device) of its spec's shape for every other buffer."""
    tensors = {}
    for spec in plan.buffers:
        if spec.role == "input":
            t = inputs[spec.name]
            if tuple(t.shape) != spec.shape:
                raise AssertionError(f"{spec.name}: shape {tuple(t.shape)}, plan {spec.shape}")
        else:
            t = like.new_empty(spec.shape)
        tensors[spec.name] = t
    return tensors


@dataclass(frozen=True, slots=True, eq=False)
class CallPlan:
    """What every call of one signature runs: the group, the problem, the choice, the plan."""

    op: str
    group: dist.ProcessGroup
    rank: int
    firsts: tuple[int, ...]
    """Every rank's size of a's sharded first dimension (matmul_all_reduce: none)."""
    counts: tuple[int, ...]
    """Every rank's rows after flattening (``firsts`` times the inner dimensions)."""
    problem: Problem | None
    """None (with choice and plan) for a group of one rank: the call is its matmul."""
    choice: Choice | None
    plan: Plan | None
    tally: tuple = ()
    record: str = ""

    @property
    def uneven(self) -> bool:
        return len(set(self.counts)) > 1


#: (op, a shape, b shape, dtype, device type, group, schedule, table, rows) -> CallPlan. A
#: step calls the same few shapes again and again: after the first call, one dict lookup
#: replaces the exchange, resolving the group, checking operands and the choice.
_calls: dict[tuple, CallPlan] = group_cache(lambda key, call: call.group)


def signature_key(op: str, a, b, group, schedule: str, table: str, rows) -> tuple:
    # a ProcessGroup stands in the key by its name (the cached CallPlan holds the group
    # itself, which a hit must be: `call_plan`), so a call passing the group object hits the
    # cache like one passing its name
    name = group if group is None or isinstance(group, str) else group.group_name
    return (op, a.shape, b.shape, a.dtype, a.device.type, name, schedule, table, tuple(rows))


def cached_choice(op: str, a, b, group, schedule: str, table: str, rows=()) -> Choice | None:
    """The choice calls of this signature run, once one has run on this rank (else None)."""
    hit = _calls.get(signature_key(op, a, b, group, schedule, table, rows))
    return None if hit is None or hit.group is not resolve_group(group) else hit.choice


def call_plan(
    op: str, a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str, rows=()
) -> CallPlan:
    """The (cached) CallPlan of one op call; the first call of a signature agrees with the
    group's other ranks and checks it fully."""
    rows = tuple(rows)
    key = signature_key(op, a, b, group, schedule, table, rows)
    hit = _calls.get(key)
    pg = resolve_group(group)
    # a group name outlives its group: after destroy_process_group and a new init, the new
    # default group is named "0" again, so a hit counts only for the very same group
    if hit is not None and hit.group is pg:
        if check_enabled() and hit.problem is not None:  # agreement on every call, if asked
            agree(Signature.of(op, a, b, schedule, table, rows), pg, a.device)
            agree_decision(op, hit.choice.digest, str(hit.choice.schedule), pg, a.device)
        if hit.choice is not None:
            count(hit.tally, hit.choice)
        return hit
    prune()  # a miss is rare: drop what destroyed groups left behind
    world, rank = pg.size(), pg.rank()
    a_field = "a_shard" if op == "all_gather_matmul" else "a"
    if world == 1:
        # a group of one rank (tensor parallelism of 1): the op is its matmul, nothing to overlap
        check_operands(a, b, a_field)
        if schedule:
            raise ValueError(
                f"schedule: {schedule!r} given for a group of 1 rank, which has no "
                "communication to schedule (pass no schedule: the op runs its matmul)"
            )
        firsts = shard_rows(op, a, rows, 1)
        call = CallPlan(op, pg, rank, firsts, firsts, None, None, None)
    else:
        target = check_group(pg, a.device)
        every = agree(Signature.of(op, a, b, schedule, table, rows), pg, a.device)
        # the ranks agree: every check below answers alike on every rank
        dtype = check_operands(a, b, a_field)
        firsts = shard_rows(op, a, rows, world)
        inner = math.prod(a.shape[1:-1])
        counts = tuple(f * inner for f in firsts)
        m = world * max(counts) if counts else math.prod(a.shape[:-1])
        problem = Problem(
            pattern=PATTERNS[op], m=m, n=b.shape[1], k=a.shape[-1], world=world, dtype=dtype
        )
        target = dataclasses.replace(target, hosts=hosts(every))
        choice = choose(problem, schedule, table, target)
        if check_enabled():
            agree_decision(op, choice.digest, str(choice.schedule), pg, a.device)
        plan = plan_for(problem, choice.schedule, rank)
        tally = tally_key(op, choice)
        call = CallPlan(
            op, pg, rank, firsts, counts, problem, choice, plan, tally, record_name(op, choice)
        )
        count(tally, choice)
    _calls[key] = call
    return call


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t [r, K]`` with zero rows below it: ``[rows, K]``."""
    padded = t.new_zeros((rows, t.shape[1]))
    padded[: t.shape[0]].copy_(t)
    return padded


def spread(t: torch.Tensor, counts: tuple[int, ...], rows: int) -> torch.Tensor:
    """``t [sum(counts), K]`` with rank r's ``counts[r]`` rows at ``r * rows``, zeros between:
    ``[W * rows, K]``."""
    out = t.new_zeros((len(counts) * rows, t.shape[1]))
    start = 0
    for r, n in enumerate(counts):
        out[r * rows : r * rows + n].copy_(t[start : start + n])
        start += n
    return out


def compact(t: torch.Tensor, counts: tuple[int, ...], rows: int) -> torch.Tensor:
    """The inverse of :func:`spread`: rank r's first ``counts[r]`` rows of its ``rows``."""
    return torch.cat([t[r * rows : r * rows + n] for r, n in enumerate(counts)])


def run_ag_gemm(
    a_shard: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str, rows=()
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c [sum(rows), ..., N], a_full [M, K])``: ``c = all_gather(a_shard) @ b`` on
    ``group``, every rank's rows in rank order (``a_full``: the gathered rows, flattened)."""
    call = call_plan("all_gather_matmul", a_shard, b, group, schedule, table, rows)
    k, n = a_shard.shape[-1], b.shape[1]
    shape = (sum(call.firsts), *a_shard.shape[1:-1], n)
    a_rows = a_shard.reshape(-1, k)
    if call.plan is None:
        return (a_rows @ b).view(shape), a_rows.clone()  # a custom op may not alias an input
    rank, S = call.rank, call.problem.m_shard  # noqa: N806 - the plan's names
    a_in = a_rows if a_rows.shape[0] == S else pad_rows(a_rows, S)
    with profiled(call.record):
        tensors = bind(call.plan, {"a_shard": a_in, "b": b}, a_rows)
        execute(call.plan, tensors, call.group, a_shard.device)
    c, a_full = tensors["c"], tensors["a_full"]
    # overlapped plans read the local shard in place and leave its rows of a_full unwritten
    a_full[rank * S : (rank + 1) * S].copy_(a_in)
    if call.uneven:
        c, a_full = compact(c, call.counts, S), compact(a_full, call.counts, S)
    return c.view(shape), a_full


def run_gemm_rs(
    a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str, rows=()
) -> torch.Tensor:
    """``reduce_scatter(a @ b)`` on ``group``: this rank's rows, ``[rows[rank], ..., N]``."""
    call = call_plan("matmul_reduce_scatter", a, b, group, schedule, table, rows)
    k, n = a.shape[-1], b.shape[1]
    shape = (call.firsts[call.rank], *a.shape[1:-1], n)
    a_rows = a.reshape(-1, k)
    if call.plan is None:
        return (a_rows @ b).view(shape)
    S = call.problem.m_shard  # noqa: N806
    a_in = spread(a_rows, call.counts, S) if call.uneven else a_rows
    with profiled(call.record):
        tensors = bind(call.plan, {"a": a_in, "b": b}, a_rows)
        execute(call.plan, tensors, call.group, a.device)
    return tensors["c_shard"][: call.counts[call.rank]].view(shape)


def run_gemm_ar(a: torch.Tensor, b: torch.Tensor, group, schedule: str, table: str) -> torch.Tensor:
    """``all_reduce(a @ b)`` on ``group``: ``[..., N]`` on every rank (a row-parallel linear
    without sequence parallelism, as inference engines run it)."""
    call = call_plan("matmul_all_reduce", a, b, group, schedule, table)
    shape = (*a.shape[:-1], b.shape[1])
    a_rows = a.reshape(-1, a.shape[-1])
    if call.plan is None:
        return (a_rows @ b).view(shape)
    with profiled(call.record):
        tensors = bind(call.plan, {"a": a_rows, "b": b}, a_rows)
        execute(call.plan, tensors, call.group, a.device)
    return tensors["c"].view(shape)
