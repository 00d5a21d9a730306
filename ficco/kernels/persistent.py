"""Persistent Triton GEMM kernels for Hopper, with a pointer-based fallback.

One launch starts `min(sm_budget, tiles)` programs; each walks the output tiles
`pid, pid + grid, pid + 2 * grid, ...` in grouped order (`group_m` tiles down M before moving
along N, so consecutive tiles share B's columns in L2). The SM budget is the grid size, a
runtime value: changing it never recompiles.

Two kernels compute the same function, `out (+)= a @ b` with fp32 accumulation:

- `_matmul_tma_kernel` reads A and B and writes C through host-built TMA tensor descriptors
  (`triton.tools.tensor_descriptor.TensorDescriptor`, Triton >= 3.4). The descriptor clips
  out-of-bounds loads to zero and drops out-of-bounds stores, so ragged M, N, K need no masks,
  and a C that is a row or column slice of a larger tensor is written only inside the slice.
  TMA needs 16-byte aligned base addresses and leading strides and a unit inner stride.
- the pointer kernel (`ficco.kernels.pointer`) uses masked pointer loads/stores with
  arbitrary strides: for GPUs before Hopper, misaligned views, and Tritons without host
  descriptors.

A config with `split_k` >= 2 runs the split-K decode kernel instead (`ficco.kernels.decode`,
any views), whatever the path.

Both run under the CPU interpreter (`TRITON_INTERPRET=1`; Triton 3.9 interprets descriptors).
The outer tile loop is `tl.range(..., flatten=True)`, as in Triton's persistent-matmul tutorial:
the compiler flattens tile and K loops into one pipelined loop, so the next tile's first loads
are in flight during this tile's epilogue. The epilogue recomputes its tile coordinates from a
separate counter (`unit_c`), which the tutorial does to keep prologue and epilogue
independent in the flattened loop.

Split tail (`GemmConfig.split_tail`, TMA kernel): with T tiles on P programs the last wave
holds T mod P tiles and leaves the other programs idle; on an H200 the SM-budget throughput
followed that wave count exactly (8192^3: 16 waves at 132 programs, 18 at 120: 0.889 predicted,
0.888 measured). Those tail tiles are split along K (`configs.split_plan`); every K range
writes an fp32 partial, and the last of them to arrive (an acq_rel ticket per tile) sums the
partials in a fixed order, so results are deterministic, and stores C.

A last wave of more than half the programs is left whole (split into several waves of K
ranges it ran slower on an H200: `split_plan`). The bf16 kernels take no warp
specialization (`GemmConfig.warp_specialize` is the FP8 kernel's option).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton
import triton.language as tl

from ficco.kernels.configs import (
    FALLBACK_CONFIG,
    HOPPER_SHARED_MEMORY_BYTES,
    GemmConfig,
    split_plan,
)
from ficco.kernels.decode import launch_decode
from ficco.kernels.pointer import launch_ptr
from ficco.kernels.tiles import _program_grid, _tile_coords, _unit_coords

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Tritons take the pointer path
    TensorDescriptor = None

# Triton reads this when kernels are decorated: it must be set before this module is imported.
INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"

Path = Literal["tma", "ptr"]

# Launches per kernel path in this process, and the last compiled kernel of each: lets tests
# and benchmarks assert which path actually ran (a silent fallback looks like success).
LAUNCH_COUNTS: Counter[str] = Counter()
LAST_COMPILED: dict[str, object] = {}

_TORCH_TO_TL_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}


# M, N, K and the split plan are loop bounds and descriptor-clipped offsets here: left
# unspecialised, one compiled kernel per config serves every shape (and a pool of processes
# can compile the space ahead of a tuning run).
@triton.jit(do_not_specialize=["M", "N", "K", "num_units", "dp_tiles", "split", "k_per_split"])
def _matmul_tma_kernel(
    a_desc,  # A [M, K], or A^T [K, M] when A_COL_MAJOR
    b_desc,  # B [K, N], or B^T [N, K] when B_COL_MAJOR
    c_desc,  # C [M, N] (any row stride), blocks [BLOCK_M, BLOCK_N or BLOCK_N / 2];
    # TRANSPOSE_C: C^T [N, M], blocks [BLOCK_N or BLOCK_N / 2, BLOCK_M] (swap_ab)
    ws_ptr,  # SPLIT_TAIL: fp32 partial tiles [tail tiles, split, BLOCK_M, BLOCK_N]
    lock_ptr,  # int32 arrival counters, one per split tile, zero on entry and left zero
    M,
    N,
    K,
    num_units,
    dp_tiles,  # SPLIT_TAIL: whole tiles before the split ones
    split,  # SPLIT_TAIL: K ranges per tail tile
    k_per_split,  # SPLIT_TAIL: K steps per range
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_COL_MAJOR: tl.constexpr,
    B_COL_MAJOR: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    SPLIT_TAIL: tl.constexpr,
    TRANSPOSE_C: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_pid, num_programs, num_pid_m, num_pid_n, k_tiles, num_tiles = _program_grid(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K
    )
    if not SPLIT_TAIL:
        num_units = num_tiles
    unit_c = start_pid - num_programs

    for unit in tl.range(start_pid, num_units, num_programs, flatten=True):
        if SPLIT_TAIL:
            tile_id, _, _, k_lo, k_hi = _unit_coords(unit, dp_tiles, split, k_per_split, k_tiles)
        else:
            tile_id = unit
            k_lo = 0
            k_hi = k_tiles
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M
        offs_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in tl.range(k_lo, k_hi):
            offs_k = ki * BLOCK_K
            a = a_desc.load([offs_k, offs_m]).T if A_COL_MAJOR else a_desc.load([offs_m, offs_k])
            b = b_desc.load([offs_n, offs_k]).T if B_COL_MAJOR else b_desc.load([offs_k, offs_n])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

        # The epilogue recomputes its coordinates from its own counter (as the tutorial does),
        # keeping it independent of the flattened loop's prologue.
        unit_c += num_programs
        if SPLIT_TAIL:
            tile_c, is_split, part, _, _ = _unit_coords(
                unit_c, dp_tiles, split, k_per_split, k_tiles
            )
            store = is_split == 0
            if is_split:
                # Every K range stores its partial; the last to arrive sums them in a fixed
                # order (deterministic) and writes C. Stores, then a CTA barrier, then a
                # gpu-scope release: the partials are visible to whoever takes the last ticket.
                local = tile_c - dp_tiles
                offs_tile = (
                    tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                )
                slots = ws_ptr + (local * split).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs_tile
                tl.store(slots + part * (BLOCK_M * BLOCK_N), acc)
                tl.debug_barrier()
                ticket = tl.atomic_add(lock_ptr + local, 1, sem="acq_rel", scope="gpu")
                store = ticket == split - 1
                if store:
                    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for p in range(split):
                        acc += tl.load(slots + p * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
                    tl.store(lock_ptr + local, 0)  # ready for the next launch on this stream
        else:
            tile_c = unit_c
            store = True
        if store:
            pid_m, pid_n = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
            _store_c_tile(
                c_desc, acc, pid_m, pid_n, BLOCK_M, BLOCK_N, ACCUMULATE, EPILOGUE_SUBTILE,
                TRANSPOSE_C,
            )  # fmt: skip


@triton.jit
def _store_c_tile(
    c_desc,
    acc,
    pid_m,
    pid_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    TRANSPOSE_C: tl.constexpr = False,
):
    # C[pid_m, pid_n] (+)= acc [BLOCK_M, BLOCK_N] fp32, through the TMA descriptor;
    # TRANSPOSE_C: the descriptor is C^T's (swap_ab computed out^T), so acc^T is stored.
    offs_cm = pid_m * BLOCK_M
    offs_cn = pid_n * BLOCK_N
    if TRANSPOSE_C:
        if EPILOGUE_SUBTILE:
            acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            acc0, acc1 = tl.split(acc3)
            acc0 = tl.trans(acc0)  # [BLOCK_N / 2, BLOCK_M]
            acc1 = tl.trans(acc1)
            if ACCUMULATE:
                acc0 += c_desc.load([offs_cn, offs_cm]).to(tl.float32)
                acc1 += c_desc.load([offs_cn + BLOCK_N // 2, offs_cm]).to(tl.float32)
            c_desc.store([offs_cn, offs_cm], acc0.to(c_desc.dtype))
            c_desc.store([offs_cn + BLOCK_N // 2, offs_cm], acc1.to(c_desc.dtype))
        else:
            acc_t = tl.trans(acc)  # [BLOCK_N, BLOCK_M]
            if ACCUMULATE:
                acc_t += c_desc.load([offs_cn, offs_cm]).to(tl.float32)
            c_desc.store([offs_cn, offs_cm], acc_t.to(c_desc.dtype))
    elif EPILOGUE_SUBTILE:
        # Two [BLOCK_M, BLOCK_N / 2] stores: half the staging buffer, one more A/B stage.
        acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(acc3)
        if ACCUMULATE:
            acc0 += c_desc.load([offs_cm, offs_cn]).to(tl.float32)
            acc1 += c_desc.load([offs_cm, offs_cn + BLOCK_N // 2]).to(tl.float32)
        c_desc.store([offs_cm, offs_cn], acc0.to(c_desc.dtype))
        c_desc.store([offs_cm, offs_cn + BLOCK_N // 2], acc1.to(c_desc.dtype))
    else:
        if ACCUMULATE:
            acc += c_desc.load([offs_cm, offs_cn]).to(tl.float32)
        c_desc.store([offs_cm, offs_cn], acc.to(c_desc.dtype))


# ---------------------------------------------------------------------------------------------
# Devices and path selection


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm_count: int
    capability: tuple[int, int]
    shared_memory_bytes: int


@functools.cache
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    smem = int(getattr(props, "shared_memory_per_block_optin", HOPPER_SHARED_MEMORY_BYTES))
    return DeviceInfo(props.name, props.multi_processor_count, (props.major, props.minor), smem)


def device_info(device: torch.device) -> DeviceInfo:
    """Name, SM count, capability and opt-in shared memory, read once per device."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        return _cuda_device_info(index)
    name = "cpu-interpreter" if INTERPRETER else device.type
    return DeviceInfo(name, 4, (0, 0), 1 << 30)


def default_sm_budget(device: torch.device | str) -> int:
    """Persistent programs per launch when none is given: the device's SM count.

    Under the CPU interpreter programs run one after another, so any small number works; 4
    keeps several programs (and so the persistent tile loop) exercised.
    """
    return device_info(torch.device(device)).sm_count


def _tma_operand(t: torch.Tensor) -> tuple[list[int], list[int], bool] | None:
    """How TMA sees a 2-D view `t [R, C]`: (shape, strides, col_major), or None if it cannot.

    Row-major views are described as [R, C] with strides [s0, 1]; column-major ones (a
    transposed view) as their transpose [C, R] with strides [s1, 1]. TMA needs a 16-byte
    aligned base address and leading stride. A size-1 dimension's stride is never used, so it
    is replaced by an aligned one.
    """
    rows, cols = t.shape
    elem = t.element_size()
    if t.data_ptr() % 16:
        return None
    align = 16 // elem
    s0, s1 = t.stride()
    if rows == 1:
        s0 = -(-max(cols, 1) // align) * align if s1 == 1 else s0
    if cols == 1:
        s1 = -(-max(rows, 1) // align) * align if s0 == 1 else s1
    if s1 == 1 and (s0 * elem) % 16 == 0:
        return [rows, cols], [s0, 1], False
    if s0 == 1 and (s1 * elem) % 16 == 0:
        return [cols, rows], [s1, 1], True
    return None


def tma_row_major(t: torch.Tensor) -> bool:
    """TMA reads ``t`` as the row-major [R, C] it is (`_tma_operand`, not transposed)."""
    found = _tma_operand(t)
    return found is not None and not found[2]


def tma_available(device: torch.device) -> bool:
    """This Triton builds host tensor descriptors, and the device (or interpreter) runs them."""
    if TensorDescriptor is None:
        return False
    if INTERPRETER:
        return True
    return device.type == "cuda" and device_info(device).capability[0] >= 9


def select_path(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Path:
    """The kernel `matmul` uses for these operands: 'tma' where every view allows it, else 'ptr'."""
    if not tma_available(a.device):
        return "ptr"
    if tma_row_major(out) and _tma_operand(a) is not None and _tma_operand(b) is not None:
        return "tma"
    if not INTERPRETER:
        _warn_once(
            "ficco.kernels.matmul: an operand view is not TMA-compatible (16-byte aligned base "
            "and leading stride, unit inner stride; out must be row-major): using the slower "
            "pointer kernel"
        )
    return "ptr"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # A silent fallback would be indistinguishable from the feature working.
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Launch

# Arrival counters for split tiles, per (device, stream): zero between launches (the last
# arriver resets its counter), so kernels queued on one stream can share them without a memset.
_locks: dict[tuple[str, int | None, int], torch.Tensor] = {}


def _lock_buffer(device: torch.device, count: int) -> torch.Tensor:
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _locks.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, 256), dtype=torch.int32, device=device)
        _locks[key] = buf
    return buf


@functools.lru_cache(maxsize=256)
def fit_shared_memory(
    config: GemmConfig, in_bytes: int, out_bytes: int, limit: int, accumulate: bool
) -> GemmConfig:
    """``config`` with pipeline stages dropped until its tiles fit ``limit`` bytes of shared
    memory (accumulate=True also stages the C tile it reads). An untuned heuristic config can
    exceed it (fp32 tiles of a 1024-row GEMM: 262168 > 232448 bytes on an H100)."""
    cfg = config
    while cfg.num_stages > 2 and cfg.shared_memory_bytes(in_bytes, out_bytes, accumulate) > limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    accumulate: bool,
    sm_budget: int,
    config: GemmConfig,
    path: Path,
) -> torch.Tensor:
    """Run one kernel on validated operands: `out (+)= a @ b`, a [M, K], b [K, N], out [M, N]."""
    m, k = a.shape
    n = b.shape[1]
    precision = _TORCH_TO_TL_PRECISION[a.dtype]
    if config.warp_specialize:
        raise ValueError(
            f"config {config.name}: GemmConfig.warp_specialize is the FP8 kernel's option; "
            "the bf16 kernels do not take it"
        )
    if config.decode:  # any view: the decode kernel loads through pointers
        tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
        LAST_COMPILED["decode"] = launch_decode(
            a,
            b,
            out,
            accumulate=accumulate,
            sm_budget=sm_budget,
            config=config,
            precision=precision,
            locks=_lock_buffer(out.device, tiles),
        )
        LAUNCH_COUNTS["decode"] += 1
        return out
    if path == "ptr":
        _launch_ptr(a, b, out, accumulate, sm_budget, config, precision)
        return out
    limit = device_info(out.device).shared_memory_bytes
    config = fit_shared_memory(config, a.element_size(), out.element_size(), limit, accumulate)
    if config.swap_ab:
        # out^T [N, M] = b^T [N, K] @ a^T [K, M]: the kernel's tile is the config's, transposed,
        # and it stores its tiles transposed into out's own (row-major) descriptor.
        c_shape, c_strides, _ = _tma_operand(out)
        a, b, m, n = b.t(), a.t(), n, m
        config = replace(config, block_m=config.block_n, block_n=config.block_m)
    else:
        c_shape, c_strides, _ = _tma_operand(out)
    num_tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    k_steps = triton.cdiv(k, config.block_k)
    plan = split_plan(num_tiles, sm_budget, k_steps) if config.split_tail else None
    if plan is None:
        units, dp_tiles, split, k_per_split = num_tiles, num_tiles, 1, 1
        lock = ws = _lock_buffer(out.device, 1)
    else:
        units, dp_tiles, split, k_per_split = (
            plan.units,
            plan.dp_tiles,
            plan.split,
            plan.k_per_split,
        )
        lock = _lock_buffer(out.device, plan.tail_tiles)
        ws = torch.empty(
            plan.tail_tiles * split * config.block_m * config.block_n,
            dtype=torch.float32,
            device=out.device,
        )
    a_shape, a_strides, a_col = _tma_operand(a)
    b_shape, b_strides, b_col = _tma_operand(b)
    a_block = [config.block_k, config.block_m] if a_col else [config.block_m, config.block_k]
    b_block = [config.block_n, config.block_k] if b_col else [config.block_k, config.block_n]
    c_cols = config.block_n // 2 if config.epilogue_subtile else config.block_n
    c_block = [c_cols, config.block_m] if config.swap_ab else [config.block_m, c_cols]
    LAST_COMPILED["tma"] = _matmul_tma_kernel[(max(1, min(sm_budget, units)),)](
        TensorDescriptor(a, a_shape, a_strides, a_block),
        TensorDescriptor(b, b_shape, b_strides, b_block),
        TensorDescriptor(out, c_shape, c_strides, c_block),
        ws,
        lock,
        m,
        n,
        k,
        units,
        dp_tiles,
        split,
        k_per_split,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        A_COL_MAJOR=a_col,
        B_COL_MAJOR=b_col,
        ACCUMULATE=accumulate,
        EPILOGUE_SUBTILE=config.epilogue_subtile,
        SPLIT_TAIL=plan is not None,
        TRANSPOSE_C=config.swap_ab,
        INPUT_PRECISION=precision,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    LAUNCH_COUNTS["tma"] += 1
    return out


def _launch_ptr(a, b, out, accumulate, sm_budget, config: GemmConfig, precision: str) -> None:
    try:
        LAST_COMPILED["ptr"] = launch_ptr(a, b, out, accumulate, sm_budget, config, precision)
    except triton.runtime.errors.OutOfResources:
        # A config tuned for the TMA kernel may not fit the pointer kernel's shared memory.
        _warn_once(
            f"config {config.name} does not fit the pointer kernel; using {FALLBACK_CONFIG.name}"
        )
        LAST_COMPILED["ptr"] = launch_ptr(
            a, b, out, accumulate, sm_budget, FALLBACK_CONFIG, precision
        )
    LAUNCH_COUNTS["ptr"] += 1
