"""The persistent FP8 GEMM's Triton kernel and its launch; ``ficco.kernels.scaled`` is the
entry point that chooses its configuration (its docstring describes the operands, the
accumulation and the refusals).

Here: the kernel and its scale epilogue (``_scale_tile``, shared with the fused kernel),
the promotion rules (``PROMOTION_K``, :func:`imprecise_acc`, :func:`split_rows`,
:func:`lagged`), the programs a launch runs (:func:`programs`), the refusal of devices and
Tritons the kernel cannot use (:func:`kernel_refusal`), the operands made ready for it
(:func:`prepare_operands`, :class:`ScaledOperands`) and the launch (:func:`launch_scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ficco.kernels.configs import GemmConfig
from ficco.kernels.persistent import (
    INTERPRETER,
    LAST_COMPILED,
    LAUNCH_COUNTS,
    TensorDescriptor,
    _store_c_tile,
    _tma_operand,
    device_info,
    fit_shared_memory,
)
from ficco.kernels.scaled_configs import FP8_BYTES
from ficco.kernels.scaled_mm import check_operands
from ficco.kernels.tiles import _program_grid, _tile_coords
from ficco.verdict import Unavailable

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _scale_tile(
    acc,
    a_scale_ptr,
    b_scale_ptr,
    offs_m,
    offs_n,
    rows,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    A_ROWWISE: tl.constexpr,
    B_COLWISE: tl.constexpr,
):
    # acc [BLOCK_M, BLOCK_N] fp32 of C[offs_m:, offs_n:] times its rows' and columns' scales:
    # a_scale [rows] (A_ROWWISE) or [1]; b_scale [N] (B_COLWISE) or [1].
    if A_ROWWISE:
        r = offs_m + tl.arange(0, BLOCK_M)
        acc = acc * tl.load(a_scale_ptr + r, mask=r < rows, other=0.0)[:, None]
    else:
        acc = acc * tl.load(a_scale_ptr)
    if B_COLWISE:
        c = offs_n + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(b_scale_ptr + c, mask=c < N, other=0.0)[None, :]
    else:
        acc = acc * tl.load(b_scale_ptr)
    return acc


# M, N, K are loop bounds and descriptor-clipped offsets: one compiled kernel per config and
# scale granularity serves every shape (a pool of processes can compile them ahead).
@triton.jit(do_not_specialize=["M", "N", "K"])
def _scaled_mm_tma_kernel(
    a_desc,  # A [M, K] fp8, blocks [BLOCK_M, BLOCK_K]
    b_desc,  # B^T [N, K] fp8, blocks [BLOCK_N, BLOCK_K] (B_K_MAJOR); else B [K, N] row-major
    c_desc,  # C [M, N] (any row stride), blocks [BLOCK_M, BLOCK_N or BLOCK_N / 2]
    a_scale_ptr,  # fp32 [M] (A_ROWWISE) or [1]
    b_scale_ptr,  # fp32 [N] (B_COLWISE) or [1]
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    B_K_MAJOR: tl.constexpr,
    A_ROWWISE: tl.constexpr,
    B_COLWISE: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    IMPRECISE_ACC: tl.constexpr,  # K elements a wgmma sums before promotion to fp32
    PROMOTE_EVERY: tl.constexpr = 1,  # K steps per fp32 promotion (GemmConfig.promote_every)
    WARP_SPECIALIZE: tl.constexpr = False,  # loader and MMA warps apart (GemmConfig's)
    LAGGED: tl.constexpr = False,  # fp32 adds one step late (GemmConfig.lagged_promotion)
    SPLIT_ROWS: tl.constexpr = False,  # two BLOCK_M / 2-row dots a step (`split_rows`)
    FLATTEN: tl.constexpr = True,  # one flattened loop over tiles and K steps
):
    start_pid, num_programs, num_pid_m, num_pid_n, k_tiles, num_tiles = _program_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    tile_c = start_pid - num_programs

    for tile_id in tl.range(start_pid, num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M
        offs_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if LAGGED:
            # K steps in pairs, each step's products summed apart by the tensor cores
            # (BLOCK_K <= PROMOTION_K); the pair's first waits for them (and so for the pair
            # before's second), whose fp32 add runs while this pair's second is computed.
            # A step past K loads zeros (the descriptor clips), an odd count's last pair.
            second = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in tl.range(0, k_tiles, 2):
                offs_k = ki * BLOCK_K
                a0 = a_desc.load([offs_m, offs_k])
                a1 = a_desc.load([offs_m, offs_k + BLOCK_K])
                if B_K_MAJOR:
                    b0 = b_desc.load([offs_n, offs_k]).T
                    b1 = b_desc.load([offs_n, offs_k + BLOCK_K]).T
                else:
                    b0 = b_desc.load([offs_k, offs_n])
                    b1 = b_desc.load([offs_k + BLOCK_K, offs_n])
                first = tl.dot(a0, b0)
                acc += second  # the pair before's, complete once `first` is
                second = tl.dot(a1, b1)  # runs during the add below
                acc += first
            acc += second
        elif SPLIT_ROWS:
            # the tile's two 64-row halves as two dots (A loaded in [BLOCK_M / 2, BLOCK_K]
            # blocks), each promoting after its own wgmmas
            HALF_M: tl.constexpr = BLOCK_M // 2
            top = tl.zeros((HALF_M, BLOCK_N), dtype=tl.float32)
            bottom = tl.zeros((HALF_M, BLOCK_N), dtype=tl.float32)
            for ki in tl.range(0, k_tiles):
                offs_k = ki * BLOCK_K
                a_top = a_desc.load([offs_m, offs_k])
                a_bottom = a_desc.load([offs_m + HALF_M, offs_k])
                b = b_desc.load([offs_n, offs_k]).T if B_K_MAJOR else b_desc.load([offs_k, offs_n])
                top = tl.dot(a_top, b, top, max_num_imprecise_acc=IMPRECISE_ACC)
                bottom = tl.dot(a_bottom, b, bottom, max_num_imprecise_acc=IMPRECISE_ACC)
            acc = tl.join(top, bottom).permute(2, 0, 1).reshape(BLOCK_M, BLOCK_N)
        elif PROMOTE_EVERY == 1:
            for ki in tl.range(0, k_tiles, warp_specialize=WARP_SPECIALIZE):
                offs_k = ki * BLOCK_K
                a = a_desc.load([offs_m, offs_k])
                b = b_desc.load([offs_n, offs_k]).T if B_K_MAJOR else b_desc.load([offs_k, offs_n])
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=IMPRECISE_ACC)
        else:
            # PROMOTE_EVERY steps summed by the tensor cores in a pipelined inner loop (its
            # accumulator is loop-carried, so no wait per step), then one fp32 add
            for k_lo in range(0, k_tiles, PROMOTE_EVERY):
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for ki in range(k_lo, tl.minimum(k_lo + PROMOTE_EVERY, k_tiles)):
                    offs_k = ki * BLOCK_K
                    a = a_desc.load([offs_m, offs_k])
                    if B_K_MAJOR:
                        b = b_desc.load([offs_n, offs_k]).T
                    else:
                        b = b_desc.load([offs_k, offs_n])
                    part = tl.dot(a, b, part)
                acc += part

        # The epilogue recomputes its coordinates from its own counter, as persistent.py's.
        tile_c += num_programs
        pid_m, pid_n = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        acc = _scale_tile(
            acc,
            a_scale_ptr,
            b_scale_ptr,
            pid_m * BLOCK_M,
            pid_n * BLOCK_N,
            M,
            N,
            BLOCK_M,
            BLOCK_N,
            A_ROWWISE,
            B_COLWISE,
        )
        _store_c_tile(c_desc, acc, pid_m, pid_n, BLOCK_M, BLOCK_N, False, EPILOGUE_SUBTILE)


def programs(config: GemmConfig, sm_budget: int, device: torch.device) -> int:
    """Persistent programs for a budget of ``sm_budget`` SMs: ``programs_per_sm`` each on a
    full-GPU budget, one each below it (two per SM could spread over the SMs it leaves)."""
    full = sm_budget >= device_info(device).sm_count
    return sm_budget * (config.programs_per_sm if full else 1)


#: Products the tensor cores sum before an fp32 promotion, unless fast accumulation is asked
#: for: CUTLASS's FP8 mainloop promotes every 4 wgmma K-steps of 32 (its
#: ``mma_promotion_interval``), 128 products; a K step of 256 promotes twice.
PROMOTION_K = 128


def imprecise_acc(config: GemmConfig, fast_accum: bool) -> int | None:
    """``tl.dot``'s ``max_num_imprecise_acc``: ``PROMOTION_K`` products (BLOCK_K where
    smaller) before each promotion to fp32, or None for fast accumulation (Triton's default
    on sm_90, ``2**30``: no promotion at all)."""
    return None if fast_accum else min(config.block_k, PROMOTION_K)


def split_rows(config: GemmConfig, fast_accum: bool) -> bool:
    """A one-warpgroup 128-row tile promoting every K step runs as two 64-row dots: one dot
    over both halves adds each half's partial sums between the wgmmas of the tile, and ptxas
    then serializes every wgmma (C7514 in the offline sm_90 compile with Triton 3.6); two
    dots leave it two waits a step."""
    return (
        config.block_m == 128
        and config.num_warps == 4
        and not fast_accum
        and config.promote_every == 1
        and not config.lagged_promotion
        and not config.warp_specialize
    )


def lagged(config: GemmConfig, fast_accum: bool) -> bool:
    """The launch takes the lagged-promotion K loop (``GemmConfig.lagged_promotion``; fast
    accumulation has no promotion to lag); refuses a K step longer than ``PROMOTION_K``,
    whose products the tensor cores would sum unpromoted."""
    if config.lagged_promotion and config.block_k > PROMOTION_K:
        raise ValueError(
            f"GemmConfig.lagged_promotion needs block_k <= {PROMOTION_K} (one promotion per "
            f"step), got {config.name}"
        )
    return config.lagged_promotion and not fast_accum


# ---------------------------------------------------------------------------------------------
# Operands


def kernel_refusal(device: torch.device) -> str | None:
    """Why this kernel cannot run on ``device`` (None: it can)."""
    if TensorDescriptor is None:
        return (
            f"the Triton FP8 GEMM needs host tensor descriptors (Triton >= 3.4); this Triton "
            f"is {triton.__version__}"
        )
    if INTERPRETER:
        return None
    if device.type != "cuda":
        return f"the Triton FP8 GEMM runs on CUDA devices (or TRITON_INTERPRET=1), not {device}"
    have = device_info(device).capability
    if have < (9, 0):
        return (
            f"the Triton FP8 GEMM loads through TMA, which needs compute capability 9.0 "
            f"(Hopper) or higher; {device_info(device).name} has {have[0]}.{have[1]} "
            "(FP8 on it runs on cuBLAS: ficco.kernels.scaled_mm)"
        )
    return None


@dataclass(frozen=True)
class ScaledOperands:
    """What one launch reads and writes (``prepare_operands``)."""

    a: torch.Tensor  # [M, K] fp8, row-major
    b: torch.Tensor  # B^T [N, K] fp8 (b_k_major), else B [K, N] row-major
    b_k_major: bool
    a_scale: torch.Tensor  # fp32 [M] (rowwise) or [1]
    b_scale: torch.Tensor  # fp32 [N] (colwise) or [1]
    out: torch.Tensor  # [M, N], row-major rows (any row stride)
    rowwise: bool
    colwise: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        m, k = self.a.shape
        return m, self.out.shape[1], k


def prepare_operands(
    a, b, a_scale, b_scale, out_dtype, out, check_values: bool = True
) -> ScaledOperands:
    """The kernel's operands; refuses what it cannot take (``InputError`` for a wrong
    operand, ``Unavailable`` for what this device or these views cannot run).
    ``check_values``: also read the scales' values (on a GPU that synchronizes the host)."""
    rows, cols = check_operands(a, b, a_scale, b_scale, check_values)
    m, k = a.shape
    n = b.shape[1]
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: must be one of {OUT_DTYPES}, got {out_dtype}")
    if out is not None and (out.dtype != out_dtype or tuple(out.shape) != (m, n)):
        raise ValueError(
            f"out: must be a [{m}, {n}] {out_dtype} tensor, got {tuple(out.shape)} {out.dtype}"
        )
    reason = kernel_refusal(a.device)
    if reason is not None:
        raise Unavailable(reason)
    if a.stride(1) != 1:  # row-major, as _scaled_mm takes it (the cuBLAS path copies too)
        a = a.contiguous()
    # B column-major (_scaled_mm's) is loaded K-major as wgmma reads it; a row-major B is
    # loaded as it is (the compiler transposes its tiles on chip): no copy of B either way
    b_k_major = b.stride(0) == 1 and (b.stride(1) != 1 or b.shape[1] == 1)
    b_op = b.t() if b_k_major else (b if b.stride(1) == 1 else b.contiguous())
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    for name, t in (("a", a), ("b", b_op), ("out", out)):
        view = _tma_operand(t)
        if view is None or view[2]:
            raise Unavailable(
                f"the Triton FP8 GEMM's TMA loads cannot take {name} (shape {tuple(t.shape)}, "
                f"strides {t.stride()}, base {t.data_ptr() % 16} bytes past 16-byte "
                "alignment): needs a 16-byte aligned base and row stride, unit inner stride"
            )
    a_s = a_scale.reshape(-1).contiguous()
    b_s = b_scale.reshape(-1).contiguous()
    return ScaledOperands(a, b_op, b_k_major, a_s, b_s, out, rows, cols)


def launch_scaled(
    ops: ScaledOperands, *, sm_budget: int, config: GemmConfig, fast_accum: bool = False
) -> torch.Tensor:
    """One launch on prepared operands: ``ops.out = (a * a_scale) @ (b * b_scale)``."""
    m, n, k = ops.shape
    out = ops.out
    info = device_info(out.device)
    config = fit_shared_memory(
        config, FP8_BYTES, out.element_size(), info.shared_memory_bytes, False
    )
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    split = split_rows(config, fast_accum)
    a_shape, a_strides, _ = _tma_operand(ops.a)
    b_shape, b_strides, _ = _tma_operand(ops.b)
    c_shape, c_strides, _ = _tma_operand(out)
    b_block = (
        [config.block_n, config.block_k] if ops.b_k_major else [config.block_k, config.block_n]
    )
    c_cols = config.block_n // 2 if config.epilogue_subtile else config.block_n
    grid = (max(1, min(programs(config, sm_budget, out.device), tiles)),)
    LAST_COMPILED["scaled"] = _scaled_mm_tma_kernel[grid](
        TensorDescriptor(
            ops.a, a_shape, a_strides, [config.block_m // (2 if split else 1), config.block_k]
        ),
        TensorDescriptor(ops.b, b_shape, b_strides, b_block),
        TensorDescriptor(out, c_shape, c_strides, [config.block_m, c_cols]),
        ops.a_scale,
        ops.b_scale,
        m,
        n,
        k,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        B_K_MAJOR=ops.b_k_major,
        A_ROWWISE=ops.rowwise,
        B_COLWISE=ops.colwise,
        EPILOGUE_SUBTILE=config.epilogue_subtile,
        IMPRECISE_ACC=imprecise_acc(config, fast_accum),
        PROMOTE_EVERY=1 if fast_accum else config.promote_every,
        WARP_SPECIALIZE=config.warp_specialize,
        LAGGED=lagged(config, fast_accum),
        SPLIT_ROWS=split,
        # flattened, the tile loop's reset of the lagged partial sum serializes the wgmmas
        FLATTEN=not lagged(config, fast_accum),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    LAUNCH_COUNTS["scaled"] += 1
    return out
