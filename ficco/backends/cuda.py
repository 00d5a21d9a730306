"""``cuda``: one process per GPU (``ficco.execute.cuda_backend``): copy engine over symmetric memory,
NCCL, cuBLAS and Triton GEMMs, CUDA events; verified, then timed beside the baselines."""

from __future__ import annotations

from ficco.backends import BackendSpec, Refusal, register_backend
from ficco.execute.options import TimingOptions
from ficco.patterns.spec import Ref
from ficco.problem import Problem
from ficco.space import Schedule

#: Untimed runs of each candidate before the rounds (its kernels are tuned and, where
#: graphed, captured before any of them).
CUDA_WARMUP = 2
#: Seconds a GPU problem may go without progress (set-up, tuning, verification, every
#: schedule's rounds) before its ranks are killed.
CUDA_PROBLEM_TIMEOUT_S = 300.0


def setup_rank(rank: int, world: int, init_file: str | None, timeout_s: float):
    from ficco.execute.cuda_backend import CudaBackend
    from ficco.execute.cuda_setup import init_rank

    return CudaBackend(init_rank(rank, world, init_file, timeout_s))


def setup_here(rank: int, local_rank: int, world: int, timeout_s: float):
    from ficco.execute.cuda_backend import CudaBackend
    from ficco.execute.cuda_setup import init_rank

    # the rendezvous comes from the environment torchrun sets
    return CudaBackend(init_rank(rank, world, None, timeout_s, local_rank=local_rank))


def check(problem: Problem, schedule: Schedule) -> Refusal:
    # what this machine lacks (nccl_ce, symmetric-memory signals, an FP8-capable GPU) is
    # found by the ranks at set-up or by the primitives, and recorded unavailable there
    if not problem.scaled:
        return None
    from ficco.kernels.scaled_mm import self_product_refusal

    return self_product_refusal(problem.dtype)


CUDA = register_backend(
    BackendSpec(
        name="cuda",
        summary="W GPUs (spawned, or one rank per process under torchrun); verifies every "
        "schedule, then times it beside the baselines.",
        device="cuda",
        setup_rank=setup_rank,
        gpus=lambda world: world,
        silence_s=lambda timeout_s: timeout_s,
        runner=Ref("ficco.sweep.runners:CudaRunner"),
        # a sweep's records carry signatures; ``ficco.run`` turns them off
        timing=TimingOptions(warmup=CUDA_WARMUP, signatures=True),
        timeout_s=CUDA_PROBLEM_TIMEOUT_S,
        dtype="bf16",
        run_timed=True,
        profiles=True,
        check=check,
        setup_here=setup_here,
    )
)
