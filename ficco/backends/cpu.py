"""``cpu``: W processes over gloo, Triton under its interpreter (``ficco.execute.cpu``).

It checks every pattern and schedule axis for correctness without a GPU; its timings (host
``perf_counter`` after a barrier) exercise the harness only and never become profiles.
"""

from __future__ import annotations

import os

from ficco.backends import BackendSpec, Refusal, register_backend
from ficco.defaults import CPU_MAX_WORLD, CPU_RANK_MEMORY_GB, FLAG_TIMEOUT_S, TIMEOUT_S
from ficco.execute.options import TimingOptions
from ficco.patterns.spec import Ref
from ficco.problem import Problem
from ficco.space import Gemm, Schedule

#: Interleaved timing rounds of a CPU sweep: enough to exercise the protocol, no more (its
#: timings are never profiles).
CPU_ROUNDS = 3


def setup_rank(rank: int, world: int, init_file: str | None, timeout_s: float):
    from ficco.execute.cpu import CpuBackend
    from ficco.execute.cpu_group import init_gloo_rank

    init_gloo_rank(rank, world, init_file, timeout_s)
    # the pool's private directory holds the ranks' shared (symmetric) buffers too; a flag
    # wait gives up well before the ranks' own timeout
    return CpuBackend(
        rank,
        world,
        shared_dir=os.path.dirname(init_file) if init_file else None,
        flag_timeout_s=min(FLAG_TIMEOUT_S, timeout_s / 4),
    )


def check(problem: Problem, schedule: Schedule) -> Refusal:
    if schedule.gemm is Gemm.TRITON and problem.dtype == "bf16":
        return "Triton's CPU interpreter computes bf16 dot products wrongly; use fp32 or fp16"
    return None


def check_world(world: int) -> Refusal:
    """At most ``CPU_MAX_WORLD`` ranks (``ficco.defaults`` says why), and
    ``CPU_RANK_MEMORY_GB`` each must fit in the memory available now."""
    if world > CPU_MAX_WORLD:
        return (
            f"the cpu backend runs one process per rank and allows at most {CPU_MAX_WORLD} "
            "(ficco.defaults.CPU_MAX_WORLD: each rank loads torch, ~0.26 GB)"
        )
    available = available_memory_gb()
    if available is not None and world * CPU_RANK_MEMORY_GB > available:
        return (
            f"{world} cpu ranks need about {world * CPU_RANK_MEMORY_GB:.1f} GB "
            f"({CPU_RANK_MEMORY_GB} GB each) and this machine has {available:.1f} GB available"
        )
    return None


def available_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):  # not a POSIX system that reports it
        return None


CPU = register_backend(
    BackendSpec(
        name="cpu",
        summary="W processes over gloo, Triton under its interpreter; verifies (timings "
        "exercise the harness only).",
        device="cpu",
        setup_rank=setup_rank,
        gpus=lambda world: 0,
        # the ranks' own gloo timeout (timeout_s) fires first and records a timeout verdict
        silence_s=lambda timeout_s: 2 * timeout_s + 60,
        runner=Ref("ficco.sweep.runners:CpuRunner"),
        timing=TimingOptions(rounds=CPU_ROUNDS),
        timeout_s=TIMEOUT_S,
        # Triton's interpreter is wrong in bf16 (``check``)
        dtype="fp32",
        run_timed=False,
        profiles=False,
        check=check,
        check_world=check_world,
        # what every rank imports before its first job (torch alone is ~1.2 s of CPU)
        preload=("torch", "ficco.execute.cpu", "ficco.execute.cpu_group", "ficco.execute.measure"),
    )
)
