"""The fused GEMM's tile, per shape: chosen as the persistent GEMM chooses its own.

`fused_config` answers, in order: a configuration tuned for the fused kernel itself at this
shape (`tune_fused`, cached in the persistent GEMM's tuning file under its own key), else the
persistent GEMM's configuration for the whole problem (`tuning.config_for`: cached, tuned now,
or the heuristic under FICCO_GEMM_AUTOTUNE=0) without its split tail. Both draw on the one
space in `ficco.kernels.configs`. The pointer path (views tensor descriptors cannot take)
keeps its own two tiles: its loads stage through registers and need fewer of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

import torch
import triton.language as tl

from ficco.kernels.configs import (
    FALLBACK_CONFIG,
    GemmConfig,
    fused_candidate_configs,
    heuristic_config,
)
from ficco.kernels.persistent import INTERPRETER, device_info
from ficco.kernels.tuning import (
    TuningKey,
    cached_config,
    config_for,
    do_bench_timer,
    store,
)

Path = Literal["tma", "ptr"]

#: The pointer path's tiles on GPUs, largest first (its loads are staged through shared
#: memory by cp.async; 128x256 takes all 255 registers). A launch that runs out of
#: resources moves down this list, to ``FALLBACK_CONFIG`` last.
POINTER_CONFIGS = (
    GemmConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8),
    GemmConfig(128, 128, 64, group_m=8, num_stages=3, num_warps=8),
)

# Largest accepted ||out - ref|| / ||ref|| against torch.matmul (as tuning.tune checks).
_CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def tma_supported(device: torch.device) -> bool:
    """This Triton makes tensor descriptors inside kernels, and the device runs them."""
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    if INTERPRETER:
        return True
    return device.type == "cuda" and device_info(device).capability[0] >= 9


@dataclass(frozen=True)
class FusedTuningKey:
    """What a fused configuration is valid for: the persistent key plus the chunk count
    (tiles never straddle chunks, so the count changes the tiling)."""

    base: TuningKey
    chunks: int

    def __str__(self) -> str:
        return f"{self.base}|fused|chunks={self.chunks}"

    @classmethod
    def for_problem(
        cls,
        m: int,
        n: int,
        k: int,
        chunks: int,
        dtype: torch.dtype,
        sm_budget: int,
        device: torch.device,
    ) -> FusedTuningKey:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return cls(TuningKey.for_problem(m, n, k, dtype, sm_budget, device), int(chunks))


def pointer_config(rows: int) -> GemmConfig:
    """The pointer path's tile on GPUs (``rows``: the largest chunk's)."""
    if rows <= 64:
        return GemmConfig(64, 128, 64, group_m=8, num_stages=4, num_warps=4)
    return POINTER_CONFIGS[0]


def fused_config(
    m: int,
    n: int,
    k: int,
    chunks: int,
    dtype: torch.dtype,
    sm_budget: int,
    device: torch.device,
    path: Path,
) -> GemmConfig:
    """The tile for a fused launch of ``chunks`` row chunks, ``m`` rows in all (module
    docstring). Under the interpreter: the small tiles that keep CPU tests fast."""
    if device.type != "cuda":
        return heuristic_config(m, n, k, interpreter=True)
    if path == "ptr":
        return pointer_config(-(-m // chunks))
    hit = cached_config(FusedTuningKey.for_problem(m, n, k, chunks, dtype, sm_budget, device))
    if hit is not None:
        return hit
    return replace(config_for(m, n, k, dtype, sm_budget, device), split_tail=False)


def smaller_config(config: GemmConfig) -> GemmConfig | None:
    """The next pointer-path tile with less staged data than ``config``, or None."""

    def area(c: GemmConfig) -> int:
        return c.block_m * c.block_n * c.block_k * c.num_stages

    smaller = [c for c in (*POINTER_CONFIGS, FALLBACK_CONFIG) if area(c) < area(config)]
    return smaller[0] if smaller else None


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
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

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
