"""Embedding-bag pooling in one Triton launch: sum or mean over variable-length bags of rows
of one or several tables, stored into any row views, local or peer-mapped, with per-chunk
flags (the fused pool-and-send of ``emb_a2a``'s ``+fused`` schedules).

Inputs are EmbeddingBag's layout, per table (:class:`BagTable`): ``weight [rows, D]``,
``indices [nnz]`` (int32 or int64) and ``offsets`` (bag ``b`` is
``indices[offsets[b]:offsets[b + 1]]``, the last bag ending at ``nnz`` unless
``include_last_offset``). FBGEMM's table-batched layout (one ``indices``, offsets
``[T * B + 1]`` table-major) is one table whose indices are rows of the stacked weights
(emb_a2a's layout), or T tables whose offsets are slices of one tensor. Every table shares D
and the weights' dtype (bf16, fp16 or fp32); accumulation is fp32; a mean divides by the bag's
length, and an empty bag pools to zeros (as ``torch.nn.functional.embedding_bag``).

What is stored where is a list of segments (:class:`PoolSegmentViews`): bags
``[start, start + count)`` of one table, pooled into ``out [count, D]`` (any row stride: a
column block of ``[B, T * D]``, or a block of a peer's receive buffer), and optionally a flag.
:func:`pool_bags` stores every table into ``[B, T, D]``; the fused all-to-all stores each
destination rank's block into that rank's receive buffer.

The kernel: program ``p`` pools ``BLOCK_B`` consecutive bags of one segment into a
``[BLOCK_B, D]`` fp32 accumulator. It loads the bags' lengths, then walks positions
``0 .. max length`` ``UNROLL`` at a time: ``[BLOCK_B, UNROLL]`` indices, then the
``[BLOCK_B, UNROLL, D]`` rows they name, all issued before the sum, so a program has
``BLOCK_B * UNROLL`` row gathers in flight (random row reads are latency-bound: bytes in flight
set the rate). With D a multiple of 16 the row loads are 16-byte vectors (PTX ``ld.global.v4``
for bf16 and fp32, seen compiling for sm_90). Programs are numbered segment by segment in the
order given, so segments complete roughly in that order.

Flags: the segments naming the same 1-element int32 ``signal`` form one chunk. After its
stores, every program of a chunk counts itself on the chunk's counter (system-scope acq_rel,
after a barrier so every thread's stores are issued); the chunk's last program sets the flag to
1 with a system-scope release, so a peer that reads the flag with acquire semantics sees every
row, and zeroes the counter, so the next launch (or a CUDA graph's replay) needs no memset. A
segment of zero bags still has one program, which stores nothing and counts, so its flag is
set.

Operands are addressed as element offsets from private reference tensors (one per role), as
in ``ficco.kernels.fused``: one launch reads any number of tables and writes any number of
buffers (a flat address space on GPUs; raw host addresses under the interpreter), and no
shared buffer is a launch argument (the interpreter copies every argument's storage back after
a launch, which would undo a peer's concurrent stores).

Measured on one H100 (``profiles/h100/embedding_pool.json``): over the 26 MLPerf DLRM-DCNv2
tables the launch gathers rows at 2.3-2.9 TB/s (bf16, B >= 8192), 3.4x the geomean speed of
PyTorch's ``embedding_bag`` (the faster of one call per table and one call over the stacked
tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

from ficco.kernels.flags import _load, _offset
from ficco.kernels.persistent import INTERPRETER, LAUNCH_COUNTS

__all__ = ["BagTable", "EmbeddingPool", "PoolConfig", "PoolSegmentViews", "pool_bags"]

Mode = Literal["sum", "mean"]
MODES = ("sum", "mean")
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
#: int64 fields per table (``table_ptr``): weight offset, weight row stride, indices offset,
#: offsets offset, number of offsets, nnz
_TABLE_COLS = 6
#: int64 fields per segment (``segment_ptr``): table, first bag, bags, out offset, out row stride,
#: chunk (-1: no flag), first program
_SEGMENT_COLS = 7


@triton.jit
def _pool_kernel(
    w_ref,  # every table's weight is w_ref + offset: [rows_t, D], row stride per table
    idx_ref,  # every table's indices are idx_ref + offset (int32 or int64)
    off_ref,  # every table's offsets are off_ref + offset (the indices' dtype)
    out_ref,  # every segment's output is out_ref + offset: [bags, D], row stride per segment
    flag_ref,  # int32: every flag is flag_ref + offset
    table_ptr,  # int64 [tables, TABLE_COLS] (module docstring)
    segment_ptr,  # int64 [segments, SEGMENT_COLS]
    chunk_ptr,  # int64 [chunks, 2]: flag offset, programs of the chunk
    prog_segment_ptr,  # int32 [programs]: the segment of each program
    count_ptr,  # int32 [chunks]: programs stored per chunk; zero between launches
    D,
    MEAN: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UNROLL: tl.constexpr,
    W_ALIGN: tl.constexpr,  # every weight offset and row stride is a multiple of this
    OUT_ALIGN: tl.constexpr,  # every output offset and row stride is a multiple of this
    SIGNAL: tl.constexpr,  # some segment has a flag
    TABLE_COLS: tl.constexpr,
    SEGMENT_COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    segment = tl.load(prog_segment_ptr + pid)
    row = segment_ptr + segment * SEGMENT_COLS
    table = tl.load(row)
    first = tl.load(row + 1)
    bags = tl.load(row + 2)
    out_off = tl.load(row + 3)
    out_stride = tl.load(row + 4)
    prog_start = tl.load(row + 6)
    trow = table_ptr + table * TABLE_COLS
    w_off = tl.load(trow)
    w_stride = tl.load(trow + 1)
    idx_base = idx_ref + tl.load(trow + 2)
    off_base = off_ref + tl.load(trow + 3)
    n_offsets = tl.load(trow + 4)
    nnz = tl.load(trow + 5)

    offs_b = (pid - prog_start) * BLOCK_B + tl.arange(0, BLOCK_B).to(tl.int64)  # bag in segment
    bag = first + offs_b
    mask_b = offs_b < bags
    start = tl.load(off_base + bag, mask=mask_b, other=0).to(tl.int64)
    # the bag's end: the next offset, or nnz after the last offset
    end = tl.load(off_base + bag + 1, mask=mask_b & (bag + 1 < n_offsets), other=nnz)
    lengths = tl.where(mask_b, end.to(tl.int64) - start, 0)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    offs_u = tl.arange(0, UNROLL)
    acc = tl.zeros((BLOCK_B, BLOCK_D), dtype=tl.float32)
    for j in range(0, tl.max(lengths, axis=0), UNROLL):
        pos = j + offs_u  # [UNROLL]
        live = pos[None, :] < lengths[:, None]  # [BLOCK_B, UNROLL]
        idx = tl.load(idx_base + start[:, None] + pos[None, :], mask=live, other=0)
        # hint (host-checked): every row starts W_ALIGN-aligned, so the loads vectorize
        row_off = tl.multiple_of(idx.to(tl.int64) * w_stride + w_off, [W_ALIGN, W_ALIGN])
        rows = tl.load(
            w_ref + row_off[:, :, None] + offs_d[None, None, :],
            mask=live[:, :, None] & mask_d[None, None, :],
            other=0.0,
        )  # [BLOCK_B, UNROLL, BLOCK_D]
        acc += tl.sum(rows.to(tl.float32), axis=1)
    if MEAN:
        acc = acc / tl.maximum(lengths, 1).to(tl.float32)[:, None]
    out_rows = tl.multiple_of(out_off + offs_b * out_stride, OUT_ALIGN)
    tl.store(
        out_ref + out_rows[:, None] + offs_d[None, :],
        acc.to(out_ref.dtype.element_ty),
        mask=mask_b[:, None] & mask_d[None, :],
    )
    if SIGNAL:
        chunk = tl.load(row + 5)
        if chunk >= 0:
            # every thread's stores are issued before the count; the chunk's last program
            # publishes them all with one system-scope release (cumulative)
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + chunk, 1, sem="acq_rel", scope="sys")
            crow = chunk_ptr + chunk * 2
            if done == tl.load(crow + 1) - 1:
                tl.store(count_ptr + chunk, 0)  # the last counter access of this launch
                tl.atomic_xchg(flag_ref + tl.load(crow), 1, sem="release", scope="sys")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The kernel's tile: bags per program, positions gathered per step, warps."""

    block_bags: int = 32
    unroll: int = 4
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_bags", "unroll", "num_warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
            if value & (value - 1):
                raise ValueError(f"{name}: must be a power of two, got {value}")


#: the default tile: the fastest of the H100 sweep (``scripts/bench_embedding_pool.py``, 26
#: DLRM-DCNv2 tables at B = 16384) for bf16, and within 2% of the fastest for fp32
DEFAULT_CONFIG = PoolConfig(block_bags=16, unroll=2, num_warps=4)
#: small tiles: the interpreter's cost grows with the tile
INTERPRETER_CONFIG = PoolConfig(block_bags=4, unroll=2, num_warps=1)


@dataclass(frozen=True, slots=True)
class BagTable:
    """One table's lookups in EmbeddingBag's layout (module docstring)."""

    weight: torch.Tensor  # [rows, D]
    indices: torch.Tensor  # [nnz] int32 or int64
    offsets: torch.Tensor  # [B] (or [B + 1] with include_last_offset), the indices' dtype
    include_last_offset: bool = False

    @property
    def bags(self) -> int:
        return self.offsets.numel() - int(self.include_last_offset)


@dataclass(frozen=True, slots=True)
class PoolSegmentViews:
    """Bags ``[start, start + count)`` of table ``table``, pooled into ``out [count, D]``
    (unit column stride; on this rank or a peer-mapped view); ``signal`` (a 1-element int32
    view, or None) is set to 1 once every segment naming it is stored (those segments are
    one chunk)."""

    table: int
    start: int
    count: int
    out: torch.Tensor
    signal: torch.Tensor | None = None


def _alignment(values: Sequence[int], element_size: int) -> int:
    """The largest power of two, up to 16 bytes' worth of elements, dividing every value."""
    align = max(1, 16 // element_size)
    while align > 1 and any(v % align for v in values):
        align //= 2
    return align


def _check_tables(tables: Sequence[BagTable]) -> tuple[int, torch.dtype, torch.dtype]:
    """(D, weight dtype, index dtype) shared by every table; ValueError naming the field."""
    if not tables:
        raise ValueError("tables: needs at least one table")
    w0, i0 = tables[0].weight, tables[0].indices
    for t, tab in enumerate(tables):
        w, idx, off = tab.weight, tab.indices, tab.offsets
        if w.dim() != 2 or w.stride(1) != 1:
            raise ValueError(
                f"tables[{t}].weight: must be [rows, D] with unit column stride, got shape "
                f"{tuple(w.shape)} strides {w.stride()}"
            )
        if w.dtype not in WEIGHT_DTYPES:
            raise ValueError(
                f"tables[{t}].weight: dtype must be one of {WEIGHT_DTYPES}, got {w.dtype}"
            )
        if w.shape[1] != w0.shape[1] or w.dtype != w0.dtype:
            raise ValueError(
                f"tables[{t}].weight: every table must share D and dtype ({w0.shape[1]}, "
                f"{w0.dtype}), got ({w.shape[1]}, {w.dtype})"
            )
        for name, x in (("indices", idx), ("offsets", off)):
            if x.dim() != 1 or (x.numel() > 1 and x.stride(0) != 1):
                raise ValueError(f"tables[{t}].{name}: must be 1-D and contiguous")
            if x.dtype != i0.dtype or x.dtype not in INDEX_DTYPES:
                raise ValueError(
                    f"tables[{t}].{name}: dtype must be int32 or int64 and shared by every "
                    f"table's indices and offsets ({i0.dtype}), got {x.dtype}"
                )
            if x.device != w0.device or w.device != w0.device:
                raise ValueError(f"tables[{t}].{name}: every tensor must be on {w0.device}")
        if tab.bags < 0:
            raise ValueError(f"tables[{t}].offsets: include_last_offset needs at least 1 offset")
    return w0.shape[1], w0.dtype, i0.dtype


class EmbeddingPool:
    """One pooling launch, prepared once (tables on the device, so a CUDA graph can capture
    it) and issued by calling it: every segment's bags pooled into its ``out``, flags set
    (module docstring). ``mode``: 'sum' or 'mean'. ``config``: the tile (default
    :data:`DEFAULT_CONFIG` on GPUs, :data:`INTERPRETER_CONFIG` under the interpreter)."""

    def __init__(
        self,
        tables: Sequence[BagTable],
        segments: Sequence[PoolSegmentViews],
        *,
        mode: Mode = "sum",
        config: PoolConfig | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        if not segments:
            raise ValueError("segments: needs at least one segment")
        d, w_dtype, i_dtype = _check_tables(tables)
        out_dtype = segments[0].out.dtype
        device = tables[0].weight.device
        for c, ch in enumerate(segments):
            if not 0 <= ch.table < len(tables):
                raise ValueError(
                    f"segments[{c}].table: must be in [0, {len(tables)}), got {ch.table}"
                )
            bags = tables[ch.table].bags
            if ch.start < 0 or ch.count < 0 or ch.start + ch.count > bags:
                raise ValueError(
                    f"segments[{c}]: bags [{ch.start}, {ch.start + ch.count}) must lie in table "
                    f"{ch.table}'s [0, {bags})"
                )
            out = ch.out
            if (
                out.dim() != 2
                or tuple(out.shape) != (ch.count, d)
                or (d > 1 and out.stride(1) != 1)
            ):
                raise ValueError(
                    f"segments[{c}].out: must be [count, D] = [{ch.count}, {d}] with unit column "
                    f"stride, got shape {tuple(out.shape)} strides {out.stride()}"
                )
            if out.dtype != out_dtype or out.dtype not in WEIGHT_DTYPES:
                raise ValueError(
                    f"segments[{c}].out: dtype must be one of {WEIGHT_DTYPES} and shared by every "
                    f"segment ({out_dtype}), got {out.dtype}"
                )
            if out.device != device:
                raise ValueError(f"segments[{c}].out: must be on {device}, got {out.device}")
            sig = ch.signal
            if sig is not None and (sig.dtype != torch.int32 or sig.numel() != 1):
                raise ValueError(f"segments[{c}].signal: must be a 1-element int32 view")
        self.tables, self.segments, self.mode, self.d = list(tables), list(segments), mode, d
        self.config = config or (INTERPRETER_CONFIG if INTERPRETER else DEFAULT_CONFIG)
        # private references: every operand is an offset from these (module docstring)
        self.w_ref = torch.empty(1, dtype=w_dtype, device=device)
        self.idx_ref = torch.empty(1, dtype=i_dtype, device=device)
        self.out_ref = torch.empty(1, dtype=out_dtype, device=device)
        self.flag_ref = torch.zeros(1, dtype=torch.int32, device=device)
        table_rows = [
            [
                _offset(t.weight, self.w_ref),
                t.weight.stride(0),
                _offset(t.indices, self.idx_ref),
                _offset(t.offsets, self.idx_ref),
                t.offsets.numel(),
                t.indices.numel(),
            ]
            for t in self.tables
        ]
        self.w_align = _alignment([v for r in table_rows for v in r[:2]], self.w_ref.element_size())
        self.table = torch.tensor(table_rows, dtype=torch.int64, device=device)
        self._tabulate(self.config)

    def _tabulate(self, config: PoolConfig) -> None:
        """The segment and chunk tables and the program -> segment map for ``config``."""
        device = self.w_ref.device
        chunks: dict[int, int] = {}  # flag address -> chunk
        chunk_rows: list[list[int]] = []
        segment_rows, prog_segment, out_values = [], [], []
        for c, ch in enumerate(self.segments):
            programs = max(1, triton.cdiv(ch.count, config.block_bags))
            chunk = -1
            if ch.signal is not None:
                chunk = chunks.setdefault(ch.signal.data_ptr(), len(chunks))
                if chunk == len(chunk_rows):
                    chunk_rows.append([_offset(ch.signal, self.flag_ref), 0])
                chunk_rows[chunk][1] += programs
            out_off = _offset(ch.out, self.out_ref)
            stride = ch.out.stride(0) if ch.count > 1 else self.d
            segment_rows.append(
                [ch.table, ch.start, ch.count, out_off, stride, chunk, len(prog_segment)]
            )
            out_values += [out_off, stride]
            prog_segment += [c] * programs
        self.config = config
        self.out_align = _alignment(out_values, self.out_ref.element_size())
        self.segment_table = torch.tensor(segment_rows, dtype=torch.int64, device=device)
        # one unused row where no segment has a flag: the kernel never reads it then
        self.chunk_table = torch.tensor(chunk_rows or [[0, 0]], dtype=torch.int64, device=device)
        self.counts = torch.zeros(max(1, len(chunk_rows)), dtype=torch.int32, device=device)
        self.prog_segment = torch.tensor(prog_segment, dtype=torch.int32, device=device)
        self.signals = len(chunk_rows)
        self.grid = (len(prog_segment),)

    def _launch(self, warm: bool = False) -> None:
        cfg = self.config
        args = (
            self.w_ref, self.idx_ref, self.idx_ref, self.out_ref, self.flag_ref, self.table,
            self.segment_table, self.chunk_table, self.prog_segment, self.counts, self.d,
        )  # fmt: skip
        meta = dict(
            MEAN=self.mode == "mean", BLOCK_B=cfg.block_bags,
            BLOCK_D=triton.next_power_of_2(self.d), UNROLL=cfg.unroll, W_ALIGN=self.w_align,
            OUT_ALIGN=self.out_align, SIGNAL=self.signals > 0, TABLE_COLS=_TABLE_COLS,
            SEGMENT_COLS=_SEGMENT_COLS, num_warps=cfg.num_warps, num_stages=1,
        )  # fmt: skip
        if warm:
            _load(_pool_kernel.warmup(*args, grid=self.grid, **meta))
        else:
            _pool_kernel[self.grid](*args, **meta)
        LAUNCH_COUNTS["embedding_pool"] += int(not warm)

    def __call__(self) -> None:
        """Issue the launch on the current stream (under the interpreter: run it)."""
        self._launch()

    def compile(self) -> None:
        """Compile and load the kernel now, launching nothing (GPUs)."""
        if not INTERPRETER:
            self._launch(warm=True)


def pool_bags(
    tables: Sequence[BagTable],
    mode: Mode = "sum",
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: PoolConfig | None = None,
) -> torch.Tensor:
    """Every table's bags pooled in one launch: ``out [B, T, D]`` (``out.view(B, T * D)`` is
    DLRM's concatenated features); every table must have the same B bags. ``out_dtype``:
    default the weights' dtype."""
    d, w_dtype, _ = _check_tables(tables)
    b = tables[0].bags
    for t, tab in enumerate(tables):
        if tab.bags != b:
            raise ValueError(f"tables[{t}].offsets: every table needs B = {b} bags, got {tab.bags}")
    if out is None:
        device = tables[0].weight.device
        out = torch.empty(b, len(tables), d, dtype=out_dtype or w_dtype, device=device)
    elif tuple(out.shape) != (b, len(tables), d):
        raise ValueError(
            f"out: must be [B, T, D] = [{b}, {len(tables)}, {d}], got {tuple(out.shape)}"
        )
    segments = [PoolSegmentViews(t, 0, b, out[:, t, :]) for t in range(len(tables))]
    EmbeddingPool(tables, segments, mode=mode, config=config)()
    return out
