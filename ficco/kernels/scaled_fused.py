"""The fused GEMM's FP8 operands (``ficco.kernels.fused.FusedGemm``): each chunk's A scales
and B's, checked as ``ficco.kernels.scaled`` checks its own, and the fused launch's tile."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ficco.kernels.configs import CHUNK_GROUP_MAX_ROWS, MAX_CHUNK_GROUP, GemmConfig
from ficco.kernels.flags import _offset
from ficco.kernels.fused_configs import untuned_fused_config
from ficco.kernels.scaled import scaled_config_for
from ficco.kernels.scaled_kernel import FP8_DTYPES
from ficco.kernels.scaled_mm import check_operands


@dataclass(frozen=True)
class FusedScales:
    """Scales of a fused FP8 launch: every chunk's A scales addressed from one private fp32
    reference (``a_ref`` + ``a_offsets[i]``), B's flattened."""

    a_ref: torch.Tensor
    a_offsets: tuple[int, ...]
    b_scale: torch.Tensor
    rowwise: bool
    colwise: bool
    fast_accum: bool


def fused_scales(chunks, b, b_scale, fast_accum: bool) -> FusedScales | None:
    """The scales of a fused launch over ``chunks`` (``FusedChunkViews``) and ``b``: None
    for plain dtypes (which take no scales); for fp8, every chunk's ``a_scale`` checked as
    ``scaled_matmul`` checks its own (one, or ``[rows, 1]`` at unit row stride), all of one
    granularity, with ``b_scale``."""
    a_scales = [c.a_scale for c in chunks]
    if b.dtype not in FP8_DTYPES:
        if b_scale is not None or any(s is not None for s in a_scales):
            raise ValueError(f"fused GEMM: scales are for fp8 operands; b is {b.dtype}")
        return None
    if b_scale is None or any(s is None for s in a_scales):
        raise ValueError("fused GEMM: fp8 operands need b_scale and every chunk's a_scale")
    # shapes only: a chunk's scales may still be on their way (they land with its rows)
    checked = [(c.a.shape[0], check_operands(c.a, b, c.a_scale, b_scale, False)) for c in chunks]
    colwise = checked[0][1][1]
    # a chunk of one row has one scale either way: it takes the others' granularity
    granularity = {per_row for rows, (per_row, _) in checked if rows > 1}
    if len(granularity) > 1:
        raise ValueError("fused GEMM: every chunk's a_scale must be of one granularity")
    rowwise = granularity.pop() if granularity else False
    if rowwise and any(s.shape[0] > 1 and s.stride(0) != 1 for s in a_scales):
        raise ValueError("fused GEMM: per-row a_scale views must have unit row stride")
    a_ref = torch.empty(1, dtype=torch.float32, device=b.device)
    offsets = tuple(_offset(s, a_ref) for s in a_scales)
    b_flat = b_scale.reshape(-1).contiguous()
    return FusedScales(a_ref, offsets, b_flat, rowwise, colwise, fast_accum)


def fused_scaled_config(
    m: int,
    n: int,
    k: int,
    chunks: int,
    dtype: torch.dtype,
    sm_budget: int,
    device: torch.device,
    path: str,
) -> GemmConfig:
    """The tile of a fused FP8 launch of ``chunks`` chunks, ``m`` rows in all: the persistent
    FP8 GEMM's for one chunk's rows (its tiles never straddle chunks: a tile taller than a
    chunk computes padding; on one H100 the whole problem's 256-row tile on 128-row chunks ran
    at 0.40x ``_scaled_mm``), every chunk in one group where chunks are few-row; the
    interpreter's and the pointer path's tiles as every dtype's
    (``fused_configs.untuned_fused_config``)."""
    untuned = untuned_fused_config(m, n, k, chunks, device, path)
    if untuned is not None:
        return untuned
    rows = -(-m // chunks)
    config = unlagged(scaled_config_for(rows, n, k, dtype, sm_budget, device))
    if 1 < chunks <= MAX_CHUNK_GROUP and rows <= CHUNK_GROUP_MAX_ROWS:
        # few-row chunks read B once per launch, not per chunk (GemmConfig.chunk_group): on
        # one H100, two chunks of 128 or 256 rows ran 0.97-1.29x as fast so, 14 of 16 shapes
        # faster (profiles/h100/fp8_gemm_notes.md)
        config = replace(config, chunk_group=chunks)
    return config


def unlagged(config: GemmConfig) -> GemmConfig:
    """``config`` for the fused kernel, whose K loop promotes each step in place: a lagged
    configuration's stages (each a pair of K steps, ``GemmConfig.lagged_promotion``) become
    twice as many stages of one step, the same shared memory."""
    if not config.lagged_promotion:
        return config
    return replace(config, lagged_promotion=False, num_stages=2 * config.num_stages)
