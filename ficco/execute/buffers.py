"""Tensors behind a plan's buffers: allocation, deterministic random inputs, references.

Inputs are drawn from a generator seeded by (seed, rank, buffer name), so any rank can
regenerate any other rank's inputs to compute a reference without communicating.
"""

from __future__ import annotations

import zlib

import torch

from ficco.plan import Plan, Region
from ficco.problem import Pattern, Problem, torch_dtype


def input_seed(seed: int, rank: int, name: str) -> int:
    return (seed * 1_000_003 + rank * 7919 + zlib.crc32(name.encode())) % (2**63)


def random_input(shape, dtype: torch.dtype, seed: int, device="cpu") -> torch.Tensor:
    """Standard normal values (never zeros: zeros hide unwritten outputs and run faster)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)


def allocate(
    plan: Plan, seed: int, device="cpu", empty=torch.empty, peer_visible_empty=None
) -> dict[str, torch.Tensor]:
    """Inputs filled with random values; workspaces and outputs poisoned with NaN so an
    unwritten element can never pass verification. ``peer_visible_empty`` allocates buffers
    other ranks access directly (symmetric memory on GPUs)."""
    dtype = torch_dtype(plan.problem.dtype)
    tensors = {}
    for spec in plan.buffers:
        make = peer_visible_empty if (spec.peer_visible and peer_visible_empty) else empty
        t = make(spec.shape, dtype=dtype, device=device)
        if spec.role == "input":
            t.copy_(random_input(spec.shape, dtype, input_seed(seed, plan.rank, spec.name), device))
        else:
            t.fill_(float("nan"))
        tensors[spec.name] = t
    return tensors


def view(tensors: dict[str, torch.Tensor], region: Region) -> torch.Tensor:
    t = tensors[region.buffer]
    if region.index is not None:
        t = t[region.index]
    return t[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]]


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
