"""One process plays every rank of a gemm_ar schedule with the add_rms_norm epilogue (or
add_rms_norm_fp8), for the tests of the fused kernels (lamport1, lamport2) through the schedule path
(``tests/test_gemm_ar_epilogue.py`` on CPU under Triton's interpreter,
``tests/gpu/test_gemm_ar_epilogue_gpu.py`` on one GPU).

Each rank's plan is lowered and its buffers allocated as the executors do (seeded inputs,
NaN-poisoned outputs), its GEMMs run, then every norm task is issued through the executor's
operand mapping (``ficco.execute.allreduce.norm_operands``), each the lamport kernel's fused
launch, phase by phase over every rank (every rank's push, then every rank's reduce and
norm, then the two-shot's gather: one process cannot wait on its own later launch). Each
rank's output is then verified against the float64 reference as a schedule's output is.
"""

from __future__ import annotations

import functools

import torch

from ficco.execute.allreduce import norm_operands
from ficco.execute.buffers import allocate, output_of, view
from ficco.execute.reference import reference_output
from ficco.execute.verify import Check, check_output
from ficco.plan import GemmOp, NormOp, build_plan
from ficco.problem import Problem
from ficco.space import Schedule

SEED = 3


def play_ranks(problem: Problem, schedule: Schedule, device: str = "cpu") -> list[Check]:
    """Every rank's check of ``schedule``'s output, run in this process on ``device``."""
    from ficco.kernels import allreduce_lamport as lam

    w = problem.world
    plans = [build_plan(problem, schedule, r) for r in range(w)]
    # drawn on the host (the reference regenerates them there), then moved
    tensors = [{k: t.to(device) for k, t in allocate(p, SEED).items()} for p in plans]
    views = [functools.partial(view, t) for t in tensors]
    for plan, at in zip(plans, views, strict=True):
        for task in plan.tasks:
            if isinstance(task.op, GemmOp):
                at(task.op.out).copy_(at(task.op.a) @ at(task.op.b))
    norms = [[t.op for t in p.tasks if isinstance(t.op, NormOp)] for p in plans]
    assert norms[0] and all(op.all_reduce is not None for ops in norms for op in ops), (
        f"{schedule}: every norm task is a lamport kernel's fused all-reduce"
    )
    kind = norms[0][0].all_reduce
    row_bytes = lam.norm_row_elements(kind, problem.m, problem.n, w) * 4  # fp32 at most
    ws = lam.local_workspaces(w, max(1 << 16, row_bytes), device=device, timeout_s=10.0)
    for j, first in enumerate(norms[0]):
        operands = [norm_operands(norms[r][j], views[r]) for r in range(w)]
        for phase in lam.phases_of(kind):
            for r, (src, residual, weight, normed, new_residual, scale) in enumerate(operands):
                lam.all_reduce_rms_norm(
                    ws[r], src, residual, weight, first.eps, normed, new_residual, scale,
                    phases=phase, kind=kind,
                )  # fmt: skip
    if device != "cpu":
        torch.cuda.synchronize()
    checks = []
    for r, plan in enumerate(plans):
        ws[r].raise_on_timeout(f"rank {r}")
        exact, plain = reference_output(problem, r, SEED)
        out = output_of(plan, {name: t.cpu() for name, t in tensors[r].items()})
        checks.append(check_output(out, exact, plain, problem, schedule))
    return checks
