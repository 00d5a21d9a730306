"""Synthetic profile stores for tests only: made-up timings from a toy cost model.

The fingerprint's backend is ``synthetic`` so such a store can never pass for a measured one.
"""

from __future__ import annotations

import math
import random
import zlib
from pathlib import Path

from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM, Measurement
from ficco.problem import Problem
from ficco.profile import ProfileStore
from ficco.space import Granularity, SpaceOptions, Transport, enumerate_schedules

SYNTHETIC_FINGERPRINT = {
    "backend": "synthetic",
    "gpu": "toy",
    "gpu_count": 8,
    "sm_count": 132,
    "driver": None,
    "cuda": None,
    "torch": "test",
    "triton": None,
    "nccl": None,
    "git_commit": "test",
}


def _noise(*parts: object) -> float:
    return random.Random(zlib.crc32(repr(parts).encode())).uniform(-0.02, 0.02)


def synthetic_measurements(problem: Problem, space: SpaceOptions | None = None):
    """Baselines and one measurement per legal schedule of ``problem`` (toy cost model)."""
    t_gemm = problem.flops / 600e9 + 0.02  # ms
    t_comm = problem.comm_bytes_per_rank() / 150e6 + 0.03
    p = problem.to_dict()
    yield Measurement(problem=p, name=BASELINE_GEMM, kind="baseline", median_ms=t_gemm, samples=9)
    yield Measurement(problem=p, name=BASELINE_COMM, kind="baseline", median_ms=t_comm, samples=9)
    for s in enumerate_schedules(problem, space):
        pieces = (problem.world - 1) * s.chunks
        gemm_alone = t_gemm * (1 + 0.015 * pieces * (s.gemm.value == "triton" and 0.5 or 1))
        comm_alone = t_comm * (1 + 0.02 * pieces)
        if s.granularity is Granularity.SERIAL:
            gemm_in, comm_in, exposed = gemm_alone, comm_alone, gemm_alone + comm_alone
        else:
            contention = 0.25 if s.transport is Transport.NCCL else 0.05
            gemm_in = gemm_alone * (1 + contention)
            comm_in = comm_alone * (1 + contention / 2)
            exposed = max(gemm_in, comm_in) + min(gemm_in, comm_in) / (pieces + 1)
        t = exposed * (1 + _noise(problem.key, str(s)))
        failed = s.transport is Transport.NCCL_CE and s.granularity is Granularity.FINER
        yield Measurement(
            problem=p,
            name=str(s),
            verdict="unavailable" if failed else "ok",
            median_ms=math.nan if failed else t,
            spread_ms=0.01 * t,
            samples=15,
            max_abs_err=1e-3,
            tolerance=1e-2,
            gemm_chunks_alone_ms=gemm_alone,
            comm_chunks_alone_ms=comm_alone,
            gemm_in_overlap_ms=gemm_in,
            comm_in_overlap_ms=comm_in,
            detail="nccl_ce is not available" if failed else "",
        )


def write_synthetic_store(
    path: str | Path, problems: list[Problem], space: SpaceOptions | None = None
) -> ProfileStore:
    """A profile store at ``path`` holding synthetic measurements of ``problems``."""
    store = ProfileStore.open(path, SYNTHETIC_FINGERPRINT)
    for problem in problems:
        for m in synthetic_measurements(problem, space):
            store.append(m)
    store.close()
    return store
