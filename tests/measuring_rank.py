"""A rank of a CPU rank pool that answers measuring jobs with a test's own backend: the loop
the tests that drive ``measure_problem`` through a custom backend share, and the capturing
CPU backend they build theirs on."""

import functools

from ficco.execute.baselines import BASELINE_SERIAL_EAGER
from ficco.execute.cpu import CpuBackend
from ficco.execute.interpreter import interpret
from ficco.plan import build_plan
from ficco.space import Schedule


class Replay:
    """A stand-in CUDA graph: its replay calls what was captured."""

    def __init__(self, fn):
        self.replay = fn


class CapturingCpuBackend(CpuBackend):
    """A CPU backend that captures as the CUDA backend does (a "graph" replays the call;
    subclasses say which schedules want one) and, like it, has the serial plan run eagerly
    as its serial baseline."""

    can_capture = True

    def capture(self, fn):
        return Replay(fn)

    def baselines(self, problem, bufs):
        out = super().baselines(problem, bufs)
        plan = build_plan(problem, Schedule(), self.rank)
        serial = functools.partial(interpret, self.primitives(plan, bufs, 0))
        serial.out = bufs.tensors[plan.output]
        return {**out, BASELINE_SERIAL_EAGER: serial}


def serve_measure_jobs(backend, conn) -> None:
    """Answer each (tag, job) from ``conn`` with ``measure_problem`` on ``backend`` (rank 0
    sends the result) until the pool sends None, then close the backend."""
    from ficco.execute.measure import measure_problem

    while (message := conn.recv()) is not None:
        tag, job = message
        out = measure_problem(backend, job.problem, job.schedules, 0, job.timing, lambda m: None)
        if backend.rank == 0:
            conn.send(("done", tag, out))
    backend.close()
