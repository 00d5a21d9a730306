"""The persistent FP8 GEMM for Hopper: ``out = (a * a_scale) @ (b * b_scale)`` in one launch.

:func:`scaled_matmul` is ``ficco.kernels.scaled_mm.scaled_matmul``'s function (the same
signature, operand checks and result) computed by a Triton kernel instead of cuBLASLt's
``torch._scaled_mm``: fp8 (e4m3 or e5m2) inputs, fp32 accumulation, the scales applied to
the fp32 accumulator, one rounding to ``out_dtype`` (bf16) at the store.

- ``a [M, K]`` row-major (another view is copied first, as the cuBLAS path does);
  ``b [K, N]`` column-major, as ``torch._scaled_mm`` takes it (the ``[K, N]`` view of a
  contiguous ``b_t [N, K]``): Hopper's FP8 wgmma reads both operands K-major, so the kernel
  loads ``b_t``'s ``[BLOCK_N, BLOCK_K]`` tiles and uses their transpose (a view, no data
  moves). A row-major ``b`` is taken too, without a copy: its ``[BLOCK_K, BLOCK_N]`` tiles
  are transposed on chip by the compiler (shared-memory traffic per K step; ``_scaled_mm``
  needs the column-major copy instead).
- ``a_scale``: one (``[1]``/``[1, 1]``) or per row (``[M, 1]``); ``b_scale``: one or per
  column (``[1, N]``); fp32, finite, positive (``check_operands``).
- ``out`` may be a row slice of a larger tensor (any 16-byte aligned row stride).

The kernel is the persistent GEMM's (``ficco.kernels.persistent``): ``min(sm_budget,
tiles)`` programs, grouped tile order (``_tile_coords``), one flattened ``tl.range`` over
tiles and K steps, TMA descriptors (ragged M, N, K clipped by the descriptor), the C store
(``_store_c_tile``); what differs is the scale epilogue (``_scale_tile``, shared with the
fused kernel), FP8's tile space and two programs per SM where a config asks for them
(``GemmConfig.programs_per_sm``, full-GPU budgets only). The configuration comes from the
FP8 space (``ficco.kernels.scaled_configs``), per shape from the tuning cache (``TuningKey``
with the fp8 dtype: the scale granularities share an entry), else from the entries shipped
per card (``shipped_configs``), else tuned now (``tune_scaled``), else under
``FICCO_GEMM_AUTOTUNE=0`` a heuristic. On a Hopper GPU a shape the card's shipped Gluon picks
name (fp8 keys, ``ficco.kernels.matmul.scaled_gluon_config``: per-row and per-column scales,
a column-major ``b``) runs the warp-specialized Gluon kernel instead (``ficco.kernels.
gluon_gemm``, the same accumulation); ``FICCO_GEMM_GLUON=0`` keeps every call here.

Accumulation: by default the wgmma's partial sums are promoted into the fp32 accumulator
every ``PROMOTION_K`` = 128 products (``max_num_imprecise_acc``; a K step of 256 promotes
twice), CUTLASS's FP8 promotion interval; ``torch._scaled_mm``'s default
(``use_fast_accum=False``: cuBLASLt's row-wise FP8 GEMM on sm_90 with cuBLAS >= 12.9,
CUTLASS's ``f8f8bf16_rowwise`` before it) promotes periodically too, at an interval cuBLAS
does not document. Triton's own default on sm_90 (``max_num_imprecise_acc = 2**30``) never
promotes: ``fast_accum=True`` asks for that, as ``use_fast_accum=True`` does. ptxas waits for
each wgmma before its promotion adds; two programs per SM hide that in part, and
``GemmConfig.lagged_promotion`` overlaps the adds with the next K step's wgmma.
``GemmConfig.promote_every = n`` promotes every n K steps instead (coarser; not in the
default space).

Refused with :class:`ficco.verdict.Unavailable` naming the cause: a device without TMA
(compute capability below 9.0: FP8 on Ada runs on cuBLAS only), a Triton without host
tensor descriptors, views a descriptor cannot take (16-byte aligned bases and row strides).
Runs under the CPU interpreter (``TRITON_INTERPRET=1``), which computes fp8 dots on the
same bits. The kernel and its launch: ``ficco.kernels.scaled_kernel``; this module chooses
the configuration (cached, shipped, tuned) and is the entry point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ficco.dtypes import lookup
from ficco.kernels.configs import GemmConfig
from ficco.kernels.persistent import default_sm_budget, device_info
from ficco.kernels.scaled_configs import scaled_candidate_configs, scaled_heuristic_config

# the kernel's names callers reach through the entry point (scripts, tests) re-exported
from ficco.kernels.scaled_kernel import (  # noqa: F401
    FP8_DTYPES,
    PROMOTION_K,
    ScaledOperands,
    imprecise_acc,
    kernel_refusal,
    lagged,
    launch_scaled,
    prepare_operands,
    programs,
    split_rows,
)
from ficco.kernels.trials import RoundsTimer, Timer, Trials, check_then_time, tuning_record
from ficco.kernels.tuning import (
    TuningKey,
    device_of,
    launch_timer,
    resolve_config,
    shipped_entries,
    store,
    wall_clock_timer,
)
from ficco.verdict import Unavailable


def scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    *,
    sm_budget: int | None = None,
    config: GemmConfig | None = None,
    check_values: bool = True,
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale)`` accumulated in fp32 and stored as ``out_dtype``
    (into ``out`` where given), on ``sm_budget`` persistent programs (default: every SM)
    with ``config`` (default: tuned per shape). See the module docstring.
    ``check_values=False`` checks the scales' shapes and dtype, not their values (as
    ``ficco.kernels.scaled_mm.scaled_matmul``'s: scales that arrive on the GPU's streams)."""
    ops = prepare_operands(a, b, a_scale, b_scale, out_dtype, out, check_values)
    budget = default_sm_budget(a.device) if sm_budget is None else sm_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"sm_budget: must be a positive int (programs), got {sm_budget!r}")
    m, n, k = ops.shape
    if min(m, n, k) == 0:
        return ops.out.zero_()
    if config is None:
        from ficco.kernels.matmul import scaled_gluon_config

        picked = scaled_gluon_config(ops, budget)
        if picked is not None:
            from ficco.kernels.gluon_gemm import ws_gemm

            return ws_gemm(
                ops.a, ops.b.t(), ops.out, picked, a_scale=ops.a_scale, b_scale=ops.b_scale,
                programs=budget,
            )  # fmt: skip
        config = scaled_config_for(m, n, k, a.dtype, budget, a.device)
    return launch_scaled(ops, sm_budget=budget, config=config)


# ---------------------------------------------------------------------------------------------
# Tuning


#: FP8 configurations measured per card, shipped in the package
#: (``schedules/<card>/fp8_gemm_tuning.json``: the tuning cache's format and keys, so only the
#: card and Triton they were measured with match): read where the tuning cache has no entry
SHIPPED_TUNING_FILE = "fp8_gemm_tuning.json"


def shipped_configs() -> dict[str, GemmConfig]:
    """Tuning key -> configuration, from every shipped ``<card>/fp8_gemm_tuning.json``."""
    return shipped_entries(SHIPPED_TUNING_FILE)


def scaled_config_for(
    m: int, n: int, k: int, dtype: torch.dtype, sm_budget: int, device
) -> GemmConfig:
    """The configuration ``scaled_matmul`` uses (``tuning.resolve_config`` over the FP8
    tuning: cached, else shipped, ``shipped_configs``, else tuned now)."""
    return resolve_config(
        m,
        n,
        k,
        dtype,
        sm_budget,
        device,
        shipped_file=SHIPPED_TUNING_FILE,
        heuristic=lambda interpreter: scaled_heuristic_config(m, n, interpreter=interpreter),
        tune_now=lambda dev: tune_scaled(m, n, k, dtype, sm_budget, dev),
    )


def random_operands(m: int, n: int, k: int, dtype: torch.dtype, device, *, seed: int):
    """Seeded fp8 operands as a runtime quantizes them: ``a [M, K]``, ``b [K, N]``
    (column-major), per-row and per-column scales mapping each row's (column's) largest
    magnitude onto the dtype's largest value, and the fp32 reference from the same bits."""
    gen = torch.Generator(device=device).manual_seed(seed)
    largest = lookup(str(dtype)).largest
    x = torch.randn((m, k), device=device, generator=gen)
    w = torch.randn((n, k), device=device, generator=gen)  # b_t
    a_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / largest  # [M, 1]
    b_scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12).t() / largest  # [1, N]
    a = (x / a_scale).to(dtype)
    b_t = (w / b_scale.t()).to(dtype)
    ref = (a.float() * a_scale) @ (b_t.float() * b_scale.t()).t()
    return a, b_t.t(), a_scale.contiguous(), b_scale.contiguous(), ref


def tune_scaled(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.float8_e4m3fn,
    sm_budget: int | None = None,
    device=None,
    *,
    configs: Sequence[GemmConfig] | None = None,
    timer: Timer | RoundsTimer | None = None,
    write_cache: bool = True,
    fast_accum: bool = False,
) -> GemmConfig:
    """The fastest correct FP8 configuration for ``[m, k] @ [k, n]`` (per-row and
    per-column scales) at ``sm_budget``: every candidate checked against the fp32 product
    of the dequantized inputs, then timed (``trials.check_then_time``); recorded in the
    tuning cache under the fp8 dtype's key (when ``write_cache``)."""
    trials, started = scaled_trials(
        m, n, k, dtype, sm_budget, device, configs=configs, timer=timer, fast_accum=fast_accum
    )
    if write_cache:
        device = device_of(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        budget = default_sm_budget(device) if sm_budget is None else sm_budget
        key = TuningKey.for_problem(m, n, k, dtype, budget, device)
        store(key, tuning_record(trials, m, n, k, "tma", started))
    return trials.configs[trials.best()]


def scaled_trials(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    sm_budget: int | None,
    device,
    *,
    configs: Sequence[GemmConfig] | None = None,
    timer: Timer | RoundsTimer | None = None,
    fast_accum: bool = False,
) -> tuple[Trials, float]:
    """``check_then_time`` over the FP8 candidates for one shape; returns the trials and
    the ``perf_counter`` at their start."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"dtype: must be one of {FP8_DTYPES}, got {dtype}")
    if min(m, n, k) < 1:
        raise ValueError(f"m, n, k must be positive, got {(m, n, k)}")
    device = device_of(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    reason = kernel_refusal(device)
    if reason is not None:
        raise Unavailable(reason)
    budget = default_sm_budget(device) if sm_budget is None else int(sm_budget)
    on_gpu = device.type == "cuda"
    if configs is None:
        info = device_info(device)
        configs = scaled_candidate_configs(
            m,
            n,
            k,
            interpreter=not on_gpu,
            shared_memory_bytes=info.shared_memory_bytes,
            full_budget=budget >= info.sm_count,
        )
    if timer is None:
        timer = launch_timer() if on_gpu else wall_clock_timer
    started = time.perf_counter()
    a, b, a_s, b_s, ref = random_operands(m, n, k, dtype, device, seed=m * 1_000_003 + n + k)
    ops = prepare_operands(a, b, a_s, b_s, torch.bfloat16, None)

    def build(cfg: GemmConfig) -> Callable[[], object]:
        return lambda: launch_scaled(ops, sm_budget=budget, config=cfg, fast_accum=fast_accum)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    trials = check_then_time(configs, build, ops.out, ref, timer, sync)
    if not trials.timings_ms:
        raise RuntimeError(f"no FP8 GEMM configuration ran correctly for {(m, n, k)}: {trials}")
    return trials, started
