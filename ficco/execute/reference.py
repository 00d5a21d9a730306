"""References: what a rank's output must be, computed without the schedule under test.

Two ways, one per scale:

- :func:`reference_output` regenerates every rank's inputs (they are seeded by (seed, rank,
  buffer), ``ficco.execute.buffers``) and computes this rank's output in float64 and in the
  working dtype the plain way: no communication, exact, for the small shapes of the CPU
  backend.
- :func:`reference_by_collectives` computes it from this rank's actual tensors through the
  serial collective (NCCL) and an fp32 matmul: for GPU shapes, where float64 on the host
  would take minutes (every pattern).

Both return ``(exact, plain)``; ``plain``'s distance from ``exact`` calibrates the tolerance
(``ficco.execute.verify``). A new pattern adds its branch here.
"""

from __future__ import annotations

import torch

from ficco.execute.buffers import input_seed, random_input
from ficco.problem import Pattern, Problem, torch_dtype
from ficco.verdict import Unavailable


def _inputs_of(problem: Problem, rank: int, name: str, shape, seed: int) -> torch.Tensor:
    return random_input(shape, torch_dtype(problem.dtype), input_seed(seed, rank, name))


def reference_output(problem: Problem, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, plain)`` for rank's output: ``exact`` in float64 from the same low-precision
    inputs; ``plain`` computed the ordinary way in the working dtype (serial collective, one
    matmul), whose distance from ``exact`` calibrates the tolerance."""
    from ficco.plan import build_plan
    from ficco.space import Schedule

    w, dtype = problem.world, torch_dtype(problem.dtype)
    shapes = {
        r: {b.name: b.shape for b in build_plan(problem, Schedule(), r).buffers} for r in range(w)
    }

    def inp(r: int, name: str) -> torch.Tensor:
        return _inputs_of(problem, r, name, shapes[r][name], seed)

    if problem.pattern is Pattern.AG_GEMM:
        a = torch.cat([inp(r, "a_shard") for r in range(w)])
        b = inp(rank, "b")
        return a.double() @ b.double(), (a @ b)
    if problem.pattern is Pattern.GEMM_RS:
        S = problem.m_shard
        rows = slice(rank * S, (rank + 1) * S)
        parts = [(inp(r, "a")[rows], inp(r, "b")) for r in range(w)]
        exact = sum(a.double() @ b.double() for a, b in parts)
        plain = sum((a @ b).float() for a, b in parts).to(dtype)
        return exact, plain
    if problem.pattern is Pattern.GEMM_AR:
        parts = [(inp(r, "a"), inp(r, "b")) for r in range(w)]
        exact = sum(a.double() @ b.double() for a, b in parts)
        plain = sum((a @ b).float() for a, b in parts).to(dtype)
        return exact, plain
    between = problem.tokens_between()
    epr = problem.experts_per_rank
    if problem.pattern is Pattern.A2A_GEMM:
        # received rows ordered (source rank, local expert); expert j of this rank multiplies
        blocks_exact, blocks_plain = [], []
        b = inp(rank, "b")
        for src in range(w):
            x_src, row = inp(src, "x"), sum(sum(between[src][d]) for d in range(rank))
            for j in range(epr):
                n = between[src][rank][j]
                x = x_src[row : row + n]
                blocks_exact.append(x.double() @ b[j].double())
                blocks_plain.append(x @ b[j])
                row += n
        return torch.cat(blocks_exact), torch.cat(blocks_plain)
    # GEMM_A2A: rank ends with its tokens in expert-sorted order, computed by their owners
    blocks_exact, blocks_plain = [], []
    for dst in range(w):
        x_dst, b = inp(dst, "x"), inp(dst, "b")
        row = sum(sum(between[s][dst]) for s in range(rank))
        for j in range(epr):
            n = between[rank][dst][j]
            x = x_dst[row : row + n]
            blocks_exact.append(x.double() @ b[j].double())
            blocks_plain.append(x @ b[j])
            row += n
    return torch.cat(blocks_exact), torch.cat(blocks_plain)


def reference_by_collectives(problem: Problem, tensors: dict, device) -> tuple:
    """(exact fp32, plain in the working dtype) for this rank's output, from the default
    process group's collectives and matmuls of this rank's own inputs (a collective)."""
    import torch.distributed as dist

    if problem.pattern is Pattern.AG_GEMM:
        a_shard, b = tensors["a_shard"], tensors["b"]
        a_full = torch.empty((problem.m, problem.k), dtype=a_shard.dtype, device=device)
        dist.all_gather_into_tensor(a_full, a_shard.contiguous())
        exact = a_full.float() @ b.float()
        return exact, a_full @ b
    if problem.pattern is Pattern.GEMM_RS:
        a, b = tensors["a"], tensors["b"]
        partial = a.float() @ b.float()
        exact = torch.empty((problem.m_shard, problem.n), dtype=torch.float32, device=device)
        dist.reduce_scatter_tensor(exact, partial)
        plain_partial = a @ b
        plain = torch.empty((problem.m_shard, problem.n), dtype=a.dtype, device=device)
        dist.reduce_scatter_tensor(plain, plain_partial)
        return exact, plain
    if problem.pattern is Pattern.GEMM_AR:
        a, b = tensors["a"], tensors["b"]
        exact = a.float() @ b.float()
        dist.all_reduce(exact)
        plain = a @ b
        dist.all_reduce(plain)
        return exact, plain
    if problem.pattern in (Pattern.A2A_GEMM, Pattern.GEMM_A2A):
        return _alltoall_by_collectives(problem, tensors, device)
    raise Unavailable(f"no reference by collectives for {problem.pattern} yet")


def _alltoall_by_collectives(problem: Problem, tensors: dict, device) -> tuple:
    """The all-to-all patterns through ``all_to_all_single`` with splits. Row orders follow
    the plans: a rank's ``x`` of a2a_gemm holds its tokens by (destination rank, expert); what a
    rank receives, and gemm_a2a's ``x`` and output, are ordered by (peer rank, local expert)."""
    import torch.distributed as dist

    rank, w = dist.get_rank(), problem.world
    between = problem.tokens_between()
    x, b = tensors["x"], tensors["b"]  # b [experts/W, K, N]

    def exchange(t: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = torch.empty((sum(recv), t.shape[1]), dtype=t.dtype, device=device)
        dist.all_to_all_single(out, t.contiguous(), recv, send)
        return out

    def experts(rows: torch.Tensor, counts: list[list[int]], fp32: bool) -> torch.Tensor:
        """Each peer's block of ``rows``, expert j's tokens times ``b[j]``."""
        blocks, row = [], 0
        for per_expert in counts:
            for j, n in enumerate(per_expert):
                x_j = rows[row : row + n]
                blocks.append(x_j.float() @ b[j].float() if fp32 else x_j @ b[j])
                row += n
        return torch.cat(blocks) if blocks else rows.new_empty((0, problem.n))

    to_me = [between[src][rank] for src in range(w)]  # per source: tokens per local expert
    from_me = [between[rank][dst] for dst in range(w)]  # per destination: tokens per expert
    if problem.pattern is Pattern.A2A_GEMM:
        received = exchange(x, [sum(c) for c in from_me], [sum(c) for c in to_me])
        return experts(received, to_me, True), experts(received, to_me, False)
    send, recv = [sum(c) for c in to_me], [sum(c) for c in from_me]
    exact = exchange(experts(x, to_me, True), send, recv)
    plain = exchange(experts(x, to_me, False), send, recv)
    return exact, plain
