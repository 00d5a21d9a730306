"""CUDA IPC in place of symmetric memory, for ranks that share a GPU (``cuda_shared``).

Every rank's peer-visible buffers are opened in every process through CUDA IPC
(:func:`exchange`); :class:`IpcHandle` gives them symmetric memory's handle interface
(``get_buffer``, ``put_signal``, ``wait_signal``), so the ``ce`` and ``seg`` transports run
unchanged.

Signals keep symmetric memory's handshake. There, ``put_signal`` waits until the channel's slot
in the peer's signal pad is 0 and sets it to 1, and ``wait_signal`` waits until it is 1 and
resets it to 0 (each a one-thread kernel spinning on a compare-and-swap): a second signal on a
channel blocks until the first is consumed, and two ranks that each signal twice before they
wait block each other for ever. Here a wait is a stream memory wait (``cuStreamWaitValue32``),
which stalls its stream without a kernel, so the peer's work still gets the GPU; a write is a
stream memory write behind the stream's work. Both capture into CUDA graphs. A stream memory
wait compares (``>=``, cyclic) but cannot compare-and-swap, so a slot counts instead of
toggling: the n-th signal on a channel waits for the slot to reach ``2(n - 1)`` (n - 1
consumed) and writes ``2n - 1``; the m-th wait waits for ``2m - 1`` and writes ``2m``. The
counts start again with every run (:meth:`IpcHandle.restart`), on pads cleared while every GPU
is idle. Blocking is symmetric memory's: a signal waits for its predecessor's consumption.

A stream memory wait has no timeout, so the host bounds it (:func:`settle`): after a run it
waits for the GPU at most ``timeout_s``; past that it reads the slots of every channel the run
used, releases the stalled streams (:data:`SIGNAL_RELEASE` satisfies every wait) and raises
:class:`SignalTimeout` naming each channel whose signals and waits did not meet.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Sequence

from ficco.verdict import Unavailable

#: signal channels per peer-visible buffer (a plan's transfer tags; finer-c16 at W = 8: 128)
SIGNAL_CHANNELS = 1024
#: seconds a run's signals may keep a stream waiting before the run counts as hung: under the
#: lanes' no-progress limit (30 s), over a peer's first Triton compiles (a few seconds each)
SIGNAL_TIMEOUT_S = 20.0
#: the slots a hung run's report reads without allocating (more: allocated then)
SIGNAL_HOST_SLOTS = 4096
#: what a hung run's slots are set to: ``>=`` (cyclic) every count a run reaches
SIGNAL_RELEASE = 0x7FFFFFFF


class SignalTimeout(RuntimeError):
    """A run's signal handshakes did not complete in time (a signal never sent, or a second
    signal on a channel whose first was never consumed)."""


# --- stream memory operations ------------------------------------------------------------


@functools.cache
def _driver_wait_value32():
    """The CUDA driver's ``cuStreamWaitValue32`` (torch exposes only the write)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuStreamWaitValue32_v2
    except (OSError, AttributeError) as err:
        raise Unavailable(f"no cuStreamWaitValue32 in this CUDA driver: {err}") from None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def stream_wait_value32(flag, value: int) -> None:
    """Stall the current stream until the int32 ``flag`` (a 1-element tensor) >= ``value``
    (``cuStreamWaitValue32``'s default, cyclic: ``(int32)(flag - value) >= 0``)."""
    import torch

    stream = torch.cuda.current_stream()
    rc = _driver_wait_value32()(stream.cuda_stream, flag.data_ptr(), value, 0)
    if rc != 0:
        raise RuntimeError(f"cuStreamWaitValue32 failed: CUresult {rc}")


def stream_write_value32(flag, value: int) -> None:
    """Write ``value`` into the int32 ``flag`` (a 1-element tensor) behind the current stream's
    work (the write follows a memory fence)."""
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401 - registers the op

    torch.ops.symm_mem.stream_write_value32_(flag.view(torch.uint32), 0, value)


def reaches(value: int, target: int) -> bool:
    """Whether a slot holding ``value`` satisfies a wait for ``target`` (the driver's cyclic
    ``>=`` on 32 bits)."""
    delta = (value - target) & 0xFFFFFFFF
    return delta < 0x80000000


class StreamMemory:
    """The stream memory operations on the current stream (a test passes a host stand-in)."""

    wait = staticmethod(stream_wait_value32)
    write = staticmethod(stream_write_value32)


# --- CUDA IPC in place of symmetric memory ------------------------------------------------


def exchange(tensors: list, rank: int, world: int, group=None) -> list[list]:
    """Every rank's ``tensors``, opened in this process through CUDA IPC: ``[rank][i]`` (this
    rank's own are the tensors themselves; a peer's fp8 buffer opens as its bytes, which
    ``IpcHandle.get_buffer`` views back as the dtype asked for). A collective."""
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import reduce_tensor

    from ficco.execute.scaled import is_fp8

    # fp8 as uint8: the byte type every torch's IPC rebuild knows
    wire = [t.view(torch.uint8) if is_fp8(t) else t for t in tensors]
    handles: list = [None] * world
    dist.all_gather_object(handles, [reduce_tensor(t) for t in wire], group=group)
    return [
        list(tensors) if r == rank else [rebuild(*args) for rebuild, args in handles[r]]
        for r in range(world)
    ]


class IpcHandle:
    """One peer-visible buffer on every rank, with symmetric memory's handle interface and its
    signal handshake (module docstring). ``pads[r]``: rank r's int32 signal pad, a slot per
    (channel, source rank)."""

    def __init__(self, rank: int, world: int, buffers: list, pads: list, memory=None) -> None:
        self.rank, self.world = rank, world
        self.buffers, self.pads = buffers, pads  # per rank: the buffer, its int32 signal pad
        self.memory = memory or StreamMemory()
        self.sent: dict[tuple[int, int], int] = {}  # (dst, channel) -> signals this run
        self.awaited: dict[tuple[int, int], int] = {}  # (src, channel) -> waits this run

    def get_buffer(self, rank: int, sizes, dtype, storage_offset: int = 0):
        whole = self.buffers[rank]
        if whole.dtype != dtype:
            whole = whole.view(dtype)
        numel = 1
        for d in sizes:
            numel *= d
        return whole.reshape(-1)[storage_offset : storage_offset + numel].view(tuple(sizes))

    def _slot(self, channel: int, src: int) -> int:
        if not 0 <= channel < SIGNAL_CHANNELS:
            raise ValueError(f"channel: must be in [0, {SIGNAL_CHANNELS}), got {channel}")
        return channel * self.world + src

    def _flag(self, owner: int, channel: int, src: int):
        slot = self._slot(channel, src)
        return self.pads[owner][slot : slot + 1]

    def put_signal(self, dst_rank: int, channel: int = 0) -> None:
        """Tell ``dst_rank`` that this rank's data on ``channel`` has landed (stream-ordered),
        once its previous signal on ``channel`` was consumed."""
        n = self.sent.get((dst_rank, channel), 0) + 1
        flag = self._flag(dst_rank, channel, self.rank)
        if n > 1:  # the first signal's predecessor is the cleared pad
            self.memory.wait(flag, 2 * (n - 1))
        self.memory.write(flag, 2 * n - 1)
        self.sent[dst_rank, channel] = n

    def wait_signal(self, src_rank: int, channel: int = 0) -> None:
        """Hold the current stream until ``src_rank`` signalled ``channel``, then consume it."""
        m = self.awaited.get((src_rank, channel), 0) + 1
        flag = self._flag(self.rank, channel, src_rank)
        self.memory.wait(flag, 2 * m - 1)
        self.memory.write(flag, 2 * m)
        self.awaited[src_rank, channel] = m

    def restart(self) -> None:
        """Count signals from zero: a run starts (on pads cleared while the GPUs were idle)."""
        self.sent.clear()
        self.awaited.clear()

    def clear(self) -> None:
        """Zero this rank's signal pad (while no peer can signal: before the ranks meet)."""
        self.pads[self.rank].zero_()

    def used_slots(self) -> list[tuple[str, int, int, int]]:
        """``(kind, peer, channel, count)`` for every channel this run signalled ('put') or
        waited on ('wait')."""
        return [("put", d, c, n) for (d, c), n in sorted(self.sent.items())] + [
            ("wait", s, c, m) for (s, c), m in sorted(self.awaited.items())
        ]

    def flag_of(self, kind: str, peer: int, channel: int):
        """The slot a 'put' to ``peer`` or a 'wait' on ``peer`` uses on ``channel``."""
        if kind == "put":
            return self._flag(peer, channel, self.rank)
        return self._flag(self.rank, channel, peer)


def unmet(handle: IpcHandle, read: Callable[[object], int]) -> list[str]:
    """Every channel of ``handle``'s run whose signals and waits did not meet, in words
    (``read``: a slot's current value)."""
    found = []
    for kind, peer, channel, count in handle.used_slots():
        value = read(handle.flag_of(kind, peer, channel))
        landed, consumed = (value + 1) // 2, value // 2
        if kind == "put" and landed < count:
            found.append(
                f"signals to rank {peer} on channel {channel}: {count} put, {landed} landed, "
                f"{consumed} consumed (a signal waits until its predecessor is consumed)"
            )
        elif kind == "wait" and consumed < count:
            found.append(
                f"signals from rank {peer} on channel {channel}: {count} awaited, {landed} arrived"
            )
    return found


class _Drained:
    """Whether the current stream and ``streams`` have run everything issued so far."""

    def __init__(self, streams: Sequence) -> None:
        import torch

        self.events = []
        for stream in (torch.cuda.current_stream(), *streams):
            event = torch.cuda.Event()
            event.record(stream)
            self.events.append(event)

    def query(self) -> bool:
        return all(event.query() for event in self.events)


def settle(
    handles: Sequence[tuple[str, IpcHandle]],
    timeout_s: float,
    rank: int,
    streams: Sequence = (),
    host=None,
) -> None:
    """Wait for this rank's GPU work (the current stream and ``streams``: a run that failed
    half-issued never joined its side streams) at most ``timeout_s``; where a signal
    handshake holds it up longer, release the stalled streams and raise
    :class:`SignalTimeout` naming the buffers and channels (module docstring). ``handles``:
    (buffer name, handle); ``host``: pinned int32 room for the slots' values (allocated here
    where absent or short: allocate it beforehand, since a stalled GPU may hold up a pinned
    allocation)."""
    import torch

    done = _Drained(streams)
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            raise SignalTimeout(_release(handles, done, timeout_s, rank, host))
        time.sleep(0.0005)
    torch.cuda.synchronize()


def _on_fresh_stream(issue: Callable[[], None], timeout_s: float) -> bool:
    """Issue on the pool's next stream; True once that completed within ``timeout_s``. (A
    stalled stream may share its hardware queue with another stream: the next try takes
    another.)"""
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        issue()
    event = torch.cuda.Event()
    event.record(side)
    stop = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > stop:
            return False
        time.sleep(0.0005)
    return True


def _release(handles, done: _Drained, timeout_s: float, rank: int, host) -> str:
    """Name what hung, then set every slot the run used to :data:`SIGNAL_RELEASE` (stream
    memory writes: no kernel, no module load) until the run's streams drain. Returns the
    error's text."""
    import torch

    slots = [(h, kind, peer, ch) for _, h in handles for kind, peer, ch, _n in h.used_slots()]
    if host is None or host.numel() < len(slots):
        host = torch.empty(max(1, len(slots)), dtype=torch.int32, pin_memory=True)

    def copy() -> None:
        for i, (h, kind, peer, channel) in enumerate(slots):
            host[i : i + 1].copy_(h.flag_of(kind, peer, channel), non_blocking=True)

    if any(_on_fresh_stream(copy, 1.0) for _ in range(4)):
        values = {
            h.flag_of(kind, peer, channel).data_ptr(): int(host[i]) & 0xFFFFFFFF
            for i, (h, kind, peer, channel) in enumerate(slots)
        }
        lines = [
            f"{name}: {line}"
            for name, h in handles
            for line in unmet(h, lambda flag: values[flag.data_ptr()])
        ]
        what = "; ".join(lines) or "every channel of this rank's buffers met (a peer's run hung)"
    else:
        what = "the signal slots could not be read"

    def write() -> None:
        for h, kind, peer, channel in slots:
            stream_write_value32(h.flag_of(kind, peer, channel), SIGNAL_RELEASE)

    stop = time.monotonic() + timeout_s
    while not done.query() and time.monotonic() < stop:
        _on_fresh_stream(write, 0.05)
    stuck = "" if done.query() else "; the streams stay stalled after the release"
    return f"rank {rank}: the run's signals did not complete within {timeout_s:g} s: {what}{stuck}"
