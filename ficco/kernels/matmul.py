"""`matmul`: the persistent Triton GEMM with an SM budget, for overlap schedules.

`out (+)= a @ b` with a [M, K], b [K, N], out [M, N]; fp32 accumulation for bf16/fp16 (and
fp32, computed in full fp32). Any operand may be a strided view: a row slice `c[r0:r1]` or a
column slice `c[:, n0:n1]` of a larger output is written only inside the slice, and b may be a
transposed view of a [N, K] weight. `accumulate=True` adds into `out` (schedules that split K).

The grid is `min(sm_budget, tiles)` persistent programs (default: every SM), so a schedule can
leave SMs to communication kernels. Without an explicit `config`, the configuration comes from
the per-shape tuning cache (`ficco.kernels.tuning`), tuning on first use of a shape on CUDA;
on a Hopper GPU, a shape the card's shipped Gluon picks name (`ficco.kernels.gluon_configs`:
measured faster there, row-major operands, no accumulation, not in the user's own tuning cache)
runs the warp-specialized Gluon kernel (`ficco.kernels.gluon_gemm`) instead.
``FICCO_GEMM_GLUON=0`` keeps every call on Triton.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ficco.kernels.configs import GemmConfig, heuristic_config
from ficco.kernels.gluon_configs import GluonGemmConfig, picks_enabled, shipped_picks
from ficco.kernels.persistent import (
    INTERPRETER,
    default_sm_budget,
    device_info,
    launch,
    select_path,
    tma_row_major,
)
from ficco.kernels.tuning import TuningKey, cached_config, config_for

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# (m, n, k, dtype, sm budget, device) -> the shipped Gluon pick or None: a seen shape reads
# no file and builds no key
_gluon_fast: dict[tuple, tuple[GluonGemmConfig, TuningKey] | None] = {}


@functools.cache
def _gluon_importable() -> bool:
    """This Triton has Gluon's Hopper module."""
    try:
        return (
            importlib.util.find_spec("triton.experimental.gluon.language.nvidia.hopper") is not None
        )
    except ModuleNotFoundError:
        return False


def shipped_gluon_pick(
    m: int, n: int, k: int, dtype: torch.dtype, sm_budget: int, device: torch.device
) -> GluonGemmConfig | None:
    """The card's shipped Gluon pick for this shape, dtype and budget, or None (the picks
    off, not an sm_90 GPU, no Gluon, no pick, or a shape the user tuned: their tuning cache
    keeps their Triton configuration, the pick having been measured against the shipped one).
    Shared by `matmul` (16-bit) and `ficco.kernels.scaled.scaled_matmul` (FP8)."""
    if not picks_enabled():  # first: a bad switch value is refused on any device
        return None
    if device.type != "cuda":
        return None
    fast_key = (m, n, k, dtype, sm_budget, device)
    if fast_key not in _gluon_fast:
        hit = None
        # sm_90 exactly: wgmma and setmaxnreg
        if device_info(device).capability == (9, 0) and _gluon_importable():
            key = TuningKey.for_problem(m, n, k, dtype, sm_budget, device)
            pick = shipped_picks().get(str(key))
            hit = None if pick is None else (pick, key)
        _gluon_fast[fast_key] = hit
    hit = _gluon_fast[fast_key]
    if hit is None:
        return None
    pick, key = hit
    if cached_config(key) is not None:
        return None
    return pick


def gluon_config(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, sm_budget: int
) -> GluonGemmConfig | None:
    """The shipped Gluon pick `matmul` runs for these operands, or None (not CUDA, not 16-bit,
    another card or Triton, no pick for the shape and budget, operands TMA cannot read)."""
    if not picks_enabled():  # first: a bad switch value is refused on any device
        return None
    if a.dtype not in (torch.bfloat16, torch.float16) or out.dtype != a.dtype:
        return None
    m, k = a.shape
    pick = shipped_gluon_pick(m, b.shape[1], k, a.dtype, sm_budget, a.device)
    # the kernel's TMA descriptors: every operand row-major (16-byte aligned rows and base)
    if pick is None or not all(tma_row_major(t) for t in (a, b, out)):
        return None
    return pick


def gluon_fp8_refusal(rowwise: bool, colwise: bool, b_k_major: bool, outs) -> str:
    """Why FP8 operands are not what the Gluon FP8 picks were measured on ('' when they
    are): per-row A and per-column B scales, B column-major (FP8 wgmma reads it K-major),
    bf16 outputs. `scaled_matmul`'s and the fused launch's (`ficco.kernels.gluon_fused`)."""
    if not (rowwise and colwise):
        return "per-tensor scales (the picks were measured with per-row A and per-column B)"
    if not b_k_major:
        return "b is not column-major (FP8 wgmma reads B K-major)"
    if any(o.dtype != torch.bfloat16 for o in outs):
        return "an output is not bf16"
    return ""


def scaled_gluon_config(ops, sm_budget: int) -> GluonGemmConfig | None:
    """The shipped Gluon FP8 pick `scaled_matmul` runs for its prepared operands
    (`ficco.kernels.scaled_kernel.ScaledOperands`), or None: operands `gluon_fp8_refusal` refuses,
    no pick, an out TMA cannot store."""
    if gluon_fp8_refusal(ops.rowwise, ops.colwise, ops.b_k_major, [ops.out]):
        return None
    m, n, k = ops.shape
    pick = shipped_gluon_pick(m, n, k, ops.a.dtype, sm_budget, ops.a.device)
    if pick is None or not tma_row_major(ops.out):
        return None
    return pick


def _check_2d(name: str, t: object, dims: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D {dims}, got shape {tuple(t.shape)}")
    if any(s == 0 for s, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        raise ValueError(
            f"{name} must not have a zero stride on a dimension of size > 1 "
            f"(an expanded view), got strides {t.stride()}"
        )


def _validate(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    accumulate: bool,
    sm_budget: int | None,
    config: GemmConfig | None,
) -> None:
    _check_2d("a", a, "[M, K]")
    _check_2d("b", b, "[K, N]")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"a [M, K] and b [K, N] must agree on K: a is {tuple(a.shape)}, b is {tuple(b.shape)}"
        )
    if a.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"a.dtype must be one of bfloat16, float16, float32, got {a.dtype}")
    if b.dtype != a.dtype:
        raise ValueError(f"b.dtype must equal a.dtype ({a.dtype}), got {b.dtype}")
    if b.device != a.device:
        raise ValueError(f"b must be on a's device ({a.device}), got {b.device}")
    if a.device.type != "cuda" and not (a.device.type == "cpu" and INTERPRETER):
        raise ValueError(
            f"a must be on a CUDA device (or on the CPU with TRITON_INTERPRET=1 set before "
            f"importing ficco.kernels), got {a.device}"
        )
    if out is not None:
        _check_2d("out", out, "[M, N]")
        if tuple(out.shape) != (a.shape[0], b.shape[1]):
            raise ValueError(
                f"out must have shape [M, N] = {(a.shape[0], b.shape[1])}, got {tuple(out.shape)}"
            )
        if out.dtype not in (a.dtype, torch.float32):
            raise ValueError(f"out.dtype must be a.dtype ({a.dtype}) or float32, got {out.dtype}")
        if out.device != a.device:
            raise ValueError(f"out must be on a's device ({a.device}), got {out.device}")
    elif accumulate:
        raise ValueError("accumulate=True needs out: it computes out += a @ b")
    if sm_budget is not None and (
        isinstance(sm_budget, bool) or not isinstance(sm_budget, int) or sm_budget < 1
    ):
        raise ValueError(
            f"sm_budget must be a positive int (persistent programs), got {sm_budget!r}"
        )
    if config is not None and not isinstance(config, GemmConfig):
        raise ValueError(f"config must be a GemmConfig, got {type(config).__name__}")


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    accumulate: bool = False,
    sm_budget: int | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """`out = a @ b` (or `out += a @ b` with `accumulate=True`); returns `out`.

    a [M, K] and b [K, N] share a dtype (bfloat16, float16 or float32) and a device; out
    [M, N] is allocated in a's dtype when not given, else written in place (its dtype may be
    a's or float32). `sm_budget` is the number of persistent programs (default: the device's
    SM count); `config` overrides the tuned configuration. `out` must not overlap a or b.
    """
    _validate(a, b, out, accumulate, sm_budget, config)
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        if not accumulate:
            out.zero_()
        return out
    budget = sm_budget if sm_budget is not None else default_sm_budget(a.device)
    if config is None and not accumulate:
        picked = gluon_config(a, b, out, budget)
        if picked is not None:
            from ficco.kernels.gluon_gemm import ws_gemm

            ws_gemm(a, b, out, picked, programs=budget)
            return out
    if config is None:
        if INTERPRETER and a.device.type == "cpu":
            config = heuristic_config(m, n, k, interpreter=True)
        else:
            config = config_for(m, n, k, a.dtype, budget, a.device)
    launch(
        a,
        b,
        out,
        accumulate=accumulate,
        sm_budget=budget,
        config=config,
        path=select_path(a, b, out),
    )
    return out
