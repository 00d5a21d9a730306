"""Check, then time: the one loop every kernel tuner runs over its candidates.

`check_then_time` builds each candidate, runs it once on a NaN-poisoned output (every element
must be written), compares that output with a reference (`relative_error`, at most
`CHECK_TOLERANCE[dtype]`), and only then times it. A candidate that does not compile, runs out
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

import torch
import triton

from ficco.kernels.configs import GemmConfig

# Largest accepted ||out - ref|| / ||ref|| against torch.matmul in the same dtype: two
# roundings of the output plus accumulation-order differences.
CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}

Timer = Callable[[Callable[[], object]], float]


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
    timer: Timer,
    synchronize: Callable[[], None],
) -> Trials:
    """Each of ``configs``: ``build(cfg)`` gives the launch (it may raise `Rejected`), which
    must write every element of ``out`` within ``CHECK_TOLERANCE`` of ``ref`` before
    ``timer`` times it."""
    tolerance = CHECK_TOLERANCE[out.dtype]
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    by_name: dict[str, GemmConfig] = {}
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
        timings[cfg.name] = float(timer(run))
        by_name[cfg.name] = cfg
    return Trials(timings, failures, by_name)


def tuning_record(trials: Trials, m: int, n: int, k: int, path: str, started: float) -> dict:
    """The tuning cache's entry for the best of ``trials`` (``started``: a perf_counter)."""
    best = trials.best()
    best_ms = trials.timings_ms[best]
    return {
        "config": trials.configs[best].to_dict(),
        "name": best,
        "ms": best_ms,
        "tflops": 2.0 * m * n * k / (best_ms * 1e-3) / 1e12 if best_ms > 0 else math.nan,
        "path": path,
        "timings_ms": trials.timings_ms,
        "failures": trials.failures,
        "tune_s": round(time.perf_counter() - started, 3),
        "tuned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
