"""The FP8 GEMM's tuning space: its own candidates, pruned by the bf16 space's rules.

FP8 operands are one byte, so at the same shared memory a K step holds twice the elements of
a bf16 one: Hopper's FP8 wgmma reads K in steps of 32 and Triton's FP8 tutorials settle on
BLOCK_K = 128 with 128x256 tiles, 3-4 stages, 8 warps (the epilogue split in two halves
frees 32 KiB for a 4th stage). The space keeps those, square 128x128 tiles for mid-sized
shapes, and 64-row tiles for chunks whose M or tile count is small. Pruning is the bf16
space's (`ficco.kernels.configs`: `suits_shape`, `fits_shared_memory` at 1-byte inputs).

Plain Python: nothing here imports Triton or touches CUDA.
"""

from __future__ import annotations

from ficco.kernels.configs import (
    HOPPER_SHARED_MEMORY_BYTES,
    GemmConfig,
    fits_shared_memory,
    suits_shape,
)

FP8_BYTES = 1


def _c(bm, bn, bk, stages, warps, group=8, sub=False, per_sm=1, pe=1, lag=False) -> GemmConfig:
    return GemmConfig(
        bm,
        bn,
        bk,
        group,
        stages,
        warps,
        sub,
        programs_per_sm=per_sm,
        promote_every=pe,
        lagged_promotion=lag,
    )


#: Shared memory an SM holds for its blocks (228 KiB on sm_90), and what each block reserves.
SM_SHARED_MEMORY_BYTES = 233_472
BLOCK_RESERVED_BYTES = 1_024


#: The smallest GPU tile: what a shape no tile suits gets.
FP8_SMALLEST = _c(64, 64, 256, 4, 4)

#: The GPU space for FP8 (Hopper), big tiles first.
FP8_GPU_CONFIGS: tuple[GemmConfig, ...] = (
    _c(128, 256, 128, 3, 8, sub=True),  # Triton's FP8 persistent tutorial
    _c(128, 256, 128, 4, 8, sub=True),
    _c(256, 128, 128, 3, 8, sub=True),
    _c(256, 128, 128, 4, 8, sub=True),
    _c(128, 128, 128, 4, 8),
    _c(128, 128, 128, 5, 4, sub=True),
    _c(128, 128, 256, 3, 8),
    _c(64, 256, 128, 4, 4, sub=True),
    _c(64, 128, 128, 5, 4),
    _c(128, 64, 128, 5, 4),
    FP8_SMALLEST,
    # Two programs per SM (one warpgroup each, <= 113 KiB of shared memory, <= 255 registers):
    # with fp32 promotion after every K step (the default, as _scaled_mm's), a program's
    # wgmma must finish before its adds; the SM's other program keeps the tensor cores busy.
    _c(128, 128, 128, 3, 4, sub=True, per_sm=2),
    _c(64, 128, 128, 4, 4, per_sm=2),
    _c(128, 64, 128, 4, 4, per_sm=2),
    # One H100 (profiles/h100/fp8_gemm.json, in the tree at 97d577c) took the first of these at 39 of 56 shapes:
    # its grouping varied, and K steps of 256 (two promotions a step, two stages).
    _c(128, 128, 128, 3, 4, group=4, sub=True, per_sm=2),
    _c(128, 128, 128, 3, 4, group=16, sub=True, per_sm=2),
    _c(64, 128, 256, 2, 4, per_sm=2),
    _c(128, 64, 256, 2, 4, per_sm=2),
    # The fp32 adds one K step late, overlapping the next step's wgmma (lagged_promotion):
    # three fp32 tiles live (the sum, two steps' products), so 64 registers a tile at most;
    # K steps in pairs, so a stage holds two steps.
    # On one H200 they ran at 0.74-0.75 of _scaled_mm (tuning geomean over 56 shapes) against
    # 0.85 for the two-per-SM 128x128 tiles; with two stages, or two per SM in K steps of 64,
    # at 0.50-0.58 (profiles/h200/fp8_gemm_notes.md).
    _c(128, 128, 128, 3, 8, sub=True, lag=True),
    _c(128, 128, 128, 3, 8, group=16, sub=True, lag=True),
    # fp32 promotion every 2 or 4 K steps (256 or 512 products: coarser than cuBLASLt's
    # default), offered only where asked for (`promote_every`): on one H100 it ran at 0.81x
    # the same tile promoting every step (profiles/h100/fp8_gemm_notes.md).
    _c(128, 128, 128, 4, 8, pe=4),
)

#: The CPU interpreter's: small blocks keep tests fast (and leave ragged tiles on small
#: shapes); FP8 dots need K steps of at least 32.
FP8_INTERPRETER_CONFIGS: tuple[GemmConfig, ...] = (
    _c(32, 32, 32, 1, 4, group=4),
    _c(32, 64, 32, 1, 4, group=4, sub=True),
)


def fits_sm(cfg: GemmConfig, out_bytes: int, shared_memory_bytes: int) -> bool:
    """The config's tiles fit a block's shared memory, and `programs_per_sm` blocks fit an
    SM's."""
    per_block = min(
        shared_memory_bytes,
        SM_SHARED_MEMORY_BYTES // cfg.programs_per_sm - BLOCK_RESERVED_BYTES,
    )
    return fits_shared_memory(cfg, FP8_BYTES, out_bytes, per_block)


def scaled_candidate_configs(
    m: int,
    n: int,
    k: int,
    out_bytes: int = 2,
    *,
    interpreter: bool = False,
    shared_memory_bytes: int = HOPPER_SHARED_MEMORY_BYTES,
    full_budget: bool = True,
    promote_every: int = 1,
) -> list[GemmConfig]:
    """The FP8 configurations worth timing for `[m, k] @ [k, n]`, in the space's order (never
    empty: the smallest tile where nothing suits the shape). ``full_budget``: the launch may
    use every SM (else configs with two programs per SM are left out: they would launch one).
    ``promote_every``: the most K steps per fp32 promotion a config may take (1: every step,
    the accumulation cuBLASLt's default has)."""
    space = FP8_INTERPRETER_CONFIGS if interpreter else FP8_GPU_CONFIGS
    kept = [
        cfg
        for cfg in space
        if suits_shape(cfg, m, n, k)
        and (full_budget or cfg.programs_per_sm == 1)
        and cfg.promote_every <= promote_every
        and (interpreter or fits_sm(cfg, out_bytes, shared_memory_bytes))
    ]
    return kept or [FP8_INTERPRETER_CONFIGS[-1] if interpreter else FP8_SMALLEST]


def scaled_heuristic_config(m: int, n: int, *, interpreter: bool = False) -> GemmConfig:
    """An untuned default: the tutorial's tile for large problems, smaller ones for small M."""
    if interpreter:
        return FP8_INTERPRETER_CONFIGS[0]
    if m <= 256:
        return _c(64, 128, 128, 5, 4)
    if m * n <= 2048 * 4096:
        return _c(128, 128, 128, 4, 8)
    return FP8_GPU_CONFIGS[0]
