"""Which schedule one op call runs: a pure function of the call's shape, dtype, W and table.

Every rank of a group must take the same decision (a rank that runs another schedule posts
other messages, and the group deadlocks). The decision depends only on values every rank
shares once the ranks agree on the call's operands (``ficco.ops.agree``): the problem
(shapes, dtype, W), the explicit schedule string or the table, and the target (device kind,
hosts of the group). Nothing here reads a clock, a rank, a random state or a measurement, so
equal inputs give equal answers on every rank; ``FICCO_OPS_CHECK=1`` makes the ops verify it
with one all-gather of the decision's hash per call (``ficco.ops.runner``).

Order of precedence: an explicit ``schedule`` (refused with the rules it breaks if it is not
legal for the call's problem, or with the reason the group's backend cannot run it: an
explicit request is never silently replaced, and never fails later); else the table's answer (``ficco.recommend``: the shipped table, or the
file ``table``), which outside the table's training range is the measured safe default; where
the table's answer cannot run on this backend, ``serial/nccl/cublas`` with one warning per
distinct reason, since a silent fallback is indistinguishable from the feature working.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache

from ficco.backends import backend_spec
from ficco.defaults import DEFAULT_MACHINE
from ficco.problem import Problem
from ficco.space import Compute, Gemm, Schedule, violations
from ficco.space.transports import Communicator

#: the schedule a call falls back to where the pick cannot run: always legal, runs anywhere
SERIAL = Schedule()
#: set to 1 to check, on every call, that all ranks took the same decision (one all-gather)
CHECK_ENV = "FICCO_OPS_CHECK"


class FallbackWarning(UserWarning):
    """The table's schedule could not run here; the op ran serial instead."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The schedule one call runs, and why."""

    problem: Problem
    schedule: Schedule
    source: str
    """'explicit', 'table' or 'fallback'."""
    reason: str
    """One sentence: the table's reason, or why the table's pick could not run."""

    @property
    def digest(self) -> int:
        """A 63-bit hash of (problem, schedule): equal on every rank that decided alike."""
        text = f"{self.problem.key}|{self.schedule}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True, slots=True)
class Target:
    """Where a call runs, as far as a schedule's feasibility depends on it."""

    device: str
    """The tensors' device type: 'cpu' (a gloo group) or 'cuda'."""
    hosts: int = 1
    """Distinct hosts among the group's ranks (symmetric memory spans one host)."""
    shares_gpu: bool = False
    """CUDA tensors on a gloo group: ranks that share a GPU (``ficco.execute.cuda_shared``:
    CUDA IPC for symmetric memory, gloo for NCCL; for verification)."""

    @property
    def backend(self) -> str:
        """The registered backend (``ficco.backends``) whose primitives run the call."""
        if self.device == "cuda":
            return "cuda_shared" if self.shares_gpu else "cuda"
        return self.device


def needs_symmetric_memory(schedule: Schedule) -> bool:
    """Whether ``schedule`` on CUDA reads or writes peers' buffers directly: copy-engine
    transfers, the symmetric-memory all-reduces and fused flag kernels."""
    return schedule.transport.traits.symmetric_memory or schedule.compute is Compute.FUSED


def backend_limit(problem: Problem, schedule: Schedule, target: Target | str) -> str | None:
    """Why the caller's group (``target``; a device type string: one host) cannot run
    ``schedule`` inside an op call, or None: what the group lacks, else what its backend
    (``ficco.backends``) cannot run."""
    target = Target(target) if isinstance(target, str) else target
    if target.device not in ("cpu", "cuda"):
        return f"ficco.ops runs on cpu or cuda tensors, not on {target.device!r}"
    return _group_limit(schedule, target) or backend_spec(target.backend).check(problem, schedule)


def _group_limit(schedule: Schedule, target: Target) -> str | None:
    """What a caller's group lacks that ficco's own rank pools have."""
    if target.shares_gpu:
        return None  # the cuda_shared backend's own check says it all
    if target.device == "cuda":
        if schedule.transport.traits.communicator is Communicator.NCCL_ZERO_CTA:
            return (
                f"{schedule.transport.value} needs a zero-CTA NCCL communicator, which "
                "ficco.ops does not create"
            )
        if needs_symmetric_memory(schedule) and target.hosts > 1:
            return (
                f"{schedule} reads peers' buffers through symmetric memory, which spans the "
                f"GPUs of one host: this group's ranks are on {target.hosts} hosts"
            )
        if schedule.compute is Compute.FUSED and os.environ.get("CUDA_MODULE_LOADING") != "EAGER":
            # a kernel loaded lazily while a flag wait spins blocks the host (a deadlock
            # that only the flag timeout ends); the variable must be set before CUDA starts
            return "fused schedules need CUDA_MODULE_LOADING=EAGER in the environment"
        return None
    if schedule.compute is Compute.FUSED:
        # ficco's rank pools stand symmetric memory in with shared files; a caller's gloo
        # group has no such memory between its processes
        return (
            "fused schedules need symmetric memory between the ranks, which a caller's gloo "
            "group does not have"
        )
    if schedule.gemm is Gemm.TRITON and os.environ.get("TRITON_INTERPRET") != "1":
        return "a Triton GEMM on CPU needs TRITON_INTERPRET=1 set before Triton is imported"
    return None


def choose(
    problem: Problem, schedule: str = "", table: str = "", target: Target | str = "cpu"
) -> Choice:
    """The schedule ``problem`` runs on ``target`` (a ``Target``, or a device type: one
    host): ``schedule`` if not empty, else the table's answer (``table``: a table file, or
    empty for the shipped ``DEFAULT_MACHINE`` table)."""
    return _choose(problem, schedule, table, Target(target) if isinstance(target, str) else target)


@lru_cache(maxsize=4096)
def _choose(problem: Problem, schedule: str, table: str, target: Target) -> Choice:
    device = target.device
    if schedule:
        picked = Schedule.parse(schedule)
        broken = violations(problem, picked)
        if broken:
            raise ValueError(
                f"schedule: {schedule!r} is not legal for {problem.key}: {'; '.join(f'{name}: {why}' for name, why in broken)}"
            )
        limit = backend_limit(problem, picked, target)
        if limit:
            raise ValueError(f"schedule: {schedule!r} cannot run on {device} here: {limit}")
        return Choice(problem, picked, "explicit", "asked for explicitly")
    import ficco.api as api
    from ficco.validate import InputError

    try:
        answer = api.recommend(problem, DEFAULT_MACHINE, table or None)
    except InputError as err:
        if err.field != "pattern":  # a missing or corrupt table is the caller's to fix
            raise
        # no measured table covers this pattern (gemm_ar today): serial, said once
        reason = f"no table covers {problem.pattern} ({err})"
        warn_once(f"pattern:{problem.pattern}", f"ficco.ops: {reason}; running {SERIAL}")
        return Choice(problem, SERIAL, "fallback", reason)
    picked = Schedule.parse(answer.schedule)
    limit = backend_limit(problem, picked, target)
    if limit is None:
        return Choice(problem, picked, "table", answer.reason)
    reason = f"the table picked {picked} for {problem.key}, which cannot run here ({limit})"
    warn_once(limit, f"ficco.ops: {reason}; running {SERIAL} instead (warned once per reason)")
    return Choice(problem, SERIAL, "fallback", reason)


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Warn once per distinct ``key`` in this process (token counts change every step: one
    warning per shape would bury the log)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, FallbackWarning, stacklevel=3)


def check_enabled() -> bool:
    return os.environ.get(CHECK_ENV, "") not in ("", "0")
