"""a2a_gemm: MoE dispatch + expert GEMM (also DLRM's embedding exchange).

Each rank holds its tokens ``x [T_r, K]`` sorted by (destination rank, expert); ``experts``
experts, ``experts/W`` per rank, expert ``e`` owned by rank ``e // (experts/W)`` with weight
``b_e [K, N]``. Each rank receives the tokens routed to its experts and produces
``y [R_r, N]``, rows ordered (source rank, local expert). ``m`` is the global number of
routed tokens and ``routing[s][e]`` the tokens rank ``s`` sends to expert ``e``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns import _routed as routed
from ficco.patterns.spec import (
    BASELINE_COMM,
    SERIAL_PLAN_PARTS,
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
    return max(routed.received_from_peers(p)) * SPEC.moved_row_bytes(p)


def sizes(p: Problem) -> Sizes:
    return routed.sizes(p, SPEC.moved_row_bytes(p))


def reference(p: Problem, rank: int, inp) -> tuple:
    """Received rows ordered (source rank, local expert); expert j of this rank multiplies."""
    import torch

    between, epr = p.tokens_between(), p.experts_per_rank
    blocks_exact, blocks_plain = [], []
    b = inp(rank, "b")
    for src in range(p.world):
        x_src, row = inp(src, "x"), sum(sum(between[src][d]) for d in range(rank))
        for j in range(epr):
            n = between[src][rank][j]
            x = x_src[row : row + n]
            blocks_exact.append(x.double() @ b[j].double())
            blocks_plain.append(x @ b[j])
            row += n
    return torch.cat(blocks_exact), torch.cat(blocks_plain)


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    """Through ``all_to_all_single`` with splits: a rank's ``x`` holds its tokens by
    (destination rank, expert); what it receives is ordered by (peer rank, local expert)."""
    import torch.distributed as dist

    rank, between = dist.get_rank(), p.tokens_between()
    x, b = tensors["x"], tensors["b"]  # b [experts/W, K, N]
    to_me = [between[src][rank] for src in range(p.world)]
    from_me = [between[rank][dst] for dst in range(p.world)]
    received = routed.exchange(x, [sum(c) for c in from_me], [sum(c) for c in to_me], device)
    return (
        routed.expert_blocks(p, received, to_me, b, True),
        routed.expert_blocks(p, received, to_me, b, False),
    )


SPEC = register(
    PatternSpec(
        pattern=Pattern.A2A_GEMM,
        collective=Collective.ALL_TO_ALL,
        routed=True,
        rows_per_rank=False,
        splits=(Split.M,),
        fused=False,
        batched_blocks=True,
        in_selector=True,
        cost_model=ModelSupport.NONE,
        comm_alone=(BASELINE_COMM,),
        flops=dense.gemm_flops,
        comm_bytes=comm_bytes,
        moved_dim="k",
        shard_rows=routed.block_rows,
        serial_gemm_rows=routed.every_block_rows,
        one_step=dense.never,
        transfer_passes=dense.once,
        plan_key=routed.plan_key,
        extra_roundings=dense.no_roundings,
        sizes=sizes,
        lookup_sizes="a2a_gemm",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=SERIAL_PLAN_PARTS,
        lowering=Ref("ficco.plan.alltoall:plan_a2a_gemm"),
        scaled_inputs=True,
        problem_fields=(),
        buffers=Ref("ficco.plan.alltoall:a2a_gemm_buffers"),
    )
)
