"""SM-based one-shot and two-shot all-reduce over peer pointers, with value-encoded flags.

No barrier kernel per call and no host sync: each call's flags carry its *epoch*, so a flag
left over from an earlier call can never pass for this one ("Lamport" flags, as TRT-LLM,
FlashInfer and vLLM's custom all-reduce use them). Per rank, a workspace holds

=========  ====================================  ==========================================
scratch    [3 slots, 2 phases, W sources, cap]   peer-visible; source s's data lands in row s
flags      [3 slots, 2 phases, W sources, P]     peer-visible int32; source s's program p
                                                 writes the epoch of the call it belongs to
epochs     [P]                                   local int32: program p's last epoch
status     [1]                                   local int32: 1 once a wait gave up
=========  ====================================  ==========================================

Program p of a launch reads ``epochs[p]``, takes ``epoch = epochs[p] % PERIOD + 1`` and
``slot = epoch % 3``, and stores ``epochs[p] = epoch`` as its last act: the buffer index and
the expected flag value advance on the device, so a CUDA graph replays the same launch
forever. Every rank launches the same grids in the same order (same shapes), so program p's
epoch agrees across ranks call by call.

One-shot (``_one_shot_kernel``): program p pushes its blocks of the input into every peer's scratch
row ``rank`` of the slot, then (a CTA barrier, then a release store at system scope, which
is cumulative over the CTA's stores) writes ``epoch`` into that peer's flag
``[slot, 0, rank, p]``. It then waits (acquire) until its own flags ``[slot, 0, s, p]`` equal
``epoch`` for every source s, and sums the W rows in rank order in fp32 (its own input read
from ``src``), rounding once. Two-shot (``_two_shot_kernel``): the same push for slice d of the
input to its owner d (phase 0, a reduce-scatter), the owner's rank-order sum written to its
``dst`` slice and pushed to every peer (phase 1, an all-gather), then each rank copies the
peers' reduced slices from its scratch into ``dst``. Every rank's result has the same bits.

Why three slots: call e writes a peer's slot e % 3 only after this rank finished call e-1,
which needed that peer's data of call e-1, which the peer pushed after it had finished
reading call e-2 (kernels on one stream run in order). So two slots already keep writers
off data still being read; the third keeps the epoch expected in a slot unique among the
calls that can be in flight at once even where a rank runs a call ahead. A stale flag holds
``epoch - 3`` (or 0 before the slot's first use), never ``epoch``.

The fused variant (``_one_shot_rms_norm_kernel``) reduces whole rows and, in the same program, adds
the residual, stores the new residual, and writes ``rms_norm(new_residual) * weight``
(optionally as FP8 e4m3 divided by a scale), as vLLM's ``fused_add_rms_norm`` after its
all-reduce: ``new_residual = round(sum + residual)``, the norm from that rounded value in
fp32. Its two-shot twin (``_two_shot_rms_norm_kernel``) cuts whole rows, not elements, into
the W slices: each owner sums its rows, applies the same epilogue with its own residual and
weight (so every rank's must be the same: replicated, as tensor-parallel decode holds them;
FP8: it quantizes once and sends the e4m3 values, exact in the scratch's dtype), and
all-gathers both results (a phase-1 scratch row holds 2 ceil(rows / W) n elements:
:func:`norm_row_elements`). Under the interpreter both round the FP8 output to e4m3 in fp32
before its cast (the interpreter's own cast drops carries: ``_fp8_normed``), so their bits
are torch's and the GPU's round-to-nearest-even.

Waits give up: on GPUs after ``timeout_s`` on ``%globaltimer``; under the interpreter when a
host watchdog sets ``status`` (no clock inside a kernel). A give-up sets ``status`` and the
launch finishes with wrong data instead of hanging; ``LamportLaunch.raise_on_timeout`` turns it
into ``FlagTimeout``. Cross-process waits need the ranks' kernels to run at once: ranks that
share one GPU (separate processes) serialize and the waits only time out.

Phases (``PHASES``, a bitmask; a full call sets every bit): one process can play W ranks on
one device by launching every rank's first phase, then every rank's second, ... (the tests);
a real rank launches all phases at once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import triton

from ficco.kernels.flags import FlagTimeout, _budget_ns
from ficco.kernels.lamport_kernels import (  # noqa: F401 - the kernels, re-exported
    BLOCK,
    EPOCH_PERIOD,
    FP8_E4M3_MAX,
    GATHER,
    MAX_NORM_COLUMNS,
    MAX_PROGRAMS,
    ONE_SHOT_PHASES,
    PHASES_PER_SLOT,
    PUSH,
    REDUCE,
    SLOTS,
    TWO_SHOT_PHASES,
    _one_shot_kernel,
    _one_shot_rms_norm_kernel,
    _two_shot_kernel,
    _two_shot_rms_norm_kernel,
    next_epoch,
    slot_of,
)
from ficco.kernels.persistent import INTERPRETER


def _offset(t: torch.Tensor, ref: torch.Tensor) -> int:
    delta = t.data_ptr() - ref.data_ptr()
    if delta % ref.element_size():
        raise ValueError(
            f"lamport all-reduce: a buffer at {t.data_ptr():#x} is not a whole number of "
            f"{ref.element_size()}-byte elements from the reference at {ref.data_ptr():#x}"
        )
    return delta // ref.element_size()


def workspace_bytes(world: int, capacity_bytes: int) -> tuple[int, int]:
    """(scratch bytes, flag int32s) of one rank's workspace."""
    rows = SLOTS * PHASES_PER_SLOT * world
    return rows * capacity_bytes, rows * MAX_PROGRAMS


@dataclass(eq=False)
class LamportWorkspace:
    """One rank's handles on every rank's scratch and flags, and its own epochs and status.

    ``scratch[r]``: rank r's scratch, uint8 ``[workspace_bytes(...)[0]]`` (peer-visible);
    ``flags[r]``: rank r's flags, int32 (peer-visible, zero before first use and never reset
    after: a reset could erase a peer's flag already written); ``capacity_bytes``: bytes of
    one (slot, phase, source) row: the largest input (one-shot) or slice (two-shot)."""

    rank: int
    world: int
    capacity_bytes: int
    scratch: list[torch.Tensor]
    flags: list[torch.Tensor]
    epochs: torch.Tensor = field(init=False)
    status: torch.Tensor = field(init=False)
    timeout_s: float = 10.0
    _refs: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.world not in range(2, 9):
            raise ValueError(f"world: 2 .. 8 ranks, got {self.world}")
        if len(self.scratch) != self.world or len(self.flags) != self.world:
            raise ValueError("scratch, flags: one tensor per rank expected")
        scratch_bytes, flag_count = workspace_bytes(self.world, self.capacity_bytes)
        for r in range(self.world):
            if self.scratch[r].numel() * self.scratch[r].element_size() < scratch_bytes:
                raise ValueError(f"scratch[{r}]: {scratch_bytes} bytes needed")
            if self.flags[r].dtype != torch.int32 or self.flags[r].numel() < flag_count:
                raise ValueError(f"flags[{r}]: int32 [{flag_count}] needed")
        device = self.scratch[self.rank].device
        self.epochs = torch.zeros(MAX_PROGRAMS, dtype=torch.int32, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)

    def refs(self, dtype: torch.dtype) -> tuple:
        """(data_ref, scratch offsets, flag_ref, flag offsets) for ``dtype``: private
        references, so no shared buffer is itself a launch argument."""
        if dtype not in self._refs:
            device = self.scratch[self.rank].device
            data_ref = torch.zeros(1, dtype=dtype, device=device)
            flag_ref = torch.zeros(1, dtype=torch.int32, device=device)
            scratch = torch.tensor(
                [_offset(s, data_ref) for s in self.scratch], dtype=torch.int64, device=device
            )
            flags = torch.tensor(
                [_offset(f, flag_ref) for f in self.flags], dtype=torch.int64, device=device
            )
            self._refs[dtype] = (data_ref, scratch, flag_ref, flags)
        return self._refs[dtype]

    def capacity(self, dtype: torch.dtype) -> int:
        return self.capacity_bytes // torch.empty(0, dtype=dtype).element_size()

    def raise_on_timeout(self, where: str) -> None:
        """Raise :class:`FlagTimeout` if a wait gave up since the last check (a sync on
        GPUs: call it once the launches are done)."""
        if int(self.status.item()):
            self.status.zero_()
            raise FlagTimeout(
                f"{where}: timed out after {self.timeout_s:g} s waiting on a peer's flag "
                "(its data never arrived: a rank missing, or ranks that cannot run at once)"
            )


class _Watchdog:
    """Interpreter only: sets ``status`` after ``timeout_s`` so spinning programs give up."""

    def __init__(self, status: torch.Tensor, timeout_s: float) -> None:
        self.status = status
        self.timer = threading.Timer(timeout_s, lambda: status.fill_(1)) if INTERPRETER else None

    def __enter__(self):
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (one range of memory)")
    return t.view(-1)


def _programs(units: int) -> int:
    return max(1, min(MAX_PROGRAMS, units))


def all_reduce(
    ws: LamportWorkspace,
    kind: str,
    src: torch.Tensor,
    dst: torch.Tensor,
    phases: int | None = None,
    num_warps: int = 4,
) -> None:
    """``dst = sum over ranks of src``, issued on the current stream. ``kind``:
    ``LAMPORT_ONE_SHOT`` or ``LAMPORT_TWO_SHOT`` (``ficco.space.transports``); ``src``,
    ``dst``: contiguous, one shape and dtype (they may be one tensor); ``phases``: a bitmask
    of the phases to run (None: all; tests only)."""
    from ficco.space.transports import LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT

    if kind not in (LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT):
        raise ValueError(f"kind: {LAMPORT_ONE_SHOT} or {LAMPORT_TWO_SHOT}, got {kind!r}")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(f"src, dst: one shape and dtype, got {src.shape}/{src.dtype} and "
                         f"{dst.shape}/{dst.dtype}")  # fmt: skip
    flat_src, flat_dst = _flat(src, "src"), _flat(dst, "dst")
    numel = flat_src.numel()
    if numel == 0:
        return
    one_shot = kind == LAMPORT_ONE_SHOT
    row = numel if one_shot else -(-numel // ws.world)
    cap = ws.capacity(src.dtype)
    if row > cap:
        raise ValueError(
            f"lamport all-reduce: {row} elements per scratch row exceed the workspace's {cap}"
        )
    kernel, every = (
        (_one_shot_kernel, PUSH | REDUCE)
        if one_shot
        else (_two_shot_kernel, PUSH | REDUCE | GATHER)
    )
    data_ref, scratch_offs, flag_ref, flag_offs = ws.refs(src.dtype)
    grid = (_programs(triton.cdiv(row, BLOCK)),)
    with _Watchdog(ws.status, ws.timeout_s):
        kernel[grid](
            flat_src, flat_dst, numel, data_ref, scratch_offs, flag_ref, flag_offs, ws.epochs,
            ws.status, ws.rank, cap, _budget_ns(ws.timeout_s),
            WORLD=ws.world, MAXP=MAX_PROGRAMS, BLOCK=BLOCK,
            PHASES=every if phases is None else phases, ON_GPU=not INTERPRETER,
            num_warps=num_warps,
        )  # fmt: skip


def check_norm_operands(
    src: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    normed: torch.Tensor,
    new_residual: torch.Tensor,
    scale: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the operand and the rule it breaks."""
    if src.dim() != 2:
        raise ValueError(f"src: [rows, n] expected, got shape {tuple(src.shape)}")
    n = src.shape[1]
    for name, t in (("residual", residual), ("normed", normed), ("new_residual", new_residual)):
        if t.shape != src.shape:
            raise ValueError(f"{name}: shape {tuple(src.shape)} expected, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    if residual.dtype != src.dtype or new_residual.dtype != src.dtype:
        raise ValueError(f"residual, new_residual: dtype {src.dtype} expected (src's)")
    if weight.shape != (n,):
        raise ValueError(f"weight: shape ({n},) expected, got {tuple(weight.shape)}")
    if n > MAX_NORM_COLUMNS:
        raise ValueError(f"src: rows of at most {MAX_NORM_COLUMNS} elements, got {n}")
    fp8 = normed.dtype == torch.float8_e4m3fn
    if fp8 != (scale is not None):
        raise ValueError("scale: needed exactly when normed is float8_e4m3fn")
    if not fp8 and normed.dtype != src.dtype:
        raise ValueError(f"normed: dtype {src.dtype} or float8_e4m3fn expected, got {normed.dtype}")
    if scale is not None and (scale.numel() != 1 or scale.dtype != torch.float32):
        raise ValueError("scale: one fp32 element expected")


def norm_row_elements(kind: str, rows: int, n: int, world: int) -> int:
    """Elements of one scratch row the fused all-reduce + RMSNorm of ``[rows, n]`` needs:
    the whole input (one-shot), or twice a slice of ``ceil(rows / W)`` whole rows (two-shot:
    the normed rows and the new residual travel back together)."""
    from ficco.space.transports import LAMPORT_ONE_SHOT

    return rows * n if kind == LAMPORT_ONE_SHOT else 2 * -(-rows // world) * n


def all_reduce_rms_norm(
    ws: LamportWorkspace,
    src: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    normed: torch.Tensor,
    new_residual: torch.Tensor,
    scale: torch.Tensor | None = None,
    phases: int | None = None,
    kind: str | None = None,
) -> None:
    """All-reduce of ``src [rows, n]`` (``kind``: ``LAMPORT_ONE_SHOT``, the default, or
    ``LAMPORT_TWO_SHOT``), then ``new_residual = sum + residual`` and ``normed =
    rms_norm(new_residual, eps) * weight`` (``/ scale``, saturated, into FP8 e4m3 where
    ``normed`` is float8_e4m3fn). ``new_residual`` may be ``residual`` (in place). Two-shot:
    ``residual`` and ``weight`` must be the same on every rank (each owner's are used for
    its rows)."""
    from ficco.space.transports import LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT

    kind = LAMPORT_ONE_SHOT if kind is None else kind
    if kind not in (LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT):
        raise ValueError(f"kind: {LAMPORT_ONE_SHOT} or {LAMPORT_TWO_SHOT}, got {kind!r}")
    check_norm_operands(src, residual, weight, normed, new_residual, scale)
    rows, n = src.shape
    if rows == 0:
        return
    needed = norm_row_elements(kind, rows, n, ws.world)
    if needed > ws.capacity(src.dtype):
        raise ValueError(f"lamport all-reduce: {needed} elements exceed the workspace")
    data_ref, scratch_offs, flag_ref, flag_offs = ws.refs(src.dtype)
    block_n = triton.next_power_of_2(n)
    num_warps = max(1, min(16, block_n // 256))
    flags = (data_ref, scratch_offs, flag_ref, flag_offs, ws.epochs, ws.status, ws.rank)
    tail = (ws.capacity(src.dtype), _budget_ns(ws.timeout_s))
    # the scale's pointer (status's where there is none: never read without FP8)
    scale_arg = scale if scale is not None else ws.status
    with _Watchdog(ws.status, ws.timeout_s):
        if kind == LAMPORT_TWO_SHOT:
            _two_shot_rms_norm_kernel[(_programs(-(-rows // ws.world)),)](
                _flat(src, "src"), residual, weight, normed, new_residual, scale_arg, rows, n,
                float(eps), *flags, *tail, WORLD=ws.world, MAXP=MAX_PROGRAMS, BLOCK_N=block_n,
                PHASES=PUSH | REDUCE | GATHER if phases is None else phases,
                FP8=scale is not None, ON_GPU=not INTERPRETER, num_warps=num_warps,
            )  # fmt: skip
            return
        _one_shot_rms_norm_kernel[(_programs(rows),)](
            _flat(src, "src"), residual, weight, normed, new_residual, scale_arg, rows, n,
            float(eps), *flags, *tail, WORLD=ws.world, MAXP=MAX_PROGRAMS, BLOCK_N=block_n,
            PHASES=PUSH | REDUCE if phases is None else phases, FP8=scale is not None,
            ON_GPU=not INTERPRETER, num_warps=num_warps,
        )  # fmt: skip


def local_workspaces(
    world: int, capacity_bytes: int, device: torch.device | str = "cpu", timeout_s: float = 10.0
) -> list[LamportWorkspace]:
    """W workspaces in this process (ranks played by one process: tests, one-GPU checks)."""
    scratch_bytes, flag_count = workspace_bytes(world, capacity_bytes)
    scratch = [torch.empty(scratch_bytes, dtype=torch.uint8, device=device) for _ in range(world)]
    flags = [torch.zeros(flag_count, dtype=torch.int32, device=device) for _ in range(world)]
    return [
        LamportWorkspace(r, world, capacity_bytes, scratch, flags, timeout_s=timeout_s)
        for r in range(world)
    ]


def phases_of(kind: str) -> Sequence[int]:
    """The phase bits of ``kind``, in order (one process playing every rank)."""
    from ficco.space.transports import LAMPORT_ONE_SHOT

    return ONE_SHOT_PHASES if kind == LAMPORT_ONE_SHOT else TWO_SHOT_PHASES
