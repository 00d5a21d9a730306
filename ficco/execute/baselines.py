"""Baselines every measurement shows beside the schedules.

``gemm_alone`` and ``comm_alone`` (the undecomposed GEMM and collective, each isolated: the
``t_gemm`` and ``t_comm`` of every signature) on every backend; on CUDA also ``serial_eager``
(serial NCCL collective then cuBLAS, issued the plain eager way), ``serial_graph`` (the same,
captured in a CUDA graph where NCCL allows it) and ``async_tp`` (PyTorch's
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``), each pattern's own (its
spec's ``cuda_baselines``: gemm_ar's adds the whole all-reduce alone through symmetric
memory's one-shot and two-shot kernels, so its ideal takes the fastest all-reduce alone,
``ficco.patterns.ideal_ms``). The isolated parts get
captured twins (``@graph``) timed beside them. On CPU the parts are the ``serial/nccl/cublas``
plan's collective and GEMM tasks run through the interpreter (modes ``comm`` and ``gemm``).
A pattern whose baselines are its serial plan's parts may list further ``comm_alone``
baselines that are another serial plan's collective (:data:`COMM_ALONE_SCHEDULES`: emb_a2a's
``comm_alone_ce``, the ``serial/ce`` plan's copy-engine pushes), so its ideal takes the
fastest real exchange, not only NCCL's eager one; gemm_ar lists ``comm_lamport``, the
``serial/lamport1`` plan's all-reduce (on CUDA its spec's baselines time the same kernel).
A problem with gemm_ar's add_rms_norm epilogue has it in every all-reduce baseline (the
serial plan's ``comm`` part holds its norm), so ``comm_alone`` is then the unfused
all-reduce + norm and ``comm_lamport`` the fused launch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ficco.measure.record import BASELINE_ASYNC_TP, BASELINE_COMM, BASELINE_GEMM
from ficco.patterns import spec_of
from ficco.patterns.emb_a2a import BASELINE_COMM_CE
from ficco.patterns.gemm_ar import (
    BASELINE_COMM_LAMPORT,
    BASELINE_COMM_ONE_SHOT,
    BASELINE_COMM_TWO_SHOT,
)
from ficco.patterns.spec import BASELINE_SERIAL_EAGER
from ficco.problem import Problem
from ficco.space import Schedule, is_legal

#: baseline: the same serial NCCL + cuBLAS captured in a CUDA graph (where NCCL allows it)
BASELINE_SERIAL_GRAPH = "serial_graph"
#: suffix of the captured twin of an isolated part (gemm_alone, comm_alone), timed beside it
GRAPHED_PART = "@graph"
#: the isolated parts: each gets a captured twin, and keeps the faster of the two issues
ISOLATED_PARTS = (
    BASELINE_GEMM,
    BASELINE_COMM,
    BASELINE_COMM_ONE_SHOT,
    BASELINE_COMM_TWO_SHOT,
    BASELINE_COMM_LAMPORT,
    BASELINE_COMM_CE,
)
#: further ``comm_alone`` baselines that are another serial plan's collective part
COMM_ALONE_SCHEDULES = {
    BASELINE_COMM_CE: Schedule.parse("serial/ce/cublas"),
    BASELINE_COMM_LAMPORT: Schedule.parse("serial/lamport1/cublas"),
}

__all__ = [
    "BASELINE_ASYNC_TP",
    "BASELINE_COMM",
    "BASELINE_COMM_CE",
    "BASELINE_COMM_LAMPORT",
    "BASELINE_COMM_ONE_SHOT",
    "BASELINE_COMM_TWO_SHOT",
    "BASELINE_GEMM",
    "BASELINE_SERIAL_EAGER",
    "BASELINE_SERIAL_GRAPH",
    "GRAPHED_PART",
    "COMM_ALONE_SCHEDULES",
    "ISOLATED_PARTS",
    "alternative_runs",
    "comm_alternatives",
    "cuda_baselines",
    "plan_baselines",
    "plan_part_baselines",
]


def comm_alternatives(problem: Problem) -> dict[str, Schedule]:
    """The pattern's further ``comm_alone`` baselines (its spec's, past the first) that are
    another serial plan's collective, where the space allows that plan: name -> its
    schedule."""
    names = spec_of(problem.pattern).comm_alone[1:]
    return {
        n: COMM_ALONE_SCHEDULES[n]
        for n in names
        if n in COMM_ALONE_SCHEDULES and is_legal(problem, COMM_ALONE_SCHEDULES[n])
    }


def alternative_runs(
    problem: Problem, rank: int, runner: Callable[[Schedule], Callable[..., None]]
) -> dict[str, Callable[..., None]]:
    """name -> ``runner(schedule)`` (a ``run(mode)`` of that schedule's plan on this rank)
    for each of :func:`comm_alternatives`; a plan the backend refuses runs as a callable
    raising why, so the baseline is recorded ``unavailable``."""
    from ficco.verdict import Unavailable

    out = {}
    for name, schedule in comm_alternatives(problem).items():
        try:
            out[name] = runner(schedule)
        except Unavailable as err:
            out[name] = functools.partial(_refused, str(err))
    return out


def _refused(why: str, *args) -> None:
    from ficco.verdict import Unavailable

    raise Unavailable(why)


def plan_part_baselines(
    run_serial_plan: Callable[..., None],
    alternatives: dict[str, Callable[..., None]] | None = None,
) -> dict[str, Callable[[], None]]:
    """``gemm_alone`` and ``comm_alone`` as the serial plan's parts: ``run_serial_plan(mode)``
    interprets the ``serial/nccl/cublas`` plan in that mode; ``alternatives``: name -> the
    same for the plan of :func:`comm_alternatives`' schedule (its ``comm`` part timed)."""
    out = {
        BASELINE_GEMM: functools.partial(run_serial_plan, "gemm"),
        BASELINE_COMM: functools.partial(run_serial_plan, "comm"),
    }
    for name, run_plan in (alternatives or {}).items():
        out[name] = functools.partial(run_plan, "comm")
    return out


def plan_baselines(
    run_serial_plan: Callable[..., None],
    output,
    alternatives: dict[str, Callable[..., None]] | None = None,
) -> dict[str, Callable[[], None]]:
    """The parts of :func:`plan_part_baselines` plus ``serial_eager``: the whole serial plan,
    whose output ``output`` (``ficco.execute.buffers.output_of``) is verified like a
    schedule's."""
    from ficco.execute.buffers import poison_output

    first = [True]

    def serial_eager() -> None:
        if first[0]:  # the first call is the verified one: it must write every element
            poison_output(output)
            first[0] = False
        run_serial_plan()

    serial_eager.out = output
    parts = plan_part_baselines(run_serial_plan, alternatives)
    return {**parts, BASELINE_SERIAL_EAGER: serial_eager}


def cuda_baselines(
    problem: Problem, tensors: dict, device, group_name: str
) -> dict[str, Callable[[], None]]:
    """name -> callable issuing the baseline on the current stream; the output tensor each
    writes (for verification) is attribute ``out`` of the callable where it has one. Each
    pattern's are its spec's ``cuda_baselines``; a pattern whose baselines are its serial
    plan's parts (:data:`~ficco.patterns.SERIAL_PLAN_PARTS`) gets them from the executor,
    which runs plans (:func:`plan_baselines`)."""
    if problem.scaled:  # fp8: torch._scaled_mm and async-TP's scaled ops
        from ficco.execute.scaled_baselines import scaled_cuda_baselines

        return scaled_cuda_baselines(problem, tensors, device, group_name)
    baselines = spec_of(problem.pattern).cuda_baselines
    if not callable(baselines):
        raise ValueError(
            f"pattern: {problem.pattern}'s CUDA baselines are its serial plan's parts "
            "(plan_baselines), not a function of its tensors"
        )
    return baselines(problem, tensors, device, group_name)
