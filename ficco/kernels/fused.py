"""The fused GEMM: one persistent Triton launch over row chunks that wait on, or set, flags.

:class:`FusedGemm` computes ``out_i = a_i @ b`` for row chunks ``i`` in one launch of
``min(sm_budget, tiles)`` persistent programs. Tiles are numbered chunk by chunk in the order
given (the order the chunks are expected to arrive: the local shard first), grouped within a
chunk as ``ficco.kernels.persistent`` groups them; programs claim them in that order. A
config's ``chunk_group`` numbers that many consecutive chunks as one row range instead (B
read once per group: few-row chunks), where chunks have equal tile counts and only wait. A
config's ``split_tail``: where the launch's tiles leave a short last wave
(``configs.split_plan``), those tiles' K is split over the idle programs; every K range waits
on its chunk, and the last to arrive sums the fp32 partials and stores, counts and signals.

- A chunk with a ``wait`` flag: before a tile reads ``a_i`` it spins until the flag (an int32,
  set by a stream-ordered write after the copy landed, or by the peer's own store) is
  nonzero, then reads it with acquire semantics.
- A chunk with a ``signal`` flag: after storing a tile, the program counts it on a per-chunk
  counter; the chunk's last tile sets the flag to 1 with a system-scope release, so whoever
  waits on it (the owner of a peer-written chunk) sees every tile. ``out_i`` may live on
  another rank (a symmetric-memory peer view): the epilogue's stores are the transfer.
- A chunk with ``copies`` (gemm_ar's one-shot all-reduce by the producer): each tile is
  computed once and stored from the same registers into ``out_i`` and into every copy's
  output (every peer's staging), and the chunk's last tile sets every destination's flag.

Operands are addressed as element offsets from one private reference tensor per role (every
A chunk shares A's dtype and strides, every output C's), so one launch reads from and writes
to any number of buffers, local or peer-mapped (a flat address space on GPUs; raw host
addresses under the interpreter, where file-backed shared tensors stand in for symmetric
memory). No shared buffer is ever a launch argument: the interpreter copies every argument's
storage back onto itself after a launch, which would undo a peer's concurrent stores.

Two load paths compute the same function. 'tma' (Hopper, and the interpreter): A and C go
through tensor descriptors made inside the kernel, two per chunk a program meets (a chunk's
rows bound them, so ragged chunks need no masks), B through one host-built descriptor; a
tile's TMA loads follow its flag's acquire and a ``fence.proxy.async`` (TMA reads are
async-proxy accesses); signalled chunks store with pointer stores (generic-proxy writes that
the release publishes). 'ptr': masked pointer loads and stores with any strides, for views a
descriptor cannot take (``FusedGemm.tma_refusal`` says why). The tile (block shape, stages,
warps, grouping) is chosen per shape from the persistent GEMM's space
(``ficco.kernels.fused_configs``).

The kernel itself is ``ficco.kernels.fused_kernel``. A launch is one kernel: the claim counter and the per-chunk counters are zero on entry and
the last program to finish zeroes them again, so back-to-back launches (or a CUDA graph's
replays) need no memset; the timeout status stays set until ``raise_on_timeout`` reads it.

A flag that never arrives: on GPUs a spinning tile gives up after ``timeout_s`` measured on
``%globaltimer``; under the CPU interpreter (which has no clock inside a kernel) a host
watchdog writes -1 into the flags still unset once ``timeout_s`` has passed. Either way the
flag becomes negative, every tile of that chunk skips its work, the chunk is recorded in a
status tensor, and ``raise_on_timeout`` raises :class:`FlagTimeout` naming the chunk.
:class:`FlagWait` is the owner's side of producer writes: one program waiting on a set of
flags, with the same timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from ficco.kernels.configs import GemmConfig, split_plan
from ficco.kernels.flags import (
    FlagTimeout,
    FlagWait,
    _budget_ns,
    _load,
    _offset,
    _Timed,
    _Watchdog,
)
from ficco.kernels.fused_configs import Path, fused_config, smaller_config, tma_supported
from ficco.kernels.fused_kernel import _TABLE_COLS, _fused_gemm_kernel
from ficco.kernels.fused_views import (
    FusedChunkViews,
    FusedCopyViews,
    _alignment,
    _ensure_allocator,
    _same,
    row_blocks,
)
from ficco.kernels.gluon_configs import GluonGemmConfig
from ficco.kernels.persistent import (
    INTERPRETER,
    LAUNCH_COUNTS,
    TensorDescriptor,
    _tma_operand,
    _warn_once,
)
from ficco.kernels.scaled_fused import fused_scaled_config, fused_scales
from ficco.kernels.scaled_kernel import FP8_DTYPES, imprecise_acc, programs

__all__ = ["FlagTimeout", "FlagWait", "FusedChunkViews", "FusedCopyViews", "FusedGemm"]

_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}
_PRECISION.update(dict.fromkeys(FP8_DTYPES, "tf32"))  # unused by fp8 dots


def offsets_fit_int32(rows: int, n: int, strides: tuple[int, ...], block_m: int) -> bool:
    """Whether a pointer-stored tile's element offsets from its chunk's output start fit
    int32, for chunks of at most ``rows`` rows of ``n`` columns with these strides in tiles
    of ``block_m`` rows (a tile's overhang past the last row included, its lanes masked):
    they then take half the registers (`_fused_gemm_kernel`'s OFFSETS_32)."""
    return (rows + block_m) * strides[0] + n * strides[1] < 2**31


class FusedGemm(_Timed):
    """One fused launch, prepared once (tables on the device, so a launch can be captured in
    a CUDA graph) and issued by calling it: ``chunk.out = chunk.a @ b`` for every chunk,
    tiles in chunk order, waiting on and setting the chunks' flags (module docstring).

    ``config``: the tile (a ``GluonGemmConfig``: the Gluon kernel's, FP8 on sm_90, refused
    with ``gluon_fused.plan``'s reason where it cannot run; default: ``fused_configs.fused_config``, chosen per shape as the
    persistent GEMM chooses its own; ``arriving``: the tile tuned for chunks that land while
    the launch runs, ``fused_arrival``; None: where any chunk waits on a flag).
    ``path``: 'tma' (tensor descriptors), 'ptr' (pointer loads), or None: 'tma' wherever
    ``tma_refusal`` finds nothing against it.

    FP8 operands (``ficco.kernels.scaled``): ``b`` (row- or column-major) with ``b_scale``
    (one or ``[1, N]``), every chunk with its ``a_scale``; the scales multiply the fp32 accumulator
    before the store (``fast_accum``: as ``scaled``'s, promotion per K step when False). On an
    sm_90 GPU, with no ``config`` given, a launch the card's Gluon picks name and the
    warp-specialized kernel takes runs there (``gluon_fused``, ``self.gluon``; its ``plan``
    says why one does not): per-row / per-column scales, B column-major, chunks that only
    wait, of equal rows, in one buffer each; on one H100 1.04x ``_scaled_mm`` with every flag
    set, where this kernel ran 0.82x (profiles/h100/NOTES_gemm.md).

    ``reset_waits``: the launch's last program zeroes every chunk's ``wait`` flag once every
    tile has read it, so the next launch waits for new arrivals with no memset before it
    (one kernel per step, as ``per_chunk``'s events need none). Only where the next arrivals
    are ordered after this launch (a writer on a stream that waits for it): a flag set early
    for the next launch would be lost.

    ``host_descriptors`` (TMA path): where every chunk's rows lie in one buffer on row-block
    boundaries (``fused_configs.row_blocks``; a gathered A and its output usually do), A and
    C go through two descriptors built on the host, not two per chunk written and fenced by
    each program. None: on GPUs (FP8 too: on one H100 its fused launches ran 1.03x faster so,
    geomean of 56 shapes, 0.98-1.13x; profiles/h100/fp8_gemm_notes.md). Under the interpreter only where no
    peer writes into these buffers during the launch (descriptor arguments are copied back).

    ``ready_runs``: tiles dealt out by program and run in flattened loops over the chunks
    that have arrived (the kernel's ``READY_RUNS``), as the persistent GEMM runs its tiles, in
    place of one claim and one pipeline start per tile. It applies where the launch has host
    descriptors, chunks of equal tile counts, no signalled chunk or copy (no peer waits on a
    program that is not resident yet), no split tail and bf16/fp16/fp32 operands; True where
    it does not is refused with the reason, False claims. None (the default): runs where
    they apply and the tiles outnumber the programs (``runs_by_default``). Runs against
    claims, geomeans per band (below / above 0.3 ms of cuBLAS time) on the committed H200 and
    H100 fused runs (``scripts/kernels_sweep_summary.py`` over their JSON): with every flag
    set 0.917x-0.990x where programs take several tiles, 1.023x-1.051x where each takes one
    (its tile's wait and run cost more than one claim); with chunks landing during the
    launch 0.875x-0.995x.
    """

    def __init__(
        self,
        chunks: Sequence[FusedChunkViews],
        b: torch.Tensor,
        *,
        sm_budget: int,
        timeout_s: float,
        config: GemmConfig | GluonGemmConfig | None = None,
        path: Path | None = None,
        b_scale: torch.Tensor | None = None,
        fast_accum: bool = False,
        reset_waits: bool = False,
        host_descriptors: bool | None = None,
        arriving: bool | None = None,
        ready_runs: bool | None = None,
    ) -> None:
        if not chunks:
            raise ValueError("fused GEMM: chunks is empty")
        a0, out0 = chunks[0].a, chunks[0].out
        _same("a", [c.a for c in chunks], "dtype")
        _same("a", [c.a for c in chunks], "stride")
        _same("out", [o for c in chunks for o in c.outs], "dtype")
        _same("out", [o for c in chunks for o in c.outs], "stride")
        k, n = b.shape
        for i, c in enumerate(chunks):
            for out in c.outs:
                if c.a.shape[1] != k or tuple(out.shape) != (c.a.shape[0], n):
                    raise ValueError(
                        f"fused GEMM: chunk {i} has a {tuple(c.a.shape)} and out "
                        f"{tuple(out.shape)}; with b {tuple(b.shape)} out must be "
                        f"[{c.a.shape[0]}, {n}]"
                    )
        if b.dtype != a0.dtype:
            raise ValueError(f"fused GEMM: b.dtype must equal a's ({a0.dtype}), got {b.dtype}")
        self.scales = fused_scales(chunks, b, b_scale, fast_accum)
        flags = [f for c in chunks for f in (c.wait, *c.signals) if f is not None]
        if any(f.dtype != torch.int32 or f.numel() != 1 for f in flags):
            raise ValueError("fused GEMM: every flag must be a 1-element int32 view")
        if isinstance(sm_budget, bool) or not isinstance(sm_budget, int) or sm_budget < 1:
            raise ValueError(f"sm_budget: must be a positive int (programs), got {sm_budget!r}")
        if path not in (None, "tma", "ptr"):
            raise ValueError(f"path: must be 'tma', 'ptr' or None, got {path!r}")
        device = a0.device
        # Private reference tensors: every operand is addressed from them, so the launch
        # takes no shared buffer as an argument (the interpreter writes every argument's
        # storage back after a launch, which would undo a peer's concurrent stores).
        self.b = b
        self.a0 = torch.empty(1, dtype=a0.dtype, device=device).as_strided((1, 1), a0.stride())
        self.out0 = torch.empty(1, dtype=out0.dtype, device=device).as_strided(
            (1, 1), out0.stride()
        )
        self.flag_ref = torch.zeros(1, dtype=torch.int32, device=device)
        self.chunks, self.n, self.k, self.sm_budget = list(chunks), n, k, sm_budget
        self.reset_waits = bool(reset_waits)
        if host_descriptors is None:
            host_descriptors = not INTERPRETER
        self.host_descriptors = bool(host_descriptors)
        # [next tile, programs done, tiles stored per chunk]: zero between launches (the
        # kernel's last program zeroes it), so a launch is one kernel, no memset
        self.work = torch.zeros(2 + len(chunks), dtype=torch.int32, device=device)
        self.status = torch.zeros(len(chunks), dtype=torch.int32, device=device)
        self.waits = [c.wait for c in chunks if c.wait is not None]
        self.names = [c.name or f"chunk {i}" for i, c in enumerate(chunks)]
        self.timeout_s, self.budget_ns = timeout_s, _budget_ns(timeout_s)
        self.a_align = _alignment([_offset(c.a, self.a0) for c in chunks], a0.element_size())
        self.c_align = _alignment(
            [_offset(o, self.out0) for c in chunks for o in c.outs], out0.element_size()
        )
        refusal = self.tma_refusal()
        if path == "tma" and refusal:
            raise ValueError(f"fused GEMM: path='tma' refused: {refusal}")
        if path is None:
            path = "ptr" if refusal else "tma"
            if refusal and device.type == "cuda" and tma_supported(device):
                _warn_once(f"fused GEMM: pointer loads (slower): {refusal}")
        self.path: Path = path
        self.b_col_major = path == "tma" and _tma_operand(b)[2]
        for name, value in (("arriving", arriving), ("ready_runs", ready_runs)):
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"fused GEMM: {name} must be True, False or None, got {value!r}")
        self.ready_runs = ready_runs
        # FP8 on the Gluon kernel (`ficco.kernels.gluon_fused`): a Gluon tile given, else the
        # card's picks where they apply; the Triton kernel's tile is still chosen below
        gluon_tile = config if isinstance(config, GluonGemmConfig) else None
        self.gluon = None
        if gluon_tile is not None:
            why = "on the pointer path" if self.path != "tma" else ""
            why = why or ("not on a GPU" if device.type != "cuda" else "")
            why = why or ("with ready_runs" if ready_runs else "")
            self.gluon, why = self._gluon_launch(gluon_tile) if not why else (None, why)
            if self.gluon is None:
                raise ValueError(f"fused GEMM: config {gluon_tile.name} refused: {why}")
            config = None
        elif config is None and self.path == "tma" and device.type == "cuda" and not ready_runs:
            self.gluon, _ = self._gluon_launch(None)
        if config is None:
            total = sum(c.a.shape[0] for c in chunks)
            if self.scales is None:
                late = any(c.wait is not None for c in chunks) if arriving is None else arriving
                config = fused_config(
                    total, n, k, len(chunks), a0.dtype, sm_budget, device, path, arriving=late
                )
            else:
                config = fused_scaled_config(
                    total, n, k, len(chunks), a0.dtype, sm_budget, device, path
                )
        self._tabulate(config)
        self._runs_asked()  # refused now rather than at the first launch

    def _gluon_launch(self, tile: GluonGemmConfig | None) -> tuple:
        """(the Gluon kernel's launch of these chunks in ``tile``, else in the card's pick;
        '') or (None, why not: ``gluon_fused.plan``'s reason)."""
        from ficco.kernels import gluon_fused

        launch, why = gluon_fused.plan(
            self.chunks, self.b, self.scales, self.sm_budget, reset_waits=self.reset_waits,
            pick=tile,
        )  # fmt: skip
        if launch is None:
            return None, why
        gluon = gluon_fused.GluonFused(
            launch, self.chunks, self.b, self.scales, flag_ref=self.flag_ref,
            status=self.status, budget_ns=self.budget_ns, sm_budget=self.sm_budget,
        )  # fmt: skip
        return gluon, ""

    def _runs_asked(self) -> bool:
        """Whether the launch runs ready runs with the current tile: asked for
        (``ready_runs=True``; a ValueError names the refusal where they cannot), or by
        default where they apply and ``runs_by_default``; False where turned off."""
        if self.ready_runs is False:
            return False
        refusal = self.ready_runs_refusal()
        if self.ready_runs is None:
            return not refusal and self.runs_by_default()
        if refusal:
            raise ValueError(
                f"fused GEMM: ready_runs=True refused for {self.config.name}: {refusal}"
            )
        return True

    def runs_by_default(self) -> bool:
        """The default's rule: ready runs where the tiles outnumber the launch's programs, so
        some program runs several tiles in a row (one tile each: a claim is cheaper)."""
        return self.tiles > self.grid[0]

    def ready_runs_refusal(self) -> str:
        """Why this launch cannot run its tiles in runs of arrived chunks ('' when it can;
        ``ready_runs``)."""
        if self.host is None:
            return "no host descriptors (the TMA path with every chunk on row-block boundaries)"
        if any(c.signals or c.copies for c in self.chunks):
            return "a chunk signals or has copies (its tiles are claimed, not dealt out)"
        if self.tiles_per_chunk == 0:
            return "the chunks' tile counts differ"
        if self.plan is not None:
            return "the config splits the last wave (split_tail)"
        if self.scales is not None:
            return "FP8 operands (the scale epilogue)"
        return ""

    def tma_refusal(self) -> str:
        """Why tensor descriptors cannot address these operands ('' when they can): TMA
        needs a unit inner stride, 16-byte aligned bases and leading strides, and B
        row- or column-major."""
        a0, out0, b = self.a0, self.out0, self.b
        if not tma_supported(a0.device):
            return f"{a0.device} has no tensor-descriptor loads (needs sm_90+ or the interpreter)"
        for name, ref, align in (("a", a0, self.a_align), ("out", out0, self.c_align)):
            size = ref.element_size()
            if ref.stride(1) != 1 or (ref.stride(0) * size) % 16:
                return f"{name}'s strides {ref.stride()} are not (a multiple of 16 bytes, 1)"
            if align * size != 16 or ref.data_ptr() % 16:
                return f"a chunk's {name} does not start on a 16-byte boundary"
        if _tma_operand(b) is None:
            return f"b's strides {b.stride()} or base are not 16-byte aligned with a unit stride"
        return ""

    def _tabulate(self, config: GemmConfig) -> None:
        """The chunk table and the tile -> chunk map for ``config``'s tile shape."""
        device, n = self.a0.device, self.n
        self.host = self._host_descs(config) if self.host_descriptors else None
        blocks = self.host[2] if self.host else [(0, 0)] * len(self.chunks)
        table, copies, tile_chunk, start, counts = [], [], [], 0, set()
        for i, c in enumerate(self.chunks):
            rows = c.a.shape[0]
            tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(n, config.block_n)
            table.append(
                [
                    _offset(c.a, self.a0),
                    _offset(c.out, self.out0),
                    rows,
                    start,
                    0 if c.wait is None else _offset(c.wait, self.flag_ref),
                    0 if c.signal is None else _offset(c.signal, self.flag_ref),
                    int(c.wait is not None),
                    int(c.signal is not None),
                    len(copies),
                    len(c.copies),
                    int(bool(c.signals)),
                    0 if self.scales is None else self.scales.a_offsets[i],
                    *blocks[i],
                ]
            )
            copies += [
                [
                    _offset(d.out, self.out0),
                    0 if d.signal is None else _offset(d.signal, self.flag_ref),
                    int(d.signal is not None),
                ]
                for d in c.copies
            ]
            tile_chunk += [i] * tiles
            counts.add(tiles)
            start += tiles
        self.config = config
        rows = max(c.a.shape[0] for c in self.chunks)
        self.offsets_32 = offsets_fit_int32(rows, n, self.out0.stride(), config.block_m)
        self.b_desc = self.b
        if self.path == "tma":
            shape, strides, _ = _tma_operand(self.b)
            block = (
                [config.block_n, config.block_k]
                if self.b_col_major
                else [config.block_k, config.block_n]
            )
            self.b_desc = TensorDescriptor(self.b, shape, strides, block)
        self.table = torch.tensor(table, dtype=torch.int64, device=device)
        # one unused row where no chunk has copies: the kernel never reads it then
        self.copy_table = torch.tensor(copies or [[0, 0, 0]], dtype=torch.int64, device=device)
        # never empty: the kernel reads its first entry even when there is no tile
        self.tile_chunk = torch.tensor(tile_chunk or [0], dtype=torch.int32, device=device)
        self.tiles = start
        self.tiles_per_chunk = counts.pop() if len(counts) == 1 else 0  # the kernel's shortcut
        # Grouped chunks (GemmConfig.chunk_group) where the kernel places tiles by arithmetic
        # and no chunk signals: a signalling chunk's last tile comes as early as it can
        signals = any(c.signals or c.copies for c in self.chunks)
        grouped = self.tiles_per_chunk > 0 and not signals
        self.chunk_group = min(config.chunk_group, len(self.chunks)) if grouped else 1
        # split_tail: a short last wave's tiles split along K over the idle programs (the
        # persistent kernel's plan); None where the launch fills its programs
        launch_programs = programs(config, self.sm_budget, device)
        k_steps = triton.cdiv(self.k, config.block_k)
        self.plan = split_plan(start, launch_programs, k_steps) if config.split_tail else None
        units = self.plan.units if self.plan else start
        self.units = units
        tail = (self.plan.tail_tiles, self.plan.split) if self.plan else (1, 1)
        self.partials = torch.empty(
            tail[0] * tail[1] * (config.block_m * config.block_n if self.plan else 1),
            dtype=torch.float32,
            device=device,
        )
        self.arrivals = torch.zeros(tail[0], dtype=torch.int32, device=device)
        self.grid = (max(1, min(launch_programs, units)),)

    def _host_descs(self, config: GemmConfig) -> tuple | None:
        """(A's and C's host descriptors, each chunk's (A, C) first row block in them), or
        None where ``row_blocks`` finds no span for A or for the TMA-stored outputs."""
        if self.path != "tma":
            return None
        bm = config.block_m
        a_span = row_blocks([c.a for c in self.chunks], bm)
        # signalled chunks and those with copies store through pointers: no C descriptor
        stored = [i for i, c in enumerate(self.chunks) if not (c.signals or c.copies)]
        c_span = row_blocks([self.chunks[i].out for i in stored], bm) if stored else None
        if a_span is None or (stored and c_span is None):
            return None
        if c_span is None:  # never stored through, but typed as a C descriptor
            c_span = (self.chunks[0].out, [])
        c_cols = config.block_n // 2 if config.epilogue_subtile else config.block_n

        def desc(span, block):
            return TensorDescriptor(span, list(span.shape), list(span.stride()), block)

        c_blk = dict(zip(stored, c_span[1], strict=True))
        blocks = [(a_span[1][i], c_blk.get(i, 0)) for i in range(len(self.chunks))]
        return desc(a_span[0], [bm, config.block_k]), desc(c_span[0], [bm, c_cols]), blocks

    def __call__(self) -> None:
        """Issue the launch on the current stream (under the interpreter: run it)."""
        if self.gluon is not None:
            self.gluon()
            LAUNCH_COUNTS["fused_gluon"] += 1
            return
        with _Watchdog(self.waits, self.timeout_s):
            try:
                self._launch(self.config)
            except triton.runtime.errors.OutOfResources:
                # the next smaller tile that fits this device's shared memory
                smaller = smaller_config(self.config)
                if smaller is None:
                    raise
                self._tabulate(smaller)  # before any capture: the first launch is eager
                self()

    def _launch(self, cfg: GemmConfig, warm: bool = False) -> None:
        a0, b, out0, sc = self.a0, self.b, self.out0, self.scales
        if self.path == "tma":
            _ensure_allocator()
        args = (
            a0, b, self.b_desc, *(self.host[:2] if self.host else (self.b_desc,) * 2),
            out0, self.flag_ref, self.table, self.copy_table,
            self.tile_chunk, self.work, self.partials, self.arrivals, self.status,
            *((self.flag_ref, self.flag_ref) if sc is None else (sc.a_ref, sc.b_scale)),
            len(self.chunks), self.tiles, self.tiles_per_chunk, self.chunk_group, self.units,
            *((self.plan.dp_tiles, self.plan.split, self.plan.k_per_split) if self.plan
              else (self.tiles, 1, 1)),
            self.n, self.k,
            a0.stride(0), a0.stride(1), b.stride(0), b.stride(1), out0.stride(0), out0.stride(1),
            self.budget_ns,
        )  # fmt: skip
        meta = dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            A_ALIGN=self.a_align, C_ALIGN=self.c_align, USE_TMA=self.path == "tma",
            B_COL_MAJOR=self.b_col_major, EPILOGUE_SUBTILE=cfg.epilogue_subtile,
            ON_GPU=not INTERPRETER, INPUT_PRECISION=_PRECISION[a0.dtype],
            TABLE_COLS=_TABLE_COLS,
            POINTER_STORES=any(c.signals or c.copies for c in self.chunks),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if self.reset_waits:  # only then: the other launches keep their compiled kernels
            meta["RESET_WAITS"] = True
        if self.host:
            meta["HOST_DESCS"] = True
        if self.plan:
            meta["SPLIT_TAIL"] = True
        if self._runs_asked():  # again: a smaller tile taken at launch may refuse
            meta["READY_RUNS"] = True
        if meta["POINTER_STORES"] and self.offsets_32:
            meta["OFFSETS_32"] = True
        if sc is not None:
            meta.update(
                SCALED=True, A_ROWWISE=sc.rowwise, B_COLWISE=sc.colwise,
                IMPRECISE_ACC=imprecise_acc(cfg, sc.fast_accum),
            )  # fmt: skip
        if warm:
            _load(_fused_gemm_kernel.warmup(*args, grid=self.grid, **meta))
        else:
            _fused_gemm_kernel[self.grid](*args, **meta)
        LAUNCH_COUNTS[f"fused_{self.path}"] += int(not warm)
        LAUNCH_COUNTS["fused_ready_runs"] += int(not warm and "READY_RUNS" in meta)

    def compile(self) -> None:
        """Compile and load the kernel now, launching nothing (GPUs): a first launch that
        compiled while a peer spun on its flags would spend the peer's timeout budget."""
        if self.gluon is not None:
            self.gluon.compile()
        elif not INTERPRETER:
            self._launch(self.config, warm=True)
