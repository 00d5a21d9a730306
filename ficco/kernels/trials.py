"""Check, then time: the one loop every kernel tuner runs over its candidates.

`check_then_time` builds each candidate, runs it once on a NaN-poisoned output (every element
must be written), compares that output with a reference (`relative_error`, at most
`CHECK_TOLERANCE[dtype]`), and only then times it: one at a time with a per-launch `Timer`, or
all the correct ones together in interleaved rounds with a `RoundsTimer`
(`ficco.execute.timing.LaunchTimer`: host launch cost kept out of the events). A candidate that does not compile, runs out
of resources, is not the candidate it claims to be (`Rejected`) or computes a wrong result is
recorded with its reason and never timed, so it can never be chosen. `tuning_record` turns the
result into the tuning cache's entry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import torch
import triton

from ficco.kernels.configs import GemmConfig

# Largest accepted ||out - ref|| / ||ref|| against torch.matmul in the same dtype: two
# roundings of the output plus accumulation-order differences.
CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}

Timer = Callable[[Callable[[], object]], float]

# A RoundsTimer's interleaved rounds: at least MIN, at most MAX, about ROUNDS_GPU_MS of
# kernel time in all (a first round estimates each candidate's time).
MIN_ROUNDS = 5
MAX_ROUNDS = 25
ROUNDS_GPU_MS = 150.0


class RoundsTimer(Protocol):
    """Times several launches together in interleaved rounds (`LaunchTimer`)."""

    def medians(self, fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
        """Per name its median launch time (ms) over ``rounds`` rounds."""


def rounds_for(estimates_ms: Iterable[float]) -> int:
    """Rounds that take about ROUNDS_GPU_MS of kernel time, given one launch's time per
    candidate; within [MIN_ROUNDS, MAX_ROUNDS]."""
    per_round = max(sum(estimates_ms), 1e-3)
    return int(min(MAX_ROUNDS, max(MIN_ROUNDS, ROUNDS_GPU_MS / per_round)))


class Rejected(Exception):
    """A candidate that ran as something else (a smaller tile stood in, say): its timing
    would not be this candidate's."""


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius, in fp32)."""
    diff = torch.linalg.vector_norm((out.float() - ref.float()).flatten())
    return float(diff / torch.linalg.vector_norm(ref.float().flatten()).clamp_min(1e-30))


@dataclass(frozen=True)
class Trials:
    """What `check_then_time` found: per candidate name, its time or why it was left out."""

    timings_ms: dict[str, float]
    failures: dict[str, str]
    configs: dict[str, GemmConfig]

    def best(self) -> str:
        """The fastest correct candidate's name."""
        return min(self.timings_ms, key=self.timings_ms.__getitem__)


def check_then_time(
    configs: Iterable[GemmConfig],
    build: Callable[[GemmConfig], Callable[[], object]],
    out: torch.Tensor,
    ref: torch.Tensor,
    timer: Timer | RoundsTimer,
    synchronize: Callable[[], None],
) -> Trials:
    """Each of ``configs``: ``build(cfg)`` gives the launch (it may raise `Rejected`), which
    must write every element of ``out`` within ``CHECK_TOLERANCE`` of ``ref`` before
    ``timer`` times it (a `RoundsTimer` times every correct one after all are checked)."""
    tolerance = CHECK_TOLERANCE[out.dtype]
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    by_name: dict[str, GemmConfig] = {}
    runs: dict[str, Callable[[], object]] = {}
    for cfg in configs:
        out.fill_(float("nan"))  # every element must be written
        try:
            run = build(cfg)
            run()
            synchronize()
        except triton.runtime.errors.OutOfResources as exc:
            failures[cfg.name] = f"resources: {exc}"[:200]
            continue
        except Rejected as exc:
            failures[cfg.name] = str(exc)[:200]
            continue
        except Exception as exc:  # compile errors surface as several exception types
            failures[cfg.name] = f"compile: {type(exc).__name__}: {exc}"[:200]
            continue
        err = relative_error(out, ref)
        if not err <= tolerance:  # NaN fails too
            failures[cfg.name] = f"incorrect: relative error {err:.3g}"
            continue
        by_name[cfg.name] = cfg
        if callable(timer):
            timings[cfg.name] = float(timer(run))
        else:
            runs[cfg.name] = run
    if runs:
        estimate = timer.medians(runs, 1)
        got = timer.medians(runs, rounds_for(estimate.values()))
        timings.update({name: float(got[name]) for name in runs})
    return Trials(timings, failures, by_name)


def tflops(m: int, n: int, k: int, ms: float) -> float:
    """An [m, k] @ [k, n] GEMM's rate in TFLOP/s at ``ms`` milliseconds (NaN where ms <= 0)."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12 if ms > 0 else math.nan


def tuning_record(
    trials: Trials, m: int, n: int, k: int, path: str, started: float, best: str | None = None
) -> dict:
    """The tuning cache's entry for ``best`` of ``trials`` (default: the fastest;
    ``started``: a perf_counter)."""
    best = trials.best() if best is None else best
    best_ms = trials.timings_ms[best]
    return {
        "config": trials.configs[best].to_dict(),
        "name": best,
        "ms": best_ms,
        "tflops": tflops(m, n, k, best_ms),
        "path": path,
        "timings_ms": trials.timings_ms,
        "failures": trials.failures,
        "tune_s": round(time.perf_counter() - started, 3),
        "tuned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
