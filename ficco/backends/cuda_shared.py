"""``cuda_shared``: W ranks on fewer GPUs (``ficco.execute.cuda_shared``): the CUDA backend
for verification, with CUDA IPC for symmetric memory and gloo for NCCL. Its timings mean
nothing (the ranks' kernels take turns on one GPU): ``ficco run`` verifies only, and a
profile store refuses its records, so it has no sweep runner."""

from __future__ import annotations

from dataclasses import replace

from ficco.backends import BackendUnavailable, Refusal, register_backend
from ficco.backends.cuda import CUDA
from ficco.patterns.spec import Ref
from ficco.problem import Problem
from ficco.space import Schedule


def setup_rank(rank: int, world: int, init_file: str | None, timeout_s: float):
    from ficco.execute.cuda_shared import CudaSharedBackend, init_shared_rank

    return CudaSharedBackend(init_shared_rank(rank, world, init_file, timeout_s))


def check(problem: Problem, schedule: Schedule) -> Refusal:
    from ficco.execute.cuda_shared import shared_capability

    return CUDA.check(problem, schedule) or shared_capability(problem, schedule)


def refuse_sweep(*_args, **_kwargs):
    raise BackendUnavailable(
        "backend cuda_shared: ranks that share a GPU verify schedules, and their timings mean "
        "nothing, so a profile store refuses them; sweep with --backend cuda (one GPU per "
        "rank) or cpu, or run `ficco run --backend cuda_shared` to verify"
    )


CUDA_SHARED = register_backend(
    replace(
        CUDA,
        name="cuda_shared",
        summary="W ranks sharing the GPUs there are (one is enough); verifies only (its "
        "timings mean nothing).",
        setup_rank=setup_rank,
        gpus=lambda world: 1,
        runner=Ref(f"{__name__}:refuse_sweep"),
        run_timed=False,
        profiles=False,
        check=check,
        setup_here=None,
    )
)
