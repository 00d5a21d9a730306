"""The Triton kernels of ficco's all-reduce with epoch-valued flags (the protocol, the
workspace layout and the host side: ``ficco.kernels.allreduce_lamport``)."""

from __future__ import annotations

import triton
import triton.language as tl

from ficco.kernels.flags import _acquire_load, _globaltimer
from ficco.patterns.epilogues import MAX_FUSED_NORM_COLUMNS

#: epochs run 1 .. PERIOD, then wrap to 1: a multiple of 3, so the slot keeps cycling
EPOCH_PERIOD = 3 * 2**29
SLOTS = 3
PHASES_PER_SLOT = 2  # two-shot's reduce-scatter and all-gather; one-shot uses phase 0
#: most programs of one launch (the flags' last dimension)
MAX_PROGRAMS = 64
#: elements per block of the flat kernels
BLOCK = 1024
#: phase bits
PUSH, REDUCE, GATHER = 1, 2, 4
ONE_SHOT_PHASES = (PUSH, REDUCE)
TWO_SHOT_PHASES = (PUSH, REDUCE, GATHER)
#: the largest normalized row (elements) of the fused kernel: one row per program pass
MAX_NORM_COLUMNS = MAX_FUSED_NORM_COLUMNS
FP8_E4M3_MAX = 448.0

_PERIOD = tl.constexpr(EPOCH_PERIOD)


def next_epoch(prev: int) -> int:
    """The epoch after ``prev`` (the kernels' ``_next_epoch``, for hosts and tests)."""
    return prev % EPOCH_PERIOD + 1


def slot_of(epoch: int) -> int:
    return epoch % SLOTS


@triton.jit
def _next_epoch(prev):
    return prev % _PERIOD + 1


@triton.jit
def _row(slot, phase, src, WORLD: tl.constexpr):
    # the (slot, phase, source) row of the scratch / flags, as an int64 index
    return (slot * 2 + phase) * WORLD + src


@triton.jit
def _release_store(ptr, value, ON_GPU: tl.constexpr):
    if ON_GPU:
        tl.inline_asm_elementwise(
            "st.release.sys.global.b32 [$1], $2;\n\tmov.u32 $0, 0;",
            "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:
        tl.atomic_xchg(ptr, value, sem="release", scope="sys")


@triton.jit
def _signal(flag_ref, flag_offs, slot, phase, rank, pid, epoch, WORLD: tl.constexpr,
            MAXP: tl.constexpr, ON_GPU: tl.constexpr):  # fmt: skip
    # every thread's stores of this program done (CTA barrier), then the epoch into each
    # peer's flag [slot, phase, rank, pid] with release at system scope
    tl.debug_barrier()
    for d in tl.static_range(WORLD):
        if d != rank:
            flag = flag_ref + tl.load(flag_offs + d) + _row(slot, phase, rank, WORLD) * MAXP + pid
            _release_store(flag, epoch, ON_GPU)


@triton.jit
def _wait_epoch(flag_ptr, epoch, status_ptr, budget_ns, ON_GPU: tl.constexpr):
    # until the flag holds this call's epoch (acquire), or the wait gives up: on GPUs after
    # budget_ns on the clock, under the interpreter when the host watchdog sets status; an
    # earlier give-up of this launch (status set) ends every later wait at once. Every thread
    # spins and decides for itself (no CTA barrier inside the loop).
    val = _acquire_load(flag_ptr, ON_GPU)
    if val != epoch:
        if ON_GPU:
            start = _globaltimer()
        given_up = tl.load(status_ptr, volatile=True)
        while (val != epoch) & (given_up == 0):
            val = tl.load(flag_ptr, volatile=True)
            if ON_GPU:  # noqa: SIM102 - a constexpr branch: `start` exists only on GPUs
                if (val != epoch) & (_globaltimer() - start > budget_ns):
                    tl.store(status_ptr, 1)
            given_up = tl.load(status_ptr, volatile=True)
        val = _acquire_load(flag_ptr, ON_GPU)


@triton.jit
def _wait_sources(flag_ref, flag_offs, slot, phase, rank, pid, epoch, status_ptr, budget_ns,
                  WORLD: tl.constexpr, MAXP: tl.constexpr, ON_GPU: tl.constexpr):  # fmt: skip
    mine = flag_ref + tl.load(flag_offs + rank)
    for s in tl.static_range(WORLD):
        if s != rank:
            flag = mine + _row(slot, phase, s, WORLD) * MAXP + pid
            _wait_epoch(flag, epoch, status_ptr, budget_ns, ON_GPU)
    tl.debug_barrier()


@triton.jit(do_not_specialize=["rank"])  # every rank runs one binary
def _one_shot_kernel(
    src_ptr,  # [numel] this rank's input
    dst_ptr,  # [numel] the sum (may be src)
    numel,
    data_ref,  # private reference of the data dtype: scratch addresses are offsets from it
    scratch_offs,  # int64 [W]: each rank's scratch, in elements from data_ref
    flag_ref,  # private int32 reference
    flag_offs,  # int64 [W]: each rank's flags, in int32s from flag_ref
    epochs_ptr,  # int32 [MAXP], local
    status_ptr,  # int32 [1], local
    rank,
    cap,  # elements of one (slot, phase, source) row of the scratch
    budget_ns,
    WORLD: tl.constexpr,
    MAXP: tl.constexpr,
    BLOCK: tl.constexpr,
    PHASES: tl.constexpr,
    ON_GPU: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = _next_epoch(tl.load(epochs_ptr + pid))
    slot = (epoch % 3).to(tl.int64)
    offs0 = tl.arange(0, BLOCK).to(tl.int64)  # no int32 overflow in offsets
    blocks = tl.cdiv(numel, BLOCK)
    if PHASES & 1:  # push this program's blocks into every peer's row `rank`
        for blk in range(pid, blocks, nprog):
            offs = blk * BLOCK + offs0
            mask = offs < numel
            x = tl.load(src_ptr + offs, mask=mask)
            for d in tl.static_range(WORLD):
                if d != rank:
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 0, rank, WORLD) * cap
                    tl.store(peer + offs, x, mask=mask)
        _signal(flag_ref, flag_offs, slot, 0, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 2:  # every source's rows arrived: the rank-order sum
        _wait_sources(flag_ref, flag_offs, slot, 0, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        mine = data_ref + tl.load(scratch_offs + rank)
        for blk in range(pid, blocks, nprog):
            offs = blk * BLOCK + offs0
            mask = offs < numel
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    part = tl.load(src_ptr + offs, mask=mask, other=0.0)
                else:
                    part = tl.load(
                        mine + _row(slot, 0, s, WORLD) * cap + offs, mask=mask, other=0.0
                    )
                acc += part.to(tl.float32)
            tl.store(dst_ptr + offs, acc.to(dst_ptr.dtype.element_ty), mask=mask)
        tl.store(epochs_ptr + pid, epoch)


@triton.jit(do_not_specialize=["rank"])  # every rank runs one binary
def _two_shot_kernel(
    src_ptr, dst_ptr, numel, data_ref, scratch_offs, flag_ref, flag_offs, epochs_ptr,
    status_ptr, rank, cap, budget_ns,
    WORLD: tl.constexpr, MAXP: tl.constexpr, BLOCK: tl.constexpr, PHASES: tl.constexpr,
    ON_GPU: tl.constexpr,
):  # fmt: skip
    # arguments as _one_shot_kernel's; rank d owns slice d: elements [d*L, (d+1)*L) of numel
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = _next_epoch(tl.load(epochs_ptr + pid))
    slot = (epoch % 3).to(tl.int64)
    offs0 = tl.arange(0, BLOCK).to(tl.int64)  # no int32 overflow in offsets
    per = tl.cdiv(numel, WORLD)  # L: elements of a slice (the last ones short or empty)
    blocks = tl.cdiv(per, BLOCK)
    mine = data_ref + tl.load(scratch_offs + rank)
    if PHASES & 1:  # reduce-scatter: slice d of this rank's input to its owner d
        for blk in range(pid, blocks, nprog):
            local = blk * BLOCK + offs0  # offsets inside a slice
            for d in tl.static_range(WORLD):
                if d != rank:
                    glob = d * per + local
                    mask = (local < per) & (glob < numel)
                    x = tl.load(src_ptr + glob, mask=mask)
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 0, rank, WORLD) * cap
                    tl.store(peer + local, x, mask=mask)
        _signal(flag_ref, flag_offs, slot, 0, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 2:  # this rank's slice summed in rank order, then sent to every peer
        _wait_sources(flag_ref, flag_offs, slot, 0, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        for blk in range(pid, blocks, nprog):
            local = blk * BLOCK + offs0
            glob = rank * per + local
            mask = (local < per) & (glob < numel)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    part = tl.load(src_ptr + glob, mask=mask, other=0.0)
                else:
                    part = tl.load(
                        mine + _row(slot, 0, s, WORLD) * cap + local, mask=mask, other=0.0
                    )
                acc += part.to(tl.float32)
            reduced = acc.to(dst_ptr.dtype.element_ty)
            tl.store(dst_ptr + glob, reduced, mask=mask)
            for d in tl.static_range(WORLD):
                if d != rank:
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 1, rank, WORLD) * cap
                    tl.store(peer + local, reduced, mask=mask)
        _signal(flag_ref, flag_offs, slot, 1, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 4:  # all-gather: every peer's reduced slice into dst
        _wait_sources(flag_ref, flag_offs, slot, 1, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        for blk in range(pid, blocks, nprog):
            local = blk * BLOCK + offs0
            for s in tl.static_range(WORLD):
                if s != rank:
                    glob = s * per + local
                    mask = (local < per) & (glob < numel)
                    x = tl.load(mine + _row(slot, 1, s, WORLD) * cap + local, mask=mask)
                    tl.store(dst_ptr + glob, x, mask=mask)
        tl.store(epochs_ptr + pid, epoch)


@triton.jit
def _e4m3_rne(y):
    # y [BLOCK_N] fp32 within e4m3's range, rounded to the nearest e4m3 value (ties to even,
    # subnormal steps of 2^-9 below 2^-6) in fp32: scaled by 2^(3 - e) (e: its binade) to
    # [8, 16), rounded to an integer by the 1.5 * 2^23 trick, scaled back; the sign kept
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    up = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3 - e)
    down = ((124 + e) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3)
    r = ((tl.abs(y) * up + 12582912.0) - 12582912.0) * down
    return tl.where(bits < 0, -r, r)


@triton.jit
def _fp8_normed(y, scale_ptr, ON_GPU: tl.constexpr):
    # the normed row as stored in FP8 e4m3: y / scale, saturated at e4m3's largest. Under
    # the interpreter also rounded to e4m3 here: its fp32 -> e4m3 cast rounds ties up and
    # drops a carry into the exponent (Triton 3.9: 125.7 -> 64, 1.97 -> 1), so the cast
    # that follows is exact there, and the bits are the GPU's cvt.rn.satfinite's
    y = y / tl.load(scale_ptr)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if not ON_GPU:
        y = _e4m3_rne(y)
    return y


@triton.jit(do_not_specialize=["rank"])  # every rank runs one binary
def _one_shot_rms_norm_kernel(
    src_ptr,  # [rows, n] this rank's partial
    residual_ptr,  # [rows, n]
    weight_ptr,  # [n]
    normed_ptr,  # [rows, n]: rms_norm(new_residual) * weight (/ scale, as fp8)
    new_residual_ptr,  # [rows, n] (may be residual)
    scale_ptr,  # [1] fp32 (FP8 only)
    rows, n, eps,
    data_ref, scratch_offs, flag_ref, flag_offs, epochs_ptr, status_ptr, rank, cap, budget_ns,
    WORLD: tl.constexpr, MAXP: tl.constexpr, BLOCK_N: tl.constexpr, PHASES: tl.constexpr,
    FP8: tl.constexpr, ON_GPU: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = _next_epoch(tl.load(epochs_ptr + pid))
    slot = (epoch % 3).to(tl.int64)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)
    cmask = cols < n
    if PHASES & 1:
        for row in range(pid, rows, nprog):
            offs = row * n + cols
            x = tl.load(src_ptr + offs, mask=cmask)
            for d in tl.static_range(WORLD):
                if d != rank:
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 0, rank, WORLD) * cap
                    tl.store(peer + offs, x, mask=cmask)
        _signal(flag_ref, flag_offs, slot, 0, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 2:
        _wait_sources(flag_ref, flag_offs, slot, 0, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        mine = data_ref + tl.load(scratch_offs + rank)
        w = tl.load(weight_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        for row in range(pid, rows, nprog):
            offs = row * n + cols
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    part = tl.load(src_ptr + offs, mask=cmask, other=0.0)
                else:
                    part = tl.load(
                        mine + _row(slot, 0, s, WORLD) * cap + offs, mask=cmask, other=0.0
                    )
                acc += part.to(tl.float32)
            # vLLM's order: the all-reduced sum rounded, plus the residual, rounded
            summed = acc.to(new_residual_ptr.dtype.element_ty).to(tl.float32)
            res = tl.load(residual_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            new_res = (summed + res).to(new_residual_ptr.dtype.element_ty)
            tl.store(new_residual_ptr + offs, new_res, mask=cmask)
            x = new_res.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
            y = x * rstd * w
            if FP8:
                y = _fp8_normed(y, scale_ptr, ON_GPU)
            tl.store(normed_ptr + offs, y.to(normed_ptr.dtype.element_ty), mask=cmask)
        tl.store(epochs_ptr + pid, epoch)


@triton.jit(do_not_specialize=["rank"])  # every rank runs one binary
def _two_shot_rms_norm_kernel(
    src_ptr,  # [rows, n] this rank's partial
    residual_ptr,  # [rows, n]
    weight_ptr,  # [n]
    normed_ptr,  # [rows, n]: rms_norm(new_residual) * weight (/ scale, as fp8)
    new_residual_ptr,  # [rows, n] (may be residual)
    scale_ptr,  # [1] fp32 (FP8 only)
    rows, n, eps,
    data_ref, scratch_offs, flag_ref, flag_offs, epochs_ptr, status_ptr, rank, cap, budget_ns,
    WORLD: tl.constexpr, MAXP: tl.constexpr, BLOCK_N: tl.constexpr, PHASES: tl.constexpr,
    FP8: tl.constexpr, ON_GPU: tl.constexpr,
):  # fmt: skip
    # two-shot over whole rows: rank d owns rows [d*R, (d+1)*R) (R = ceil(rows / W), the
    # last slices short or empty). Phase 0 pushes slice d's rows to owner d (scratch row
    # i*n of (slot, 0, rank)); the owner sums its rows in rank order, adds its residual (the
    # residual is replicated: every rank's is the same), normalizes, stores both results and
    # pushes them to every peer (normed at i*n, the new residual at (R + i)*n of
    # (slot, 1, rank): 2 R n elements a row); phase 2 copies the peers' rows in. A slice row
    # i belongs to program i % nprog on every rank. FP8: the owner quantizes its normed rows
    # once and sends the e4m3 values in the scratch's dtype (exact in bf16, fp16 and fp32),
    # so every rank stores the owner's bits.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = _next_epoch(tl.load(epochs_ptr + pid))
    slot = (epoch % 3).to(tl.int64)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)
    cmask = cols < n
    per = tl.cdiv(rows, WORLD)
    mine = data_ref + tl.load(scratch_offs + rank)
    if PHASES & 1:  # reduce-scatter: slice d's rows of this rank's partial to their owner
        for i in range(pid, per, nprog):
            for d in tl.static_range(WORLD):
                if d != rank:
                    row = d * per + i
                    mask = cmask & (cols < (rows - row) * n)  # none past the last row
                    x = tl.load(src_ptr + row * n + cols, mask=mask)
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 0, rank, WORLD) * cap
                    tl.store(peer + i * n + cols, x, mask=mask)
        _signal(flag_ref, flag_offs, slot, 0, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 2:  # this rank's rows: the rank-order sum, the epilogue, sent to every peer
        _wait_sources(flag_ref, flag_offs, slot, 0, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        w = tl.load(weight_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        for i in range(pid, per, nprog):
            row = rank * per + i
            mask = cmask & (cols < (rows - row) * n)  # none past the last row
            offs = row * n + cols
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    part = tl.load(src_ptr + offs, mask=mask, other=0.0)
                else:
                    part = tl.load(
                        mine + _row(slot, 0, s, WORLD) * cap + i * n + cols, mask=mask, other=0.0
                    )
                acc += part.to(tl.float32)
            # the one-shot epilogue's arithmetic (vLLM's order)
            summed = acc.to(new_residual_ptr.dtype.element_ty).to(tl.float32)
            res = tl.load(residual_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            new_res = (summed + res).to(new_residual_ptr.dtype.element_ty)
            x = new_res.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
            y = x * rstd * w
            if FP8:
                y = _fp8_normed(y, scale_ptr, ON_GPU)
            y = y.to(normed_ptr.dtype.element_ty)
            tl.store(new_residual_ptr + offs, new_res, mask=mask)
            tl.store(normed_ptr + offs, y, mask=mask)
            if FP8:  # what the scratch carries: the e4m3 values, exact in its dtype
                y = y.to(tl.float32).to(new_res.dtype)
            for d in tl.static_range(WORLD):
                if d != rank:
                    peer = data_ref + tl.load(scratch_offs + d) + _row(slot, 1, rank, WORLD) * cap
                    tl.store(peer + i * n + cols, y, mask=mask)
                    tl.store(peer + (per + i) * n + cols, new_res, mask=mask)
        _signal(flag_ref, flag_offs, slot, 1, rank, pid, epoch, WORLD, MAXP, ON_GPU)
    if PHASES & 4:  # all-gather: every peer's rows of both results
        _wait_sources(flag_ref, flag_offs, slot, 1, rank, pid, epoch, status_ptr, budget_ns,
                      WORLD, MAXP, ON_GPU)  # fmt: skip
        for i in range(pid, per, nprog):
            for s in tl.static_range(WORLD):
                if s != rank:
                    # names of this block's own: a name assigned in phase 2's loop and again
                    # under this runtime `if` is yielded from it, and Triton 3.6 then reads
                    # phase 2's value where it does not dominate (FP8: a compile error at
                    # W >= 4, NaN rows at W = 2 on an H200)
                    peer_row = s * per + i
                    peer_mask = cmask & (cols < (rows - peer_row) * n)  # none past the last row
                    got = mine + _row(slot, 1, s, WORLD) * cap
                    got_normed = tl.load(got + i * n + cols, mask=peer_mask)
                    got_residual = tl.load(got + (per + i) * n + cols, mask=peer_mask)
                    # FP8: the owner's e4m3 values back to e4m3 (exact)
                    tl.store(
                        normed_ptr + peer_row * n + cols,
                        got_normed.to(tl.float32).to(normed_ptr.dtype.element_ty)
                        if FP8
                        else got_normed,
                        mask=peer_mask,
                    )
                    tl.store(new_residual_ptr + peer_row * n + cols, got_residual, mask=peer_mask)
        tl.store(epochs_ptr + pid, epoch)
