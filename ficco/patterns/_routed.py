"""Parts shared by the routed patterns (a2a_gemm, gemm_a2a): tokens routed to experts, each
rank sending every other rank a block of rows (its tokens for that rank's experts).

:func:`spec` builds a routed pattern's spec from the parts that pattern gives over
:data:`DEFAULTS` (the values both share), so each module shows what differs."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ficco.patterns import _dense as dense
from ficco.patterns import spec_of
from ficco.patterns.spec import (
    BASELINE_COMM,
    SERIAL_PLAN_PARTS,
    Collective,
    ModelSupport,
    PatternSpec,
    Sizes,
)
from ficco.space.schedule import Split

if TYPE_CHECKING:
    from ficco.problem import Problem
    from ficco.space.schedule import Schedule


def largest_block_rows(p: Problem) -> int:
    """The most token rows one rank sends one other rank (itself too)."""
    between, w = p.tokens_between(), p.world
    return max(sum(between[s][d]) for s in range(w) for d in range(w))


def block_rows(p: Problem, schedule: Schedule | None = None) -> int:
    return largest_block_rows(p)


def every_block_rows(p: Problem) -> int:
    """Serial: one GEMM over every block received (the largest, W times)."""
    return largest_block_rows(p) * p.world


def received_from_peers(p: Problem) -> list[int]:
    """Rows each rank receives from its peers (dispatch)."""
    between, w = p.tokens_between(), p.world
    return [sum(sum(between[s][d]) for s in range(w) if s != d) for d in range(w)]


def returned_by_peers(p: Problem) -> list[int]:
    """Rows each rank gets back from its peers (combine)."""
    between, w = p.tokens_between(), p.world
    return [sum(sum(between[s][d]) for d in range(w) if d != s) for s in range(w)]


def sizes(p: Problem) -> Sizes:
    """The most tokens any rank's experts receive; its experts' weights; the largest block
    between two ranks, of whole rows of the matrix the pattern's all-to-all moves."""
    w, row_bytes = p.world, spec_of(p.pattern).moved_row_bytes(p)
    between = p.tokens_between()
    received = [sum(sum(between[s][d]) for s in range(w)) for d in range(w)]
    block = max(sum(between[s][d]) for s in range(w) for d in range(w) if s != d)
    assert p.experts is not None
    weights = p.experts_per_rank * p.k * p.n
    return Sizes(max(received), weights, p.comm_bytes_per_rank(), block * row_bytes, p.experts)


def plan_key(p: Problem, s: Schedule) -> tuple:
    return (s.transport, s.order)


def expert_blocks(p: Problem, rows, counts, b, fp32: bool):
    """``rows`` cut in blocks by ``counts`` (per peer, tokens per local expert), block j of
    each peer times ``b[j]``: in fp32 or the working dtype."""
    import torch

    blocks, row = [], 0
    for per_expert in counts:
        for j, n in enumerate(per_expert):
            x_j = rows[row : row + n]
            blocks.append(x_j.float() @ b[j].float() if fp32 else x_j @ b[j])
            row += n
    return torch.cat(blocks) if blocks else rows.new_empty((0, p.n))


def exchange(t, send: list[int], recv: list[int], device):
    """``all_to_all_single`` of ``t``'s rows with the given split sizes."""
    import torch
    import torch.distributed as dist

    out = torch.empty((sum(recv), t.shape[1]), dtype=t.dtype, device=device)
    dist.all_to_all_single(out, t.contiguous(), recv, send)
    return out


#: the parts a routed pattern has unless its spec gives them: an all-to-all of blocks of
#: tokens, one per peer, cut along M only; no fused schedule; the CUDA baselines are the
#: serial plan's parts; measured, not modelled
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    dict(
        collective=Collective.ALL_TO_ALL,
        routed=True,
        rows_per_rank=False,
        splits=(Split.M,),
        fused=False,
        batched_blocks=True,
        relay=False,
        work_is_gather=False,
        in_selector=True,
        cost_model=ModelSupport.NONE,
        comm_alone=(BASELINE_COMM,),
        flops=dense.gemm_flops,
        shard_rows=block_rows,
        serial_gemm_rows=every_block_rows,
        one_step=dense.never,
        transfer_passes=dense.once,
        plan_key=plan_key,
        extra_roundings=dense.no_roundings,
        sizes=sizes,
        cuda_baselines=SERIAL_PLAN_PARTS,
        scaled_inputs=True,
        problem_fields=(),
    )
)


def spec(**parts: Any) -> PatternSpec:
    """A routed pattern's spec: ``parts`` (the pattern's own), :data:`DEFAULTS` for the rest."""
    return PatternSpec(**(DEFAULTS | parts))
