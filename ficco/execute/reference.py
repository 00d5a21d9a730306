"""References: what a rank's output must be, computed without the schedule under test.

Two ways, one per scale, each the pattern's own (its spec's ``reference`` and
``reference_by_collectives``, ``ficco.patterns``):

- :func:`reference_output` regenerates every rank's inputs (they are seeded by (seed, rank,
  buffer), ``ficco.execute.buffers``) and computes this rank's output in float64 and in the
  working dtype the plain way: no communication, exact, for the small shapes of the CPU
  backend.
- :func:`reference_by_collectives` computes it from this rank's actual tensors through the
  serial collective (NCCL) and an fp32 matmul: for GPU shapes, where float64 on the host
  would take minutes (every pattern).

Both return ``(exact, plain)``; ``plain``'s distance from ``exact`` calibrates the tolerance
(``ficco.execute.verify``). For an output of parts (``Plan.output`` a tuple) each is a tuple,
one per part.
"""

from __future__ import annotations

import torch

from ficco.execute.buffers import (
    buffer_dtype,
    constant_input,
    input_seed,
    random_input,
    source_rank,
)
from ficco.patterns import spec_of
from ficco.problem import Problem, torch_dtype


def reference_output(problem: Problem, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, plain)`` for rank's output: ``exact`` in float64 from the same low-precision
    inputs; ``plain`` computed the ordinary way in the working dtype (serial collective, one
    matmul), whose distance from ``exact`` calibrates the tolerance."""
    spec = spec_of(problem.pattern)
    buffers = spec.buffers.load()
    specs = {r: {b.name: b for b in buffers(problem, r)} for r in range(problem.world)}
    shapes = {r: {name: b.shape for name, b in specs[r].items()} for r in specs}

    if problem.scaled:
        # the float64 values the fp8 bits and scales stand for: exact is computed from them;
        # plain rounds once to the output dtype (bf16), as the GEMM's store does
        from ficco.execute.scaled import dequantized_input

        def dequantized(r: int, name: str) -> torch.Tensor:
            return dequantized_input(problem, r, name, shapes[r][name], seed)

        exact, plain = spec.reference(problem, rank, dequantized)
        return exact, plain.to(torch_dtype(problem.output_dtype))

    def inp(r: int, name: str) -> torch.Tensor:
        buf = specs[r][name]
        if buf.role == "constant":
            return constant_input(problem, r, name)
        drawn = input_seed(seed, source_rank(buf, r), name)
        return random_input(shapes[r][name], buffer_dtype(problem, buf), drawn)

    return spec.reference(problem, rank, inp)


def reference_by_collectives(problem: Problem, tensors: dict, device) -> tuple:
    """(exact fp32, plain in the working dtype) for this rank's output, from the default
    process group's collectives and matmuls of this rank's own inputs (a collective). Scaled
    (fp8) inputs go in dequantized to fp32; plain is then rounded to the output dtype."""
    spec = spec_of(problem.pattern)
    if not problem.scaled:
        return spec.reference_by_collectives(problem, tensors, device)
    from ficco.execute.scaled import dequantize, scale_name

    values = {
        name: dequantize(t, tensors[scale_name(name)])
        for name, t in tensors.items()
        if scale_name(name) in tensors
    }
    exact, plain = spec.reference_by_collectives(problem, values, device)
    return exact, plain.to(torch_dtype(problem.output_dtype))
