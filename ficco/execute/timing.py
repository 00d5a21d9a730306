"""The timing protocol, for every backend.

Warm up; then interleave the candidates round by round (A B C A B C ...) so drift hits all
of them; the backend's clock prepares each iteration (CUDA: L2 flush, barriers; CPU: a
barrier) and times it (CUDA events; host ``perf_counter``); per iteration the max across
ranks; each candidate's median and p90 - p10 spread (``ficco.measure.record.Summary``).

``rounds="auto"``: every candidate gets ``min_rounds``; then, while any candidate's median
is not known to ``target_rel_ci`` and it has fewer than ``max_rounds``, one more round over
*those* candidates (still interleaved: whole rounds over every candidate short of the
target). The confidence interval of the median is distribution-free, from order statistics:
for ``n`` sorted samples ``x(1) <= ... <= x(n)``, ``[x(j), x(n+1-j)]`` with the largest ``j``
whose two-sided binomial tail ``2 * P(Binomial(n, 1/2) < j)`` is at most ``1 - confidence``
covers the median with at least that probability (none exists below 6 samples at 95%: the
interval is then unbounded). A candidate is done when ``(x(n+1-j) - x(j)) / 2 <=
target_rel_ci * median``. Every rank decides on the same max-across-ranks samples, so all
ranks run the same rounds.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from typing import Protocol

from ficco.execute.options import TimingOptions


class Clock(Protocol):
    """A backend's way of timing one iteration."""

    def prepare(self, issue: str) -> None:
        """Before one timed iteration: flush, align ranks (``issue``: 'queued'/'synced')."""

    def time(self, fn: Callable[[], None]) -> object:
        """Run ``fn`` once, timed; returns a pending sample that :meth:`collect` resolves."""

    def collect(self, pending: dict[str, list]) -> dict[str, list[float]]:
        """Milliseconds per pending sample, each the max across ranks (a collective)."""

    def synchronize(self) -> None:
        """Wait for everything issued so far."""


def median_ci(samples: list[float], confidence: float) -> tuple[float, float]:
    """The distribution-free confidence interval of the median (see the module docstring);
    ``(-inf, inf)`` when too few samples give one."""
    n = len(samples)
    ordered = sorted(samples)
    alpha = 1.0 - confidence
    tail, j = 0.0, 0
    for i in range(n // 2 + 1):  # tail = P(B < i+1) = sum_{t<=i} C(n, t) / 2^n
        tail += math.comb(n, i) / 2.0**n
        if 2 * tail > alpha:
            break
        j = i + 1
    if j == 0:
        return (-math.inf, math.inf)
    return ordered[j - 1], ordered[n - j]


def needs_more(samples: list[float], options: TimingOptions) -> bool:
    """Whether a candidate with these samples gets another round under ``rounds="auto"``."""
    if len(samples) >= options.max_rounds:
        return False
    if len(samples) < options.min_rounds:
        return True
    lo, hi = median_ci(samples, options.confidence)
    median = statistics.median(samples)
    if not math.isfinite(lo) or not math.isfinite(hi) or median <= 0:
        return True
    return (hi - lo) / 2 > options.target_rel_ci * median


def time_rounds(
    candidates: dict[str, Callable[[], None]],
    options: TimingOptions,
    clock: Clock,
    issue: str = "queued",
    *,
    rotate: bool = False,
    shuffle: int | None = None,
) -> dict[str, list[float]]:
    """Interleaved rounds over ``candidates``; per candidate its per-iteration times (ms,
    max across ranks), one per round it took. A collective: every rank calls it alike.
    ``rotate``: round r starts at the r-th candidate (A B C, B C A, ...), so each round
    starts elsewhere (within a round a candidate still follows the same one). ``shuffle``
    (a seed, alike on every rank): each round in its own random order, so no candidate
    follows the same one round after round (a launch can run slower after a particular
    predecessor)."""
    names = list(candidates)
    for _ in range(options.warmup):
        for name in names:
            candidates[name]()
    clock.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in names}
    active, rounds, round_no = names, options.first_rounds, 0
    while active:
        pending: dict[str, list] = {name: [] for name in active}
        for _ in range(rounds):
            shift = round_no % len(active) if rotate else 0
            order = active[shift:] + active[:shift]
            if shuffle is not None:
                order = random.Random(shuffle * 1_000_003 + round_no).sample(active, len(active))
            for name in order:
                clock.prepare(issue)
                pending[name].append(clock.time(candidates[name]))
            round_no += 1
        for name, got in clock.collect(pending).items():
            samples[name].extend(got)
        if not options.auto:
            break
        active, rounds = [n for n in active if needs_more(samples[n], options)], 1
    return samples


def warm_then_rounds(
    fns: dict[str, Callable[[], None]],
    interleaved: Callable[[dict[str, Callable[[], None]], int], dict[str, list[float]]],
    rounds_for: Callable[[float], int],
    reference: str,
) -> tuple[dict[str, list[float]], int]:
    """A benchmark row's timing: every candidate once (compiles, library heuristics, clocks),
    two ``interleaved`` rounds whose median for ``reference`` (1 ms where it is not among
    them) sets the round count, ``rounds_for(ms)``, then that many rounds: (times, rounds)."""
    for fn in fns.values():
        fn()
    warm = interleaved(fns, 2)
    rounds = rounds_for(statistics.median(warm[reference]) if reference in warm else 1.0)
    return interleaved(fns, rounds), rounds


def device_events(fn: Callable[[], None]):
    """``(start, end)`` CUDA events recorded around ``fn`` on the current stream (read once
    the device has synchronized): the one way a launch is timed on the GPU."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start, end


class RanksClock:
    """The ranks of ``group`` (None: every rank) timing whole steps, no executor: before each
    iteration every rank waits for its device and the ranks meet at a barrier (the step's
    own issue cost lies inside the sample, as under synced issue); CUDA events around it on
    a GPU, the host's ``perf_counter`` on a CPU; each sample the max across ranks (one
    all-reduce per `collect`). The CPU backend times with it, and benchmarks of whole steps
    (``scripts/bench_block.py``, ``bench_decode.py``, ``bench_moe.py``) through
    `time_rounds`."""

    def __init__(self, device=None, group=None) -> None:
        import torch

        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.group = group
        self.cuda = self.device.type == "cuda"

    def prepare(self, issue: str) -> None:
        import torch.distributed as dist

        self.synchronize()
        dist.barrier(group=self.group)

    def time(self, fn: Callable[[], None]):
        if self.cuda:
            return device_events(fn)
        import time

        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def collect(self, pending: dict[str, list]) -> dict[str, list[float]]:
        import torch
        import torch.distributed as dist

        names = list(pending)
        if not names:
            return {}
        self.synchronize()
        local = torch.tensor(
            [
                [s.elapsed_time(e) for s, e in pending[n]] if self.cuda else pending[n]
                for n in names
            ],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.group)
        return {name: local[i].tolist() for i, name in enumerate(names)}

    def synchronize(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)


class DeviceClock:
    """One CUDA device, no ranks: events around each launch, after an optional L2 flush (a
    write over ``flush``, a scratch tensor larger than the L2) and a GPU sleep of
    ``cover_cycles`` that the host's enqueue hides behind (so host launch cost stays out of
    the events). The host waits for the GPU every ``sync_every`` iterations (1: each launch
    alone on an idle queue; more: the host queues a batch ahead). ``stream``: where the
    launch and its events go (after the current stream's work; default: the current
    stream). Benchmarks of single kernels and copies use it with `time_rounds`."""

    def __init__(self, flush=None, cover_cycles: int = 0, sync_every: int = 1, stream=None) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every: must be >= 1, got {sync_every}")
        self.flush, self.cover_cycles, self.sync_every, self.count = (
            flush,
            int(cover_cycles),
            sync_every,
            0,
        )
        self.stream = stream

    def prepare(self, issue: str) -> None:
        import torch

        if self.count % self.sync_every == 0:
            torch.cuda.synchronize()
            if self.cover_cycles:
                torch.cuda._sleep(self.cover_cycles)
        self.count += 1
        if self.flush is not None:
            self.flush.zero_()

    def time(self, fn: Callable[[], None]):
        if self.stream is None:
            return device_events(fn)
        import torch

        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            return device_events(fn)

    def collect(self, pending: dict[str, list]) -> dict[str, list[float]]:
        self.synchronize()
        return {name: [s.elapsed_time(e) for s, e in got] for name, got in pending.items()}

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()


# Host time to enqueue one timed launch, with margin: a Triton `matmul` took ~130 us to enqueue
# on an H100 (cuBLAS 18 us), plus the flush and two events. A batch's GPU sleep covers this
# many per launch, so no kernel of a few microseconds starts late behind its start event (on
# the H100, a 3 ms sleep for 30 launches let host gaps into a few decode shapes' events).
HOST_US_PER_LAUNCH = 250.0


class LaunchTimer:
    """Single kernels on one GPU, timed without their host launch cost: interleaved rounds
    (`time_rounds`, order rotated) of per-launch CUDA events on a `DeviceClock`, an L2 flush
    (a write of max(2 x L2, 128 MB)) before every launch, the rounds in batches that the host
    queues behind a GPU sleep as long as the batch's enqueue (`HOST_US_PER_LAUNCH` per launch,
    at least `head_start_ms`). The benchmarks and the kernel tuners share it: do_bench, which
    times back-to-back launches from an idle queue, ranked microsecond kernels by their host
    time (profiles/h100/NOTES_gemm.md)."""

    def __init__(self, batch_rounds: int = 6, head_start_ms: float = 3.0) -> None:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
        # allocated per call, not held: a process that tuned once keeps no 128 MB tensor
        # (the caching allocator reuses the block for its next tensors)
        self.flush_bytes = max(2 * l2, 128 << 20)
        self.batch_rounds = batch_rounds
        self.cycles_per_ms = self._cycles_per_ms()
        self.sleep_cycles = int(head_start_ms * self.cycles_per_ms)

    @staticmethod
    def _cycles_per_ms() -> float:
        import torch

        torch.cuda._sleep(1000)  # warm the sleep kernel up
        start, end = device_events(lambda: torch.cuda._sleep(2_000_000))
        torch.cuda.synchronize()
        return 2_000_000 / max(start.elapsed_time(end), 1e-3)

    def interleaved(
        self, fns: dict[str, Callable[[], None]], rounds: int, shuffle: int | None = None
    ) -> dict[str, list[float]]:
        """Per candidate its ``rounds`` launch times (ms); ``shuffle``: `time_rounds`'."""
        import torch

        launches = self.batch_rounds * len(fns)
        cover = max(
            self.sleep_cycles, int(launches * HOST_US_PER_LAUNCH / 1e3 * self.cycles_per_ms)
        )
        flush = torch.empty(self.flush_bytes, dtype=torch.int8, device="cuda")
        clock = DeviceClock(flush, cover, launches)
        return time_rounds(
            fns, TimingOptions(warmup=0, rounds=rounds), clock, rotate=True, shuffle=shuffle
        )

    def medians(self, fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
        """Per candidate its median launch time (ms) over ``rounds`` interleaved rounds."""
        return {name: statistics.median(ts) for name, ts in self.interleaved(fns, rounds).items()}


_launch_timers: dict[int, LaunchTimer] = {}


def launch_timer() -> LaunchTimer:
    """The current CUDA device's `LaunchTimer`, made once (the sleep calibration)."""
    import torch

    index = torch.cuda.current_device()
    if index not in _launch_timers:
        _launch_timers[index] = LaunchTimer()
    return _launch_timers[index]
