"""gemm_a2a: MoE expert GEMM + combine, a2a_gemm's mirror.

Each rank holds the tokens it received ``x [R_r, K]`` (ordered (source rank, local expert)),
computes ``x_e @ b_e`` and returns every row to its source rank, which ends with
``y [T_r, N]`` in its original expert-sorted order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficco.patterns import Pattern, register
from ficco.patterns import _routed as routed
from ficco.patterns.spec import Ref

if TYPE_CHECKING:
    from ficco.problem import Problem


def comm_bytes(p: Problem) -> int:
    return max(routed.returned_by_peers(p)) * SPEC.moved_row_bytes(p)


def reference(p: Problem, rank: int, inp) -> tuple:
    """The rank ends with its tokens in expert-sorted order, computed by their owners."""
    import torch

    between, epr = p.tokens_between(), p.experts_per_rank
    blocks_exact, blocks_plain = [], []
    for dst in range(p.world):
        x_dst, b = inp(dst, "x"), inp(dst, "b")
        row = sum(sum(between[s][dst]) for s in range(rank))
        for j in range(epr):
            n = between[rank][dst][j]
            x = x_dst[row : row + n]
            blocks_exact.append(x.double() @ b[j].double())
            blocks_plain.append(x @ b[j])
            row += n
    return torch.cat(blocks_exact), torch.cat(blocks_plain)


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    """The experts' blocks computed here, then returned through ``all_to_all_single``."""
    import torch.distributed as dist

    rank, between = dist.get_rank(), p.tokens_between()
    x, b = tensors["x"], tensors["b"]  # b [experts/W, K, N]
    to_me = [between[src][rank] for src in range(p.world)]
    from_me = [between[rank][dst] for dst in range(p.world)]
    send, recv = [sum(c) for c in to_me], [sum(c) for c in from_me]
    exact = routed.exchange(routed.expert_blocks(p, x, to_me, b, True), send, recv, device)
    plain = routed.exchange(routed.expert_blocks(p, x, to_me, b, False), send, recv, device)
    return exact, plain


SPEC = register(
    routed.spec(
        pattern=Pattern.GEMM_A2A,
        comm_bytes=comm_bytes,
        moved_dim="n",
        lookup_sizes="gemm_a2a",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        lowering=Ref("ficco.plan.alltoall:plan_gemm_a2a"),
        buffers=Ref("ficco.plan.alltoall:gemm_a2a_buffers"),
    )
)
