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
from ficco.patterns import _routed as routed
from ficco.patterns.spec import Ref

if TYPE_CHECKING:
    from ficco.problem import Problem


def comm_bytes(p: Problem) -> int:
    return max(routed.received_from_peers(p)) * SPEC.moved_row_bytes(p)


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
    routed.spec(
        pattern=Pattern.A2A_GEMM,
        comm_bytes=comm_bytes,
        moved_dim="k",
        lookup_sizes="a2a_gemm",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        lowering=Ref("ficco.plan.alltoall:plan_a2a_gemm"),
        buffers=Ref("ficco.plan.alltoall:a2a_gemm_buffers"),
    )
)
