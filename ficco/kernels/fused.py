"""The fused GEMM: one persistent Triton launch over row chunks that wait on, or set, flags.

:class:`FusedGemm` computes ``out_i = a_i @ b`` for row chunks ``i`` in one launch of
``min(sm_budget, tiles)`` persistent programs. Tiles are numbered chunk by chunk in the order
given (the order the chunks are expected to arrive: the local shard first), grouped within a
chunk as ``ficco.kernels.persistent`` groups them; program ``p`` takes tiles ``p, p + P, ...``.

- A chunk with a ``wait`` flag: before a tile reads ``a_i`` it spins until the flag (an int32,
  set by a stream-ordered write after the copy landed, or by the peer's own store) is
  nonzero, then reads it with acquire semantics.
- A chunk with a ``signal`` flag: after storing a tile, the program counts it on a per-chunk
  counter; the chunk's last tile sets the flag to 1 with a system-scope release, so whoever
  waits on it (the owner of a peer-written chunk) sees every tile. ``out_i`` may live on
  another rank (a symmetric-memory peer view): the epilogue's stores are the transfer.

Operands are addressed as element offsets from one private reference tensor per role (every
A chunk shares A's dtype and strides, every output C's), so one launch reads from and writes
to any number of buffers, local or peer-mapped (a flat address space on GPUs; raw host
addresses under the interpreter, where file-backed shared tensors stand in for symmetric
memory). No shared buffer is ever a launch argument: the interpreter copies every argument's
storage back onto itself after a launch, which would undo a peer's concurrent stores.

A flag that never arrives: on GPUs a spinning tile gives up after ``timeout_s`` measured on
``%globaltimer``; under the CPU interpreter (which has no clock inside a kernel) a host
watchdog writes -1 into the flags still unset once ``timeout_s`` has passed. Either way the
flag becomes negative, every tile of that chunk skips its work, the chunk is recorded in a
status tensor, and ``raise_on_timeout`` raises :class:`FlagTimeout` naming the chunk.
:class:`FlagWait` is the owner's side of producer writes: one program waiting on a set of
flags, with the same timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ficco.kernels.configs import GemmConfig
from ficco.kernels.fused_configs import Path, fused_config, smaller_config, tma_supported
from ficco.kernels.persistent import (
    INTERPRETER,
    LAUNCH_COUNTS,
    _store_c_tile,
    _tile_coords,
    _tma_operand,
    _warn_once,
)

_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}


class FlagTimeout(RuntimeError):
    """A flag a fused kernel waited on was not set within the timeout (timed out)."""


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _wait_flag(flag_ptr, budget_ns, USE_CLOCK: tl.constexpr):
    # The flag's value once it is nonzero: positive = arrived, negative = given up (by a
    # tile that timed out, or by the host watchdog under the interpreter). One acquire when
    # the flag is already set; a spin of volatile loads, then the acquire, when it is not.
    val = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if val == 0:
        if USE_CLOCK:
            start = _globaltimer()
            while val == 0:
                val = tl.load(flag_ptr, volatile=True)
                elapsed = _globaltimer() - start
                if (val == 0) & (elapsed > budget_ns):
                    # give up for every tile of the chunk: the next readers see -1 at once
                    tl.atomic_cas(flag_ptr, 0, -1, sem="acq_rel", scope="sys")
                    val = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        else:
            while val == 0:
                val = tl.load(flag_ptr, volatile=True)
        val = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    return val


@triton.jit
def _proxy_fence():
    # TMA loads are async-proxy accesses: order them after the generic-proxy acquire of a flag
    return tl.inline_asm_elementwise(
        "fence.proxy.async.global;\n\tmov.u32 $0, 0;",
        "=r",
        [],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _fused_gemm_kernel(
    a_ref,  # every A chunk is a_ref + offset: rows [rows_i, K], strides (stride_am, stride_ak)
    b_ptr,  # B [K, N], strides (stride_bk, stride_bn)
    c_ref,  # every output chunk is c_ref + offset: [rows_i, N], strides (stride_cm, stride_cn)
    flag_ref,  # int32: every flag is flag_ref + offset
    table_ptr,  # int64 [chunks, 8]: a_off, c_off, rows, tile_start, wait_off, signal_off,
    #            has_wait, has_signal (offsets may be negative: they are from private refs)
    tile_chunk_ptr,  # int32 [tiles]: the chunk of each tile
    counter_ptr,  # int32 [chunks]: tiles stored per chunk, zero on entry
    status_ptr,  # int32 [chunks]: 1 where the chunk's wait gave up
    next_tile_ptr,  # int32 [1]: the next tile to claim, zero on entry
    num_tiles,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    budget_ns,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_ALIGN: tl.constexpr,  # every A offset is a multiple of this many elements
    C_ALIGN: tl.constexpr,  # every output offset is a multiple of this many elements
    USE_TMA: tl.constexpr,  # A, B and (unsignalled) C through tensor descriptors
    B_COL_MAJOR: tl.constexpr,  # TMA: B is read as B^T [N, K] (stride_bk == 1 when set)
    EPILOGUE_SUBTILE: tl.constexpr,  # TMA: store C in two [BLOCK_M, BLOCK_N / 2] halves
    USE_CLOCK: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k0 = tl.arange(0, BLOCK_K)
    C_COLS: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    if USE_TMA:
        if B_COL_MAJOR:
            b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [stride_bn, 1], [BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_K, BLOCK_N])
        # placeholders until a program meets its first chunk (never read or written)
        a_desc = tl.make_tensor_descriptor(a_ref, [1, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_ref, [1, N], [stride_cm, 1], [BLOCK_M, C_COLS])
    desc_chunk = -1  # the chunk a_desc and c_desc describe
    seen = -1  # the last chunk whose flag this program acquired: its later tiles skip the wait
    # Tiles are claimed in order from one counter, not dealt out by program id: a program
    # that is not resident yet (its SM held by a kernel beside this one, e.g. an owner's
    # flag wait) owns no tile, so the chunks a peer waits on cannot be stuck behind it.
    tile = tl.atomic_add(next_tile_ptr, 1, sem="relaxed")
    while tile < num_tiles:
        chunk = tl.load(tile_chunk_ptr + tile)
        row = table_ptr + chunk * 8
        # alignment hints (host-checked): lets the compiler vectorize the loads and stores
        a_off = tl.multiple_of(tl.load(row), A_ALIGN)
        c_off = tl.multiple_of(tl.load(row + 1), C_ALIGN)
        rows = tl.load(row + 2).to(tl.int32)
        tile_start = tl.load(row + 3).to(tl.int32)
        wait_off = tl.load(row + 4)
        signal_off = tl.load(row + 5)
        has_wait = tl.load(row + 6)
        has_signal = tl.load(row + 7)
        ready = 1
        if (has_wait != 0) & (chunk != seen):
            ready = _wait_flag(flag_ref + wait_off, budget_ns, USE_CLOCK)
            if ready > 0:
                seen = chunk
                if USE_TMA and USE_CLOCK:
                    _proxy_fence()
        if ready > 0:
            num_pid_m = tl.cdiv(rows, BLOCK_M)
            pid_m, pid_n = _tile_coords(tile - tile_start, num_pid_m, num_pid_n, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if USE_TMA:
                if chunk != desc_chunk:
                    # a chunk's descriptors, made when a program first meets the chunk: 128
                    # bytes each, written to global scratch and fenced (not per tile)
                    a_desc = tl.make_tensor_descriptor(
                        a_ref + a_off, [rows, K], [stride_am, 1], [BLOCK_M, BLOCK_K]
                    )
                    c_desc = tl.make_tensor_descriptor(
                        c_ref + c_off, [rows, N], [stride_cm, 1], [BLOCK_M, C_COLS]
                    )
                    desc_chunk = chunk
                for ki in range(k_tiles):
                    a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
                    if B_COL_MAJOR:
                        b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
                    else:
                        b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
                    acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            else:
                offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
                mask_m = offs_m < rows
                mask_n = offs_n < N
                a_base = a_ref + a_off
                for ki in range(k_tiles):
                    offs_k = ki * BLOCK_K + offs_k0
                    a_ptrs = a_base + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
                    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
                    a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
                    b = tl.load(b_ptrs, mask=(offs_k[:, None] < K) & mask_n[None, :], other=0.0)
                    acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            if USE_TMA and (has_signal == 0):
                _store_c_tile(c_desc, acc, pid_m, pid_n, BLOCK_M, BLOCK_N, False, EPILOGUE_SUBTILE)
            else:
                offs_cm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                offs_cn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
                c_ptrs = c_ref + c_off + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
                c_mask = (offs_cm[:, None] < rows) & (offs_cn[None, :] < N)
                tl.store(c_ptrs, acc.to(c_ref.dtype.element_ty), mask=c_mask)
            if has_signal != 0:
                # every thread's stores are issued before the count; the chunk's last tile
                # publishes them all with one system-scope release (cumulative)
                tl.debug_barrier()
                done = tl.atomic_add(counter_ptr + chunk, 1, sem="acq_rel", scope="sys")
                if done == tl.cdiv(rows, BLOCK_M) * num_pid_n - 1:
                    tl.atomic_xchg(flag_ref + signal_off, 1, sem="release", scope="sys")
        else:
            tl.store(status_ptr + chunk, 1)
        tile = tl.atomic_add(next_tile_ptr, 1, sem="relaxed")


@triton.jit
def _wait_flags_kernel(
    flag_ref,  # int32
    offsets_ptr,  # int64 [count]: the flags to wait on, as offsets from flag_ref
    status_ptr,  # int32 [count]: 1 where the wait gave up
    count,
    budget_ns,
    USE_CLOCK: tl.constexpr,
):
    # one program: an SM-light wait that gates the reduction queued behind it on its stream
    for i in range(count):
        off = tl.load(offsets_ptr + i)
        if _wait_flag(flag_ref + off, budget_ns, USE_CLOCK) < 0:
            tl.store(status_ptr + i, 1)


@dataclass(frozen=True, slots=True)
class FusedChunkViews:
    """One chunk of a fused launch: ``out = a @ b`` over ``a``'s rows."""

    a: torch.Tensor  # [rows, K]
    out: torch.Tensor  # [rows, N], on this rank or a peer-mapped view
    wait: torch.Tensor | None = None  # 1-element int32 view of a flag, or None (ready)
    signal: torch.Tensor | None = None  # 1-element int32 view of a flag, or None
    name: str = ""
    """How errors name the chunk (e.g. 'rank 1 chunk 0')."""


def _offset(t: torch.Tensor, ref: torch.Tensor) -> int:
    delta = t.data_ptr() - ref.data_ptr()
    if delta % t.element_size():
        raise ValueError(
            f"fused GEMM: an operand at address {t.data_ptr():#x} is not a whole number of "
            f"{t.element_size()}-byte elements from the reference at {ref.data_ptr():#x}"
        )
    return delta // t.element_size()


def _same(name: str, views: Sequence[torch.Tensor], attr: str) -> None:
    values = {v.stride() if attr == "stride" else getattr(v, attr) for v in views}
    if len(values) > 1:
        raise ValueError(f"fused GEMM: every chunk's {name} must share one {attr}, got {values}")


def _budget_ns(timeout_s: float) -> int:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError(f"timeout_s: must be a positive number of seconds, got {timeout_s!r}")
    return int(timeout_s * 1e9)


def _alignment(offsets: Sequence[int], element_size: int) -> int:
    """The largest power of two, up to 16 bytes' worth of elements, dividing every offset."""
    align = max(1, 16 // element_size)
    while align > 1 and any(off % align for off in offsets):
        align //= 2
    return align


class _Watchdog:
    """Interpreter only: after ``timeout_s``, write -1 into ``flags`` still unset (0), so the
    kernel's spinning tiles give up (the interpreter has no clock inside a kernel)."""

    def __init__(self, flags: Sequence[torch.Tensor], timeout_s: float) -> None:
        self.flags = list(flags) if INTERPRETER else []
        self.timer = threading.Timer(timeout_s, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        for flag in self.flags:
            if int(flag.item()) == 0:
                flag.fill_(-1)

    def __enter__(self) -> _Watchdog:
        if self.flags:
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()


class _Timed:
    """What both launches share: a status tensor and the error it turns into."""

    status: torch.Tensor
    names: list[str]
    timeout_s: float

    def raise_on_timeout(self, where: str) -> None:
        """Raise :class:`FlagTimeout` if the last launch gave up on a flag (reads the
        status: on GPUs a sync, so call it once the launch is complete)."""
        marked = self.status[: len(self.names)].tolist()
        missing = [name for name, bad in zip(self.names, marked, strict=True) if bad]
        if missing:
            raise FlagTimeout(
                f"{where}: timed out after {self.timeout_s:g} s waiting on the flag of "
                + ", ".join(missing)
                + " (its data never arrived)"
            )


class FusedGemm(_Timed):
    """One fused launch, prepared once (tables on the device, so a launch can be captured in
    a CUDA graph) and issued by calling it: ``chunk.out = chunk.a @ b`` for every chunk,
    tiles in chunk order, waiting on and setting the chunks' flags (module docstring).

    ``config``: the tile (default: ``fused_configs.fused_config``, chosen per shape as the
    persistent GEMM chooses its own). ``path``: 'tma' (tensor descriptors), 'ptr' (pointer
    loads), or None: 'tma' wherever ``tma_refusal`` finds nothing against it.
    """

    def __init__(
        self,
        chunks: Sequence[FusedChunkViews],
        b: torch.Tensor,
        *,
        sm_budget: int,
        timeout_s: float,
        config: GemmConfig | None = None,
        path: Path | None = None,
    ) -> None:
        if not chunks:
            raise ValueError("fused GEMM: chunks is empty")
        a0, out0 = chunks[0].a, chunks[0].out
        _same("a", [c.a for c in chunks], "dtype")
        _same("a", [c.a for c in chunks], "stride")
        _same("out", [c.out for c in chunks], "dtype")
        _same("out", [c.out for c in chunks], "stride")
        k, n = b.shape
        for i, c in enumerate(chunks):
            if c.a.shape[1] != k or tuple(c.out.shape) != (c.a.shape[0], n):
                raise ValueError(
                    f"fused GEMM: chunk {i} has a {tuple(c.a.shape)} and out "
                    f"{tuple(c.out.shape)}; with b {tuple(b.shape)} out must be "
                    f"[{c.a.shape[0]}, {n}]"
                )
        if b.dtype != a0.dtype:
            raise ValueError(f"fused GEMM: b.dtype must equal a's ({a0.dtype}), got {b.dtype}")
        flags = [f for c in chunks for f in (c.wait, c.signal) if f is not None]
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
        # one buffer, zeroed by one memset per launch: [next tile, counters..., status...]
        self.work = torch.zeros(1 + 2 * len(chunks), dtype=torch.int32, device=device)
        self.next_tile = self.work[:1]
        self.counters = self.work[1 : 1 + len(chunks)]
        self.status = self.work[1 + len(chunks) :]
        self.waits = [c.wait for c in chunks if c.wait is not None]
        self.names = [c.name or f"chunk {i}" for i, c in enumerate(chunks)]
        self.timeout_s, self.budget_ns = timeout_s, _budget_ns(timeout_s)
        self.a_align = _alignment([_offset(c.a, self.a0) for c in chunks], a0.element_size())
        self.c_align = _alignment([_offset(c.out, self.out0) for c in chunks], out0.element_size())
        refusal = self.tma_refusal()
        if path == "tma" and refusal:
            raise ValueError(f"fused GEMM: path='tma' refused: {refusal}")
        if path is None:
            path = "ptr" if refusal else "tma"
            if refusal and device.type == "cuda" and tma_supported(device):
                _warn_once(f"fused GEMM: pointer loads (slower): {refusal}")
        self.path: Path = path
        self.b_col_major = path == "tma" and b.stride(0) == 1 and b.stride(1) != 1
        if config is None:
            total = sum(c.a.shape[0] for c in chunks)
            config = fused_config(total, n, k, len(chunks), a0.dtype, sm_budget, device, path)
        self._tabulate(config)

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
        table, tile_chunk, start = [], [], 0
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
                ]
            )
            tile_chunk += [i] * tiles
            start += tiles
        self.config = config
        self.table = torch.tensor(table, dtype=torch.int64, device=device)
        self.tile_chunk = torch.tensor(tile_chunk, dtype=torch.int32, device=device)
        self.tiles = start
        self.grid = (max(1, min(self.sm_budget, start)),)

    def __call__(self) -> None:
        """Issue the launch on the current stream (under the interpreter: run it)."""
        self.work.zero_()
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
        a0, b, out0 = self.a0, self.b, self.out0
        if self.path == "tma":
            _ensure_allocator()
        args = (
            a0, b, out0, self.flag_ref, self.table, self.tile_chunk, self.counters,
            self.status, self.next_tile, self.tiles, self.n, self.k,
            a0.stride(0), a0.stride(1), b.stride(0), b.stride(1), out0.stride(0), out0.stride(1),
            self.budget_ns,
        )  # fmt: skip
        meta = dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            A_ALIGN=self.a_align, C_ALIGN=self.c_align, USE_TMA=self.path == "tma",
            B_COL_MAJOR=self.b_col_major, EPILOGUE_SUBTILE=cfg.epilogue_subtile,
            USE_CLOCK=not INTERPRETER, INPUT_PRECISION=_PRECISION[a0.dtype],
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if warm:
            _load(_fused_gemm_kernel.warmup(*args, grid=self.grid, **meta))
        else:
            _fused_gemm_kernel[self.grid](*args, **meta)
        LAUNCH_COUNTS[f"fused_{self.path}"] += int(not warm)

    def compile(self) -> None:
        """Compile and load the kernel now, launching nothing (GPUs): a first launch that
        compiled while a peer spun on its flags would spend the peer's timeout budget."""
        if not INTERPRETER:
            self._launch(self.config, warm=True)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # global scratch for descriptors made inside a kernel (128 bytes each per program)
    return torch.empty(size, dtype=torch.int8, device="cpu" if INTERPRETER else "cuda")


def _ensure_allocator() -> None:
    """Kernels that make tensor descriptors need Triton's scratch allocator; set ficco's
    (torch's caching allocator) where none is set in this thread's context."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _load(kernel) -> None:
    """Load a compiled kernel's module and function now. Under CUDA's lazy loading a kernel
    is loaded at its first launch, and a load while another kernel spins waiting for this one
    (an owner's flag wait beside the producer GEMM) can wait for the GPU to idle: a deadlock
    that only the flag timeout ends."""
    init = getattr(kernel, "_init_handles", None)
    if init is not None:
        init()


class FlagWait(_Timed):
    """An SM-light wait (one program) on the current stream until every flag is set; what
    is queued behind it on the stream (the owner's reduction) runs once they all are."""

    def __init__(
        self, flags: Sequence[torch.Tensor], names: Sequence[str], *, timeout_s: float
    ) -> None:
        if not flags or len(flags) != len(names):
            raise ValueError(
                f"flag wait: needs one name per flag, got {len(flags)} flags, {len(names)} names"
            )
        if any(f.dtype != torch.int32 or f.numel() != 1 for f in flags):
            raise ValueError("flag wait: every flag must be a 1-element int32 view")
        # a private reference (see FusedGemm): no shared buffer is a launch argument
        self.flags = list(flags)
        self.ref = torch.zeros(1, dtype=torch.int32, device=flags[0].device)
        offsets = [_offset(f, self.ref) for f in flags]
        self.offsets = torch.tensor(offsets, dtype=torch.int64, device=self.ref.device)
        self.status = torch.zeros(len(flags), dtype=torch.int32, device=self.ref.device)
        self.names, self.timeout_s = list(names), timeout_s
        self.budget_ns = _budget_ns(timeout_s)

    def __call__(self) -> None:
        self.status.zero_()
        with _Watchdog(self.flags, self.timeout_s):
            _wait_flags_kernel[(1,)](*self._args(), USE_CLOCK=not INTERPRETER, num_warps=1)

    def _args(self) -> tuple:
        return (self.ref, self.offsets, self.status, len(self.flags), self.budget_ns)

    def compile(self) -> None:
        """Compile the kernel now, launching nothing (GPUs)."""
        if not INTERPRETER:
            _load(_wait_flags_kernel.warmup(*self._args(), grid=(1,), USE_CLOCK=True, num_warps=1))
