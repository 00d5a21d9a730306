"""The fused GEMM's FP8 launches on the warp-specialized Gluon kernel.

`ficco.kernels.fused.FusedGemm` runs an FP8 launch here, not on its Triton kernel, where the
card's shipped Gluon picks name the shape (`ficco.kernels.matmul.shipped_gluon_pick`: every
chunk's rows, else one chunk's) and the launch is what the picks were measured on and what
this kernel does (`refusal` names what is not): per-row A and per-column B scales, B
column-major, bf16 outputs, chunks that only wait (none signals, has copies or resets its
flag), all of one row count, their A rows in one or two buffers (an all-gather's local shard,
read in place, beside the buffer its peers' rows land in) and their outputs in one buffer
on store-block boundaries (one host-built descriptor each).

`ws_fused_kernel` (``ficco.kernels.gluon_gemm``) is the same warp-specialized kernel over the
chunks' rows back to back in the order given (the order the chunks are expected to arrive),
tiled and grouped as one product's rows (`gluon_ring._grid`: no tile padded at a chunk's end;
few-row chunks share each B column block in L2), each tile's row blocks placed through a chunk
table (`gluon_ring.CHUNK_COLS`; a block, 64-row part or whole tile, lies in one chunk: every
chunk's rows a multiple of it). Before the producer's first TMA load of a chunk's rows it
waits on that chunk's flag (acquire, then a proxy fence: TMA reads are async-proxy accesses),
so the consumers' ring slots fill only with landed rows. A flag that never arrives: the
producer gives up after ``timeout_s`` (as the Triton kernel does, on ``%globaltimer``),
records the chunk in the status, and the chunk is still computed from its unlanded rows;
``raise_on_timeout`` raises naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton

from ficco.kernels.flags import _load, _offset
from ficco.kernels.fused_views import row_blocks
from ficco.kernels.gluon_configs import GluonGemmConfig
from ficco.kernels.persistent import tma_row_major as _row_major


@dataclass(frozen=True)
class FusedGluonPlan:
    """A fused launch's Gluon tile and where its chunks lie: A's spans (one, or two: an
    all-gather's local shard beside the gathered rows) and each chunk's span and first row
    in it, the outputs' span and each chunk's first row there, a chunk's rows."""

    config: GluonGemmConfig
    a_spans: tuple[torch.Tensor, ...]
    a_span_of: tuple[int, ...]
    a_rows: tuple[int, ...]
    c_span: torch.Tensor
    c_rows: tuple[int, ...]
    chunk_rows: int


def refusal(chunks: Sequence, b: torch.Tensor, scales, reset_waits: bool) -> str:
    """Why this fused launch cannot run on the Gluon kernel whatever its tile ('' when it
    can): the operands and chunks the kernel and its picks take (module docstring)."""
    from ficco.kernels.matmul import gluon_fp8_refusal

    if scales is None:
        return "not FP8 operands"
    why = gluon_fp8_refusal(
        scales.rowwise, scales.colwise, _row_major(b.t()), [o for c in chunks for o in c.outs]
    )
    if why:
        return why
    if any(c.signals or c.copies for c in chunks):
        return "a chunk signals or has copies (stored through pointers)"
    if reset_waits:
        return "reset_waits (the Gluon launch counts no finished programs)"
    if len({c.a.shape[0] for c in chunks}) != 1:
        return "the chunks' row counts differ"
    if chunks[0].a.shape[0] == 0:
        return "the chunks have no rows"
    if not all(_row_major(c.a) and _row_major(c.out) for c in chunks):
        return "a chunk's a or out is not row-major with 16-byte aligned rows and base"
    return ""


def plan(
    chunks: Sequence,
    b: torch.Tensor,
    scales,
    sm_budget: int,
    *,
    reset_waits: bool = False,
    pick: GluonGemmConfig | None = None,
) -> tuple[FusedGluonPlan | None, str]:
    """(the plan, '') for a launch the Gluon kernel takes, else (None, why not). ``pick``:
    the tile to use (tests); default the card's shipped pick for all the chunks' rows (the
    launch tiles its chunks' rows back to back as that product's), else for one chunk's:
    the first whose row blocks divide a chunk's rows."""
    why = refusal(chunks, b, scales, reset_waits)
    if why:
        return None, why
    rows = chunks[0].a.shape[0]
    k, n = b.shape
    if pick is None:
        from ficco.kernels.matmul import shipped_gluon_pick

        # the launch tiles its chunks' rows as one product's (`gluon_ring._grid`): that
        # product's pick, else one chunk's, the first whose row blocks divide a chunk's rows
        picks = [
            p
            for p in (
                shipped_gluon_pick(m, n, k, b.dtype, sm_budget, b.device)
                for m in (rows * len(chunks), rows)
            )
            if p is not None
        ]
        if not picks:
            return None, "no shipped Gluon pick for this card, shape and SM budget"
        pick = next((p for p in picks if not _straddles(p, rows, len(chunks))), picks[0])
    if pick.swap_ab or pick.tail_n:
        return None, f"{pick.name}: swap-AB and tail tiles are 16-bit only"
    if _straddles(pick, rows, len(chunks)):
        return None, (
            f"{pick.name}: its row blocks ({_block_rows(pick)} rows) do not divide a chunk's "
            f"{rows} rows (a block would straddle two chunks)"
        )
    # the kernel's chunk of a row by a multiply (`chunk_multiplier`): exact for the launch's
    # rows and its last tile's past them
    if len(chunks) > 1 and (rows * len(chunks) + pick.block_m) * rows >= 1 << 32:
        return None, (
            f"{len(chunks)} chunks of {rows} rows: the launch's rows times a chunk's reach 2^32 "
            f"(the kernel's chunk of a row is a 32-bit multiply)"
        )
    # A: any whole row, in one or two buffers (a block's TMA load reads one chunk's rows;
    # past the last, rows that are not stored); outputs: every chunk on a store block's
    # boundary, in one buffer
    a_spans, a_span_of, a_rows = _a_spans([c.a for c in chunks])
    c_span = row_blocks([c.out for c in chunks], pick.rows_per_consumer)
    if not a_spans or c_span is None:
        return None, (
            f"the chunks' A rows are not in one or two buffers, or their outputs not in one "
            f"buffer on {pick.rows_per_consumer}-row boundaries"
        )
    if max(a_rows) + rows >= 1 << 30:
        return None, "A's rows reach 2^30 (the kernel's table holds a row twice, in 32 bits)"
    c_rows = tuple(r * pick.rows_per_consumer for r in c_span[1])
    return FusedGluonPlan(pick, a_spans, a_span_of, a_rows, c_span[0], c_rows, rows), ""


def _a_spans(views: Sequence[torch.Tensor]) -> tuple[tuple, tuple[int, ...], tuple[int, ...]]:
    """The chunks' A rows as (spans, each chunk's span, its first row there): the views of
    each storage in one span (`row_blocks`), at most two storages (an all-gather's local
    shard, read in place, and the buffer its peers' rows land in); ((), (), ()) where not."""
    storages: dict[int, list[int]] = {}
    for i, v in enumerate(views):
        storages.setdefault(v.untyped_storage().data_ptr(), []).append(i)
    if len(storages) > 2:
        return (), (), ()
    spans, span_of, rows = [], [0] * len(views), [0] * len(views)
    for members in storages.values():
        got = row_blocks([views[i] for i in members], 1)
        if got is None:
            return (), (), ()
        for i, first in zip(members, got[1], strict=True):
            span_of[i], rows[i] = len(spans), first
        spans.append(got[0])
    return tuple(spans), tuple(span_of), tuple(rows)


def chunk_multiplier(chunk_rows: int, chunks: int) -> int:
    """The kernel's multiplier for row // chunk_rows (`gluon_ring._chunk_of`: (row * m) >> 32,
    a multiply where a division cost ~25 dependent instructions a tile): m = 2^32 //
    chunk_rows + 1 is exact for every row r with r * chunk_rows < 2^32 (r * m / 2^32
    overshoots r / chunk_rows by less than r / 2^32, under the 1 / chunk_rows that r /
    chunk_rows's fraction stays below 1 by); `plan` refuses launches past that. One chunk:
    0 (every row in chunk 0). Several chunks have at least 64 rows (`_block_rows`): m < 2^31,
    a 32-bit argument."""
    if chunk_rows < 1 or chunks < 1:
        raise ValueError(f"chunk_rows {chunk_rows} and chunks {chunks} must be at least 1")
    return 0 if chunks == 1 else (1 << 32) // chunk_rows + 1


def _block_rows(cfg: GluonGemmConfig) -> int:
    """The rows of a tile's blocks that each lie in one chunk: A's TMA loads (64-row blocks
    in three-part tiles, else the tile) and the consumers' stores (their parts)."""
    a_block = cfg.rows_per_consumer if cfg.consumers == 3 else cfg.block_m
    return max(a_block, cfg.rows_per_consumer)


def _straddles(cfg: GluonGemmConfig, rows: int, chunks: int) -> bool:
    """Whether a block of cfg's tiles would hold rows of two chunks of ``rows`` rows."""
    return chunks > 1 and rows % _block_rows(cfg) != 0


class GluonFused:
    """One fused FP8 launch on ``ws_fused_kernel``, prepared once (descriptors and the chunk
    table on the device: a launch can be captured in a CUDA graph) and issued by calling it.
    ``flag_ref``, ``status`` and ``budget_ns`` are the owning ``FusedGemm``'s."""

    def __init__(
        self,
        launch: FusedGluonPlan,
        chunks: Sequence,
        b: torch.Tensor,
        scales,
        *,
        flag_ref: torch.Tensor,
        status: torch.Tensor,
        budget_ns: int,
        sm_budget: int,
    ) -> None:
        from ficco.kernels import gluon_gemm as gg

        self.launch = launch
        cfg = self.config = launch.config
        cfg.check(1)
        a_desc, b_desc, c_desc, _, _ = gg._descs(launch.a_spans[0], b, launch.c_span, cfg, True)
        # the second A buffer's (the first's where there is one)
        a2_desc = gg._descs(launch.a_spans[-1], b, launch.c_span, cfg, True)[0]
        # A's first row as the kernel reads it (`gluon_ring._copy_a`): twice the row, plus 1
        # in the second buffer
        a_rows = [2 * r + s for r, s in zip(launch.a_rows, launch.a_span_of, strict=True)]
        table = [
            [
                a_row,
                c_row,
                scales.a_offsets[i],
                0 if c.wait is None else _offset(c.wait, flag_ref),
                int(c.wait is not None),
            ]
            for i, (c, a_row, c_row) in enumerate(zip(chunks, a_rows, launch.c_rows, strict=True))
        ]
        self.table = torch.tensor(table, dtype=torch.int64, device=b.device)
        # the chunks' rows back to back, tiled as one product's (`gluon_ring._grid`)
        rows = len(chunks) * launch.chunk_rows
        tiles = triton.cdiv(rows, cfg.block_m) * triton.cdiv(b.shape[1], cfg.block_n)
        # a split tail with its own counters: the launch is prepared once and may be captured
        self.split = gg.SplitTail.of(
            cfg, rows, b.shape[1], b.shape[0], sm_budget, launch.c_span, own_counters=True
        )
        self.grid = (max(1, min(sm_budget, self.split.units(tiles))),)
        self.args = (
            a_desc, b_desc, c_desc, scales.a_ref, scales.b_scale, self.table, flag_ref, status,
            launch.chunk_rows, len(chunks), budget_ns,
            chunk_multiplier(launch.chunk_rows, len(chunks)),
            # chunk 0's table entry again, as arguments (`gluon_ring._wait_chunk`)
            a_rows[0], flag_ref if chunks[0].wait is None else chunks[0].wait,
            int(chunks[0].wait is not None), a2_desc, *self.split.args(),
        )  # fmt: skip
        self.meta = dict(
            STAGES=cfg.stages, CONSUMERS=cfg.consumers, PRODUCER_REGS=gg.PRODUCER_REGS,
            CONSUMER_REGS=gg.CONSUMER_REGS, FAST_ACCUM=scales.fast_accum,
            SPLIT_TAIL=self.split.plan is not None, num_warps=cfg.consumer_warps,
            maxnreg=gg.THIRDS_MAX_REGS if cfg.consumers == 3 else gg.MAX_REGS,
        )  # fmt: skip
        self.kernel = gg.ws_fused_kernel

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)

    def compile(self) -> None:
        """Compile and load the kernel now, launching nothing."""
        _load(self.kernel.warmup(*self.args, grid=self.grid, **self.meta))
