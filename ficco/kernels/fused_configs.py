"""The fused GEMM's tile, per shape: chosen as the persistent GEMM chooses its own.

`fused_config` answers, in order: a configuration tuned for the fused kernel itself at this
shape (`fused_tuning.tune_fused`, cached in the persistent GEMM's tuning file under its own key,
or shipped in the package's copy of that file: `tuning.known_config`; for a launch whose
chunks land while it runs, the entry tuned for that case first: `fused_arrival`), else the
persistent GEMM's configuration for the whole problem (`tuning.config_for`: cached, tuned now,
or the heuristic under FICCO_GEMM_AUTOTUNE=0) without its split tail (the heuristic where that
is the split-K decode kernel's). Both draw on the one
space in `ficco.kernels.configs`. The pointer path (views tensor descriptors cannot take)
keeps its own two tiles: its loads stage through registers and need fewer of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton.language as tl

from ficco.kernels.configs import (
    FALLBACK_CONFIG,
    GemmConfig,
    heuristic_config,
)
from ficco.kernels.persistent import INTERPRETER, TensorDescriptor, device_info
from ficco.kernels.tuning import (
    CACHE_FILENAME,
    TuningKey,
    cached_config,
    config_for,
    known_config,
    shipped_entries,
)

Path = Literal["tma", "ptr"]

#: The pointer path's tiles on GPUs, largest first (its loads are staged through shared
#: memory by cp.async; 128x256 takes all 255 registers). A launch that runs out of
#: resources moves down this list, to ``FALLBACK_CONFIG`` last.
POINTER_CONFIGS = (
    GemmConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8),
    GemmConfig(128, 128, 64, group_m=8, num_stages=3, num_warps=8),
)


def tma_supported(device: torch.device) -> bool:
    """This Triton builds tensor descriptors (host and in-kernel), and the device runs them."""
    if TensorDescriptor is None or not hasattr(tl, "make_tensor_descriptor"):
        return False
    if INTERPRETER:
        return True
    return device.type == "cuda" and device_info(device).capability[0] >= 9


@dataclass(frozen=True)
class FusedTuningKey:
    """What a fused configuration is valid for: the persistent key plus the chunk count
    (tiles never straddle chunks, so the count changes the tiling), and whether chunks land
    during the launch (``arriving``: `fused_arrival.arrival_pick`'s entry) or are all ready
    (`tune_fused`'s fastest)."""

    base: TuningKey
    chunks: int
    arriving: bool = False

    def __str__(self) -> str:
        tail = "|arriving" if self.arriving else ""
        return f"{self.base}|fused|chunks={self.chunks}{tail}"

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
        arriving: bool = False,
    ) -> FusedTuningKey:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        base = TuningKey.for_problem(m, n, k, dtype, sm_budget, device)
        return cls(base, int(chunks), bool(arriving))


def pointer_config(rows: int) -> GemmConfig:
    """The pointer path's tile on GPUs (``rows``: the largest chunk's)."""
    if rows <= 64:
        return GemmConfig(64, 128, 64, group_m=8, num_stages=4, num_warps=4)
    return POINTER_CONFIGS[0]


def untuned_fused_config(
    m: int, n: int, k: int, chunks: int, device: torch.device, path: Path
) -> GemmConfig | None:
    """The fused tile no tuning picks (every dtype's: FP8 too): under the interpreter the
    small tile that keeps CPU tests fast, on the pointer path its own (``pointer_config`` of
    the largest chunk's rows); None on the TMA path, whose tile is chosen per shape."""
    if device.type != "cuda":
        return heuristic_config(m, n, k, interpreter=True)
    if path == "ptr":
        return pointer_config(-(-m // chunks))
    return None


def fused_config(
    m: int,
    n: int,
    k: int,
    chunks: int,
    dtype: torch.dtype,
    sm_budget: int,
    device: torch.device,
    path: Path,
    arriving: bool = False,
) -> GemmConfig:
    """The tile for a fused launch of ``chunks`` row chunks, ``m`` rows in all (module
    docstring); where chunks land during the launch (``arriving``), the tuned entry for that
    case first."""
    untuned = untuned_fused_config(m, n, k, chunks, device, path)
    if untuned is not None:
        return untuned
    key = FusedTuningKey.for_problem(m, n, k, chunks, dtype, sm_budget, device)
    if arriving:
        # the user's own entries before the shipped ones, each the arriving twin first: a
        # shape the user tuned keeps the user's tile, whichever ficco wrote the entry
        late = replace(key, arriving=True)
        shipped = shipped_entries(CACHE_FILENAME)
        for hit in (cached_config(late), cached_config(key), shipped.get(str(late))):
            if hit is not None:
                return hit
    hit = known_config(key)
    if hit is not None:
        return hit
    chosen = config_for(m, n, k, dtype, sm_budget, device)
    if chosen.decode or chosen.swap_ab:  # the decode kernels' tiles are no fused tiles
        return heuristic_config(m, n, k)
    return replace(chosen, split_tail=False)


def smaller_config(config: GemmConfig) -> GemmConfig | None:
    """The next pointer-path tile with less staged data than ``config``, or None."""

    def area(c: GemmConfig) -> int:
        return c.block_m * c.block_n * c.block_k * c.num_stages

    smaller = [c for c in (*POINTER_CONFIGS, FALLBACK_CONFIG) if area(c) < area(config)]
    return smaller[0] if smaller else None
