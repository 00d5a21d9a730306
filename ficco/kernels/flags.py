"""Per-chunk flags: the wait every flag kernel shares, its timeout, and :class:`FlagWait`.

A flag is an int32: 0 = not yet, positive = arrived (set by a stream-ordered write after a
copy landed, by a peer's store, or by a fused GEMM's last tile of a chunk), negative = given
up. A wait spins with volatile loads and reads the flag with acquire semantics once it is
nonzero. On GPUs it gives up after ``timeout_s`` measured on ``%globaltimer``; under the CPU
interpreter (no clock inside a kernel) a host watchdog writes -1 into the flags still unset
once ``timeout_s`` has passed. A give-up is recorded in a status tensor, and
``raise_on_timeout`` turns it into :class:`FlagTimeout` naming the chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ficco.kernels.persistent import INTERPRETER


class FlagTimeout(RuntimeError):
    """A flag a fused kernel waited on was not set within the timeout (timed out)."""


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _acquire_load(flag_ptr, ON_GPU: tl.constexpr):
    # The flag read with acquire semantics at system scope: on GPUs a plain `ld.acquire`
    # (no read-modify-write at the memory side: the first TMA load of a waiting tile queues
    # behind this read), under the interpreter an atomic add of zero.
    if ON_GPU:
        val = tl.inline_asm_elementwise(
            "ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [flag_ptr], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip
    else:
        val = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    return val


@triton.jit
def _give_up(flag_ptr):
    # 0 -> -1 at system scope by each thread on its own (the first wins, the rest find -1).
    # Not tl.atomic_cas: on a scalar it hands one thread's result to the others through
    # shared memory between CTA barriers, and inside the spin below the threads diverge (each
    # warp reads the flag and the clock itself), so warps that saw a peer's -1 and left never
    # reach those barriers: a launch whose programs gave up together hung on one H200.
    return tl.inline_asm_elementwise(
        "{ .reg .b32 zero, gone; mov.b32 zero, 0; mov.b32 gone, -1;\n\t"
        "atom.acq_rel.sys.global.cas.b32 $0, [$1], zero, gone; }",
        "=r,l", [flag_ptr], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _wait_flag(flag_ptr, budget_ns, ON_GPU: tl.constexpr):
    # The flag's value once it is nonzero: positive = arrived, negative = given up (by a
    # tile that timed out, or by the host watchdog under the interpreter). One acquire when
    # the flag is already set; a spin of volatile loads, then the acquire, when it is not.
    # On GPUs every thread reads and decides for itself (no CTA barrier inside, so warps may
    # leave the spin at different reads); they agree on the value they return, since a flag
    # changes once during a launch (0 -> arrived, or 0 -> -1).
    val = _acquire_load(flag_ptr, ON_GPU)
    if val == 0:
        if ON_GPU:
            start = _globaltimer()
            while val == 0:
                val = tl.load(flag_ptr, volatile=True)
                elapsed = _globaltimer() - start
                if (val == 0) & (elapsed > budget_ns):
                    # give up for every tile of the chunk: the next readers see -1 at once
                    _give_up(flag_ptr)
                    val = _acquire_load(flag_ptr, ON_GPU)
        else:
            while val == 0:
                val = tl.load(flag_ptr, volatile=True)
        val = _acquire_load(flag_ptr, ON_GPU)
    return val


@triton.jit
def _ptx_effect(STATEMENT: tl.constexpr):
    # one PTX statement run for its effect (the dummy result keeps it in the program)
    return tl.inline_asm_elementwise(
        STATEMENT + "\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _proxy_fence():
    # TMA loads are async-proxy accesses: order them after the generic-proxy acquire of a flag
    return _ptx_effect("fence.proxy.async.global;")


@triton.jit
def _bulk_store_wait():
    # this thread's TMA stores done: a descriptor they use may be rewritten after this
    return _ptx_effect("cp.async.bulk.wait_group 0;")


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


def _offset(t: torch.Tensor, ref: torch.Tensor) -> int:
    delta = t.data_ptr() - ref.data_ptr()
    if delta % t.element_size():
        raise ValueError(
            f"fused GEMM: an operand at address {t.data_ptr():#x} is not a whole number of "
            f"{t.element_size()}-byte elements from the reference at {ref.data_ptr():#x}"
        )
    return delta // t.element_size()


def _budget_ns(timeout_s: float) -> int:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError(f"timeout_s: must be a positive number of seconds, got {timeout_s!r}")
    return int(timeout_s * 1e9)


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
            self.status.zero_()  # reported: the next launch starts clean
            raise FlagTimeout(
                f"{where}: timed out after {self.timeout_s:g} s waiting on the flag of "
                + ", ".join(missing)
                + " (its data never arrived)"
            )


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
