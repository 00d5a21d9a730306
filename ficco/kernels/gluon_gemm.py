"""A warp-specialized persistent GEMM for Hopper (sm_90), written in Gluon.

Triton's ``tl.dot`` kernels (`persistent`, `scaled`) run one instruction stream per program:
the same warps issue the TMA loads, the wgmmas, the FP8 promotion adds and the epilogue, so a
tile's epilogue and the next tile's first loads wait on each other, and Triton 3.6 cannot
express CUTLASS's ping-pong schedule (profiles/h200/fp8_gemm_notes.md). Gluon, Triton's
lower-level language, places each role in its own warps (the producer and the kernel here,
the consumers in `ficco.kernels.gluon_consumer`):

- a producer warp issues every TMA load of the program's tiles into a ring of ``STAGES``
  shared-memory slots (``ready[s]`` completes when slot s has landed, ``empty[s]`` when its
  consumer's wgmmas have read it);
- ``CONSUMERS`` = 1 (cooperative): one partition of ``CONSUMER_WARPS`` warps runs every tile;
  ``CONSUMERS`` = 2 (ping-pong): two four-warp partitions take alternate tiles, and a turn
  barrier makes each start its K loop only after the other has issued its last wgmma, so one
  runs its epilogue (scales, bf16 store) while the other keeps the tensor cores busy. The
  turns also keep a consumer from waiting on a slot more than one ring pass ahead (an
  mbarrier's phase parity could not tell the passes apart);
- shared tiles (``GluonGemmConfig.shared_tile``, FP8): two or three four-warp consumers take
  every tile, each its own 64 rows (128x128 in halves; 192x128 in thirds, whose A loads as
  three 64-row blocks a slot), and free each ring slot with their own arrivals (the slot's
  ``empty`` counts them). An eight-warp consumer synchronizes its two warpgroups before each
  arrival, so with FP8's promotion by hand (wait for the step's wgmmas, then add) both
  stopped the tensor cores at once; as separate consumers, one's adds run under the others'
  wgmmas (profiles/h200/NOTES_gemm.md: 0.79 of ``_scaled_mm`` with one 8-warp consumer,
  0.96 in halves (call AR), 1.00 with thirds (call AW));
- a tile ``block_n`` wide that is no power of two (Gluon's tensors are) runs as a main part
  and a tail (128 + 64 = 192, 256 + 64 = 320, 128 + 32 = 160; 16-bit only): each ring slot
  holds the tail's B columns too, each K step issues a second wgmma on the same A slot, and
  the tail is stored through its own buffer. These are cuBLAS's widths for shapes that
  power-of-two tiles fill badly (1024x3072: 128 tiles of 128x192 on 132 SMs, against 192 of
  128x128 or 96 of 128x256);
- swap-AB tiles (decode rows, 16-bit; `ficco.kernels.gluon_swap`): out^T = b^T a^T, the
  weight's 64 columns in wgmma's M and a's 16-32 rows in its N, stored transposed;
- split tail (``GluonGemmConfig.split_tail``, `SplitTail`): the last, partly filled wave's
  tiles in K ranges (`configs.split_plan`), each range's fp32 partial stored in the threads'
  register order, the last range to arrive (a gpu-scope acq_rel ticket) summing them in K
  order (deterministic) before the epilogue;
- fused (FP8, `ws_fused_kernel`, launched by `ficco.kernels.gluon_fused`): the same partitions
  over row chunks that land during the launch, the producer waiting on each chunk's flag
  before reading its rows (`gluon_ring._a_rows`), every tile's rows placed through a chunk
  table (the scale pointers' tuple carries it, so the partitions tell the modes apart).

Tiles go to programs round-robin (tile t on program t mod P, grouped by ``GROUP_M`` rows of
tiles as the persistent kernel groups them). Operands: ``a [M, K]`` row-major; 16-bit ``b``
``[K, N]`` row-major; FP8 ``b`` column-major (its transpose ``[N, K]`` row-major: FP8 wgmma
reads B K-major), with ``a_scale [M]`` (per row) and ``b_scale [N]`` (per column) applied to
the fp32 accumulator before the bf16 store, and partial sums promoted to fp32 every K step
(128 products in 128-deep tiles, cuBLASLt's default accumulation; 64 in 64-deep ones): by
hand after each step's wgmmas retire where the accumulator takes at most 64 registers a
thread, else through wgmma's ``max_num_imprecise_acc``; ``fast_accum`` promotes never
(``use_fast_accum``).

GPU only, written against Triton 3.6's Gluon (the GPU image's; `matmul`'s shipped picks are
keyed on that version). `scripts/bench_gluon_gemm.py` verifies every variant against an fp32
product and times it beside cuBLAS / ``torch._scaled_mm``; what it measured:
profiles/h200/NOTES_gemm.md (calls V-AP), profiles/h100/NOTES_gemm.md (runs 15-29).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ficco.kernels.gluon_configs import (  # noqa: F401 - the space, re-exported
    BF16_CONFIGS,
    FP8_CONFIGS,
    GluonGemmConfig,
    tail_plan,
)
from ficco.kernels.gluon_consumer import (
    _coop_consumer,
    _coop_consumer_fast,
    _pingpong_consumer_0,
    _pingpong_consumer_0_fast,
    _pingpong_consumer_1,
    _pingpong_consumer_1_fast,
    _third_consumer_0,
    _third_consumer_0_fast,
    _third_consumer_1,
    _third_consumer_1_fast,
    _third_consumer_2,
    _third_consumer_2_fast,
)
from ficco.kernels.gluon_ring import (
    A_BUFS,
    A_DESC,
    B_BUFS,
    B_DESC,
    B_TAIL_BUFS,
    B_TAIL_DESC,
    C_DESC,
    CHUNK_TABLE,
    FIRST_A_ROW,
    READY,
    _a_places,
    _a_rows,
    _copy_a,
    _free_slot,
    _grid,
    _tile_offsets,
    _unit_work,
    _units,
)
from ficco.kernels.gluon_swap import _swap_consumer, _swap_producer
from ficco.kernels.persistent import _lock_buffer, _tma_operand, default_sm_budget, tma_row_major

# the producer partition's warps and registers; the consumers take the rest of the
# register file (setmaxnreg moves registers between warpgroups)
PRODUCER_WARPS = 1
PRODUCER_REGS = 40
CONSUMER_REGS = 232
# 12 warps a program either way (8 consumer warps, or 4 + 4, and the producer's warpgroup):
# 168 x 384 threads fills the 64K-register file, and setmaxnreg gives the consumers 232
MAX_REGS = 168
# three consumers sharing a tile: 16 warps a program (4 + 4 + 4 and the producer's
# warpgroup), 128 registers each at launch; setmaxnreg gives two of the consumers 152
THIRDS_MAX_REGS = 128
THIRDS_CONSUMER_REGS = gl.constexpr(152)


@gluon.jit
def _producer(descs, ring, bars, scales, tails):
    """Every TMA load of the program's work units (tiles, or a split tail's K ranges of
    them), in order, each into the next free ring slot."""
    a_desc = descs[A_DESC]
    b_desc = descs[B_DESC]
    c_desc = descs[C_DESC]
    a_bufs = ring[A_BUFS]
    b_bufs = ring[B_BUFS]
    STAGES: gl.constexpr = bars[READY].type.shape[0]
    # A's tile in A_BLOCKS row blocks of a_desc's, each its own buffer of the slot (three row
    # parts: 192 rows, no power of two), else one
    A_BLOCKS: gl.constexpr = a_bufs.type.shape[0] // STAGES
    A_ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = A_ROWS * A_BLOCKS
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    # B's tile is [BLOCK_N, BLOCK_K] K-major (FP8), else [BLOCK_K, BLOCK_N]
    MAIN_N: gl.constexpr = b_desc.block_type.shape[0 if a_desc.dtype.primitive_bitwidth == 8 else 1]
    # a tail (16-bit only): B's columns [MAIN_N, MAIN_N + TAIL_N) of the tile, its own slots
    HAS_TAIL: gl.constexpr = len(ring) > B_TAIL_BUFS
    TAIL_N: gl.constexpr = descs[B_TAIL_DESC].block_type.shape[1] if HAS_TAIL else 0
    BLOCK_N: gl.constexpr = MAIN_N + TAIL_N
    B_K_MAJOR: gl.constexpr = a_desc.dtype.primitive_bitwidth == 8
    num_pid_m, num_pid_n, k_steps, rows = _grid(
        c_desc, a_desc.shape[1], scales, BLOCK_M, BLOCK_N, BLOCK_K
    )
    units = _units(num_pid_m * num_pid_n, tails)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    load_bytes: gl.constexpr = (
        a_desc.block_type.nbytes * A_BLOCKS
        + b_desc.block_type.nbytes
        + (descs[B_TAIL_DESC].block_type.nbytes if HAS_TAIL else 0)
    )
    # fused (`ficco.kernels.gluon_fused`): a chunk's rows are read once its flag is set; the
    # chunks seen arrive (a bit each): one acquire and fence per chunk, then its loads follow
    # them in program order
    FUSED: gl.constexpr = len(scales) > CHUNK_TABLE
    arrived = gl.to_tensor(0).to(gl.int64)
    # the chunk whose table entry was read last, and its first A row: fused, chunk 0's from
    # the arguments (a program's first tile is mostly in it: no table read before its wait)
    if FUSED:
        cached = gl.to_tensor(0)
        a_base = scales[FIRST_A_ROW].to(gl.int64)
    else:
        cached = gl.to_tensor(-1)
        a_base = gl.to_tensor(0).to(gl.int64)
    step = 0
    for unit in range(pid, units, programs):
        tile, k_lo, k_count = _unit_work(unit, k_steps, tails)
        off_m, off_n = _tile_offsets(tile, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N)
        if FUSED:
            # the rows' chunks placed (arithmetic) before the slot's wait; then the tile's
            # first B block in flight while the chunk table is read and the chunks waited
            # on: at a program's start that chain is a few global reads long (FP8: B
            # K-major). (Reading the table one unit ahead ran slower: 0.964 of the plain
            # launch against 0.977, H200 call BB.)
            places = _a_places(off_m, scales, A_ROWS, A_BLOCKS)
            slot, bar = _free_slot(bars, step, STAGES, load_bytes)
            tma.async_copy_global_to_shared(
                b_desc, [off_n, k_lo * BLOCK_K], bar, b_bufs.index(slot)
            )
            a_rows, arrived, cached, a_base = _a_rows(
                off_m, places, rows, scales, arrived, cached, a_base, A_ROWS, A_BLOCKS
            )
            for r in gl.static_range(A_BLOCKS):
                _copy_a(
                    a_desc, scales, a_rows[r], k_lo * BLOCK_K, bar,
                    a_bufs.index(slot * A_BLOCKS + r),
                )  # fmt: skip
            step += 1
            first_k = 1
        else:
            a_rows, arrived, cached, a_base = _a_rows(
                off_m, (), rows, scales, arrived, cached, a_base, A_ROWS, A_BLOCKS
            )
            first_k: gl.constexpr = 0
        for ki in range(first_k, k_count):
            k = (k_lo + ki) * BLOCK_K
            slot, bar = _free_slot(bars, step, STAGES, load_bytes)
            for r in gl.static_range(A_BLOCKS):
                _copy_a(a_desc, scales, a_rows[r], k, bar, a_bufs.index(slot * A_BLOCKS + r))
            if B_K_MAJOR:
                tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_bufs.index(slot))
            else:
                tma.async_copy_global_to_shared(b_desc, [k, off_n], bar, b_bufs.index(slot))
            if HAS_TAIL:
                tma.async_copy_global_to_shared(
                    descs[B_TAIL_DESC], [k, off_n + MAIN_N], bar, ring[B_TAIL_BUFS].index(slot)
                )
            step += 1


# a split tail's bounds are loop bounds: one compile for every shape (as `persistent`'s kernel)
_SPLIT_ARGS = ["dp_tiles", "split", "k_per_split"]


@gluon.jit(do_not_specialize=_SPLIT_ARGS)
def ws_gemm_kernel(
    a_desc,
    b_desc,
    c_desc,
    b_tail_desc,
    c_tail_desc,
    a_scale_ptr,
    b_scale_ptr,
    ws_ptr,
    lock_ptr,
    dp_tiles,
    split,
    k_per_split,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    TAIL: gl.constexpr,
    SWAP_AB: gl.constexpr,
    SPLIT_TAIL: gl.constexpr,
):
    _ws_gemm(
        a_desc, b_desc, c_desc, b_tail_desc, c_tail_desc, (a_scale_ptr, b_scale_ptr),
        _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL),
        STAGES, CONSUMERS, PRODUCER_REGS, CONSUMER_REGS, FAST_ACCUM, TAIL, SWAP_AB,
    )  # fmt: skip


# the chunk divisor's multiplier and chunk 0's entry: one compile whatever their values
@gluon.jit(do_not_specialize=[*_SPLIT_ARGS, "chunk_multiplier", "first_a_row", "first_waits"])
def ws_fused_kernel(
    a_desc,
    b_desc,
    c_desc,
    a_scale_ref,
    b_scale_ptr,
    chunk_table,
    flag_ref,
    status_ptr,
    chunk_rows,
    chunks,
    budget_ns,
    chunk_multiplier,
    first_a_row,
    first_flag,
    first_waits,
    a2_desc,
    ws_ptr,
    lock_ptr,
    dp_tiles,
    split,
    k_per_split,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    SPLIT_TAIL: gl.constexpr,
):
    # FP8 over row chunks that wait on flags (`ficco.kernels.gluon_fused`): the chunk table
    # and the rest after the scales (`gluon_ring.CHUNK_COLS`)
    scales = (
        a_scale_ref, b_scale_ptr, chunk_table, flag_ref, status_ptr, chunk_rows, chunks,
        budget_ns, chunk_multiplier, first_a_row, first_flag, first_waits, a2_desc,
    )  # fmt: skip
    _ws_gemm(
        a_desc, b_desc, c_desc, b_desc, c_desc, scales,
        _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL),
        STAGES, CONSUMERS, PRODUCER_REGS, CONSUMER_REGS, FAST_ACCUM, False, False,
    )  # fmt: skip


@gluon.jit
def _tails(ws_ptr, lock_ptr, dp_tiles, split, k_per_split, SPLIT_TAIL: gl.constexpr):
    """A split tail's arguments as the partitions take them (`gluon_ring._units`): the fp32
    partials' workspace, the tail tiles' arrival counters, the whole tiles, K ranges a tail
    tile, K steps a range; without a split tail, none (the partitions tell by the length)."""
    if SPLIT_TAIL:  # noqa: SIM108 - a constexpr branch
        tails = (ws_ptr, lock_ptr, dp_tiles, split, k_per_split)
    else:
        tails = ()
    return tails


@gluon.jit
def _ws_gemm(
    a_desc,
    b_desc,
    c_desc,
    b_tail_desc,
    c_tail_desc,
    scales,
    tails,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FAST_ACCUM: gl.constexpr,
    TAIL: gl.constexpr,
    SWAP_AB: gl.constexpr,
):
    # three consumers share each tile (192 rows): A loads as three 64-row blocks a slot
    A_BLOCKS: gl.constexpr = 3 if CONSUMERS == 3 else 1
    a_bufs = gl.allocate_shared_memory(
        a_desc.dtype, [STAGES * A_BLOCKS] + a_desc.block_type.shape, a_desc.layout
    )
    b_bufs = gl.allocate_shared_memory(
        b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # shared tiles (c's blocks one consumer's part of the tile's rows; swap-AB's are other
    # blocks): each consumer frees each slot
    TILE_M: gl.constexpr = a_desc.block_type.shape[0] * A_BLOCKS
    readers: gl.constexpr = 1 if SWAP_AB else TILE_M // c_desc.block_type.shape[0]
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=readers)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    # TAIL: the tile's columns past the power-of-two main part (b_tail_desc, c_tail_desc);
    # the partitions tell from the tuples' lengths (without, the tail descriptors are unused)
    if TAIL:
        bt_bufs = gl.allocate_shared_memory(
            b_tail_desc.dtype, [STAGES] + b_tail_desc.block_type.shape, b_tail_desc.layout
        )
        descs = (a_desc, b_desc, c_desc, b_tail_desc, c_tail_desc)
        ring = (a_bufs, b_bufs, bt_bufs)
    else:
        descs = (a_desc, b_desc, c_desc)
        ring = (a_bufs, b_bufs)
    bars = (ready, empty, turns)
    # (constexprs passed to partitions arrive as tensors in Triton 3.6: each partition takes
    # only values and derives its constants from their types, and each role and accumulation
    # is its own consumer function, picked here at compile time)
    args = (descs, ring, bars, scales, tails)
    if SWAP_AB:
        gl.warp_specialize([(_swap_consumer, args), (_swap_producer, args)], [1], [PRODUCER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_third_consumer_0_fast if FAST_ACCUM else _third_consumer_0, args),
                (_third_consumer_1_fast if FAST_ACCUM else _third_consumer_1, args),
                (_third_consumer_2_fast if FAST_ACCUM else _third_consumer_2, args),
                (_producer, args),
            ],
            [4, 4, 1],
            [THIRDS_CONSUMER_REGS, THIRDS_CONSUMER_REGS, PRODUCER_REGS],
        )
    elif CONSUMERS == 1:
        gl.warp_specialize(
            [(_coop_consumer_fast if FAST_ACCUM else _coop_consumer, args), (_producer, args)],
            [1],
            [PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_pingpong_consumer_0_fast if FAST_ACCUM else _pingpong_consumer_0, args),
                (_pingpong_consumer_1_fast if FAST_ACCUM else _pingpong_consumer_1, args),
                (_producer, args),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )


_GL_DTYPES = {
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
    torch.float8_e4m3fn: gl.float8e4nv,
    torch.float8_e5m2: gl.float8e5,
}


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A row-major view's descriptor, with the shape and strides TMA sees (`_tma_operand`:
    a size-1 dimension's unused stride made aligned)."""
    shape, strides, _ = _tma_operand(t)
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, shape, strides, block, layout)


def ws_gemm_launcher(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    cfg: GluonGemmConfig,
    *,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    programs: int | None = None,
    fast_accum: bool = False,
) -> Callable[[], None]:
    """Checks the operands and builds the descriptors once; the returned call launches
    ``out [M, N] = a [M, K] @ b [K, N]`` on the warp-specialized kernel. FP8 operands take
    ``out = (a @ b) * a_scale[:, None] * b_scale[None, :]`` with ``b`` column-major, and
    ``fast_accum`` sums their products without fp32 promotion (as ``use_fast_accum``)."""
    if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
        raise ValueError("a, b, out: 2-D tensors")
    m, k = a.shape
    k2, n = b.shape
    if k2 != k or tuple(out.shape) != (m, n):
        raise ValueError(f"shapes: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
    if a.dtype not in _GL_DTYPES or b.dtype != a.dtype:
        raise ValueError(
            f"dtypes: a {a.dtype}, b {b.dtype} (one of {sorted(map(str, _GL_DTYPES))})"
        )
    fp8 = a.element_size() == 1
    if fast_accum and not fp8:
        raise ValueError("fast_accum: FP8 inputs only (16-bit products are summed in fp32)")
    if fp8 and out.dtype != torch.bfloat16:
        raise ValueError(f"out: FP8 products are stored bf16, not {out.dtype}")
    if not fp8 and out.dtype != a.dtype:
        raise ValueError(f"out: {out.dtype} for {a.dtype} inputs (the inputs' dtype)")
    cfg.check(a.element_size())
    for name, t in (("a", a), ("out", out)):
        if not tma_row_major(t):
            raise ValueError(f"{name}: a row-major view, 16-byte aligned rows and base (TMA)")
    b_k_major = tma_row_major(b.t())
    if cfg.swap_ab and not tma_row_major(b):
        raise ValueError("b: a swap-AB tile reads a row-major [K, N] b (TMA)")
    if not cfg.swap_ab and (fp8 != b_k_major or (not fp8 and not tma_row_major(b))):
        raise ValueError(
            "b: FP8 wgmma reads B K-major (pass the transpose of a row-major [N, K]); "
            "16-bit b is a row-major [K, N]; 16-byte aligned rows and base (TMA)"
        )
    if fp8 != (a_scale is not None and b_scale is not None):
        raise ValueError("scales: FP8 operands take a_scale [M] and b_scale [N], 16-bit none")
    if fp8 and (
        a_scale.numel() != m
        or b_scale.numel() != n
        or a_scale.dtype != torch.float32
        or b_scale.dtype != torch.float32
    ):
        raise ValueError(f"scales: fp32 a_scale [{m}] and b_scale [{n}]")
    if cfg.swap_ab:
        # out^T [N, M] = b^T [N, K] @ a^T [K, M]: the kernel's A is b's [K, block_m] blocks
        # (read MN-major), its B a's [block_n, K] rows (read K-major), its C out's
        # [block_n, block_m] blocks (stored transposed)
        a_desc = _desc(b, [cfg.block_k, cfg.block_m])
        b_desc = _desc(a, [cfg.block_n, cfg.block_k])
        c_desc = bt_desc = ct_desc = _desc(out, [cfg.block_n, cfg.block_m])
        tiles = triton.cdiv(n, cfg.block_m) * triton.cdiv(m, cfg.block_n)
    else:
        a_desc, b_desc, c_desc, bt_desc, ct_desc = _descs(a, b, out, cfg, b_k_major)
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if programs is None:
        programs = default_sm_budget(a.device)
    # 16-bit inputs: the scale pointers are never read
    sa = a_scale.reshape(-1) if fp8 else out
    sb = b_scale.reshape(-1) if fp8 else out
    split = SplitTail.of(cfg, m, n, k, programs, out)
    grid = (min(programs, split.units(tiles)),)
    kernel = ws_gemm_kernel[grid]
    max_regs = THIRDS_MAX_REGS if cfg.consumers == 3 else MAX_REGS

    def launch() -> None:
        kernel(
            a_desc, b_desc, c_desc, bt_desc, ct_desc, sa, sb, *split.args(),
            STAGES=cfg.stages, CONSUMERS=cfg.consumers, PRODUCER_REGS=PRODUCER_REGS,
            CONSUMER_REGS=CONSUMER_REGS, FAST_ACCUM=fast_accum, TAIL=cfg.tail_n > 0,
            SWAP_AB=cfg.swap_ab, SPLIT_TAIL=split.plan is not None, num_warps=cfg.consumer_warps,
            maxnreg=max_regs,
        )  # fmt: skip

    return launch


class SplitTail:
    """A launch's split tail (`GluonGemmConfig.split_tail`, `tail_plan`): the plan, the fp32
    partials' workspace [tail tiles, split, block_m, block_n], and the kernel's arguments
    (workspace, arrival counters, whole tiles, K ranges a tail tile, K steps a range). The
    counters are zero between launches (the last arriver resets its own): the launching
    stream's (`persistent._lock_buffer`, read at each launch), or the launch's own
    (`own_counters`: a prepared launch that a CUDA graph may capture)."""

    def __init__(self, plan, workspace: torch.Tensor, counters: int, owned) -> None:
        self.plan = plan
        self.workspace = workspace
        self.counters = counters
        self.owned = owned

    @classmethod
    def of(
        cls, cfg: GluonGemmConfig, m: int, n: int, k: int, programs: int, out: torch.Tensor,
        own_counters: bool = False,
    ) -> SplitTail:  # fmt: skip
        plan = tail_plan(cfg, m, n, k, programs)
        if plan is None:
            return cls(None, out, 0, None)
        workspace = torch.empty(
            max(1, plan.tail_tiles * plan.split * cfg.block_m * cfg.block_n),
            dtype=torch.float32,
            device=out.device,
        )
        # each consumer sharing a tile counts its own rows' K ranges
        counters = plan.tail_tiles * (cfg.block_m // cfg.rows_per_consumer)
        owned = (
            torch.zeros(counters, dtype=torch.int32, device=out.device) if own_counters else None
        )
        return cls(plan, workspace, counters, owned)

    def units(self, tiles: int) -> int:
        """The launch's work units: ``tiles``, or the split's whole tiles and K ranges."""
        return self.plan.units if self.plan else tiles

    def args(self) -> tuple:
        if self.plan is None:  # never read: the kernel compiles without a split tail
            return (self.workspace, self.workspace, 0, 0, 0)
        locks = self.owned
        if locks is None:
            locks = _lock_buffer(self.workspace.device, self.counters)
        plan = self.plan
        return (self.workspace, locks, plan.dp_tiles, plan.split, plan.k_per_split)


def _descs(a, b, out, cfg: GluonGemmConfig, b_k_major: bool) -> tuple:
    """The descriptors of ``out = a @ b`` in cfg's tiles: a, b (K-major for FP8), out, and a
    tail's B columns and store (16-bit only, `GluonGemmConfig.check`; else b's and out's)."""
    # three consumers sharing a tile: A in 64-row blocks (192 is no power of two)
    a_rows = cfg.rows_per_consumer if cfg.consumers == 3 else cfg.block_m
    a_desc = _desc(a, [a_rows, cfg.block_k])
    if b_k_major:
        b_desc = _desc(b.t(), [cfg.block_n, cfg.block_k])
    else:
        b_desc = _desc(b, [cfg.block_k, cfg.main_n])
    # each consumer stores its own rows: with shared tiles, its part of the tile's
    c_desc = _desc(out, [cfg.rows_per_consumer, cfg.main_n // (2 if cfg.split_epilogue else 1)])
    bt_desc = _desc(b, [cfg.block_k, cfg.tail_n]) if cfg.tail_n else b_desc
    ct_desc = _desc(out, [cfg.block_m, cfg.tail_n]) if cfg.tail_n else c_desc
    return a_desc, b_desc, c_desc, bt_desc, ct_desc


def ws_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    cfg: GluonGemmConfig,
    *,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    programs: int | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``ws_gemm_launcher``'s launch, once; returns ``out``."""
    ws_gemm_launcher(
        a, b, out, cfg, a_scale=a_scale, b_scale=b_scale, programs=programs, fast_accum=fast_accum
    )()
    return out
