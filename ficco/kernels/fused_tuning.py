"""Tuning the fused GEMM's tile for one shape: `tune_fused`.

The candidates are the persistent GEMM's space (`configs.fused_candidate_configs`), each
checked against `torch.matmul` before it is timed (do_bench median, every flag ready), and the
winner is cached in the persistent GEMM's tuning file under a `FusedTuningKey`, where
`fused_configs.fused_config` finds it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import torch

from ficco.kernels.configs import GemmConfig, fused_candidate_configs
from ficco.kernels.fused import FusedChunkViews, FusedGemm
from ficco.kernels.fused_configs import FusedTuningKey
from ficco.kernels.persistent import device_info
from ficco.kernels.tuning import cached_config, do_bench_timer, store

# Largest accepted ||out - ref|| / ||ref|| against torch.matmul (as tuning.tune checks).
_CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = torch.linalg.vector_norm((out.float() - ref.float()).flatten())
    return float(diff / torch.linalg.vector_norm(ref.float().flatten()).clamp_min(1e-30))


def tune_fused(
    m: int,
    n: int,
    k: int,
    chunks: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    sm_budget: int | None = None,
    device: torch.device | str = "cuda",
    *,
    configs: Sequence[GemmConfig] | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
    read_cache: bool = True,
    write_cache: bool = True,
) -> tuple[GemmConfig, dict]:
    """The fastest correct tile for the fused kernel (TMA path, every flag ready) over
    ``chunks`` equal row chunks of an ``[m, k] @ [k, n]`` GEMM, and the tuning record.

    Times ``configs`` (default: ``fused_candidate_configs`` for the chunk's rows) with
    ``timer`` (default: do_bench median), each checked against ``torch.matmul`` first, and
    stores the winner in the tuning cache under a ``FusedTuningKey`` (``write_cache``).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: tuning times GPU launches, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if min(m, n, k, chunks) < 1 or m < chunks:
        raise ValueError(
            f"m, n, k, chunks must be positive with m >= chunks, got {(m, n, k, chunks)}"
        )
    budget = device_info(device).sm_count if sm_budget is None else int(sm_budget)
    key = FusedTuningKey.for_problem(m, n, k, chunks, dtype, budget, device)
    if read_cache and (hit := cached_config(key)) is not None:
        return hit, {"cached": True, "name": hit.name}
    elem = torch.empty((), dtype=dtype).element_size()
    if configs is None:
        configs = fused_candidate_configs(
            -(-m // chunks),
            n,
            k,
            elem,
            elem,
            shared_memory_bytes=device_info(device).shared_memory_bytes,
        )
    timer = timer or do_bench_timer
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1_009 + k)
    a = torch.randn((m, k), device=device, generator=gen).to(dtype)
    b = torch.randn((k, n), device=device, generator=gen).to(dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    ref = torch.matmul(a, b)
    views = [
        FusedChunkViews(ai, oi)
        for ai, oi in zip(a.tensor_split(chunks), out.tensor_split(chunks), strict=True)
    ]
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    by_name: dict[str, GemmConfig] = {}
    for cfg in configs:
        try:
            fused = FusedGemm(views, b, sm_budget=budget, timeout_s=10.0, config=cfg, path="tma")
            out.fill_(float("nan"))  # every element must be written
            fused()
            torch.cuda.synchronize(device)
        except Exception as exc:  # compile and resource errors surface as several types
            failures[cfg.name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if fused.config != cfg:  # a smaller tile stood in: not this candidate's figure
            failures[cfg.name] = f"ran as {fused.config.name} (out of resources)"
            continue
        err = _relative_error(out, ref)
        if not err <= _CHECK_TOLERANCE[dtype]:  # NaN fails too
            failures[cfg.name] = f"incorrect: relative error {err:.3g}"
            continue
        timings[cfg.name] = float(timer(fused))
        by_name[cfg.name] = cfg
    if not timings:
        raise RuntimeError(f"no fused GEMM configuration ran correctly for {key}: {failures}")
    best_name = min(timings, key=timings.__getitem__)
    best_ms = timings[best_name]
    entry = {
        "config": by_name[best_name].to_dict(),
        "name": best_name,
        "ms": best_ms,
        "tflops": 2.0 * m * n * k / (best_ms * 1e-3) / 1e12 if best_ms > 0 else math.nan,
        "path": "tma",
        "timings_ms": timings,
        "failures": failures,
        "tune_s": round(time.perf_counter() - start, 3),
        "tuned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if write_cache:
        store(key, entry)
    return by_name[best_name], entry
