"""Executors: run a plan's tasks on CPU processes (gloo) or GPUs, verified, then timed.

One interpreter (``interpreter``) walks every plan; backends (``cpu``, ``cuda``) differ only
in their primitives (transports, GEMM kernels) and clocks. Modules:

``options``      TimingOptions, RunOptions (typed, frozen)
``interpreter``  the plan interpreter and the Primitives a backend provides
``backend``      what a backend provides to the measuring flow
``cpu``          gloo transports, torch/Triton GEMMs, host clock
``cuda``         copy engine over symmetric memory, NCCL, cuBLAS/Triton, CUDA events
``cuda_setup``   a CUDA rank's GPU, groups, streams, symmetric memory, nccl_ce probe
``cuda_signatures``  per-task spans and parts alone: the inefficiency signature
``measure``      verify, capture, baselines, time: one problem on one rank
``capture``      what stays out of CUDA graphs though its transport captures (NCCL
                 all-to-alls), and the note saying why
``timing``       the interleaved-rounds protocol (fixed or ``rounds="auto"``)
``baselines``    serial, async-TP, the isolated GEMM and collective
``reference``, ``verify``, ``buffers``   what the output must be; is it; the tensors
``pool``, ``rank``  the rank pool and its supervisor (a failed job is a typed
                 ``PoolFailure``); a rank process, set up by its backend's spec
                 (``ficco.backends``)
``run``          entry points: run_problem (``ScheduleResult`` per schedule, every backend),
                 measure_in (a pool the caller keeps), measure_here (under torchrun)

Importing this package loads no torch.
"""

from ficco.execute.options import RunOptions, TimingOptions
from ficco.verdict import Verdict


def __getattr__(name: str):
    # the entry points pull in the pool (subprocess machinery) only when used
    if name in ("ScheduleResult", "backend_pool", "measure_in", "run_problem"):
        from ficco.execute import run

        return getattr(run, name)
    raise AttributeError(f"module 'ficco.execute' has no attribute {name!r}")


__all__ = [
    "RunOptions",
    "ScheduleResult",
    "TimingOptions",
    "Verdict",
    "backend_pool",
    "measure_in",
    "run_problem",
]
