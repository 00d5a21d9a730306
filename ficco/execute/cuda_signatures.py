"""CUDA inefficiency signatures: decomposition and contention of each schedule (``ficco.measure.record``).

The schedule's runner is ``interpret(primitives, mode, trace)``: ``mode`` 'gemm' or 'comm'
runs one part alone; ``trace`` collects per-task CUDA-event spans.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ficco.execute.backend import Backend
from ficco.execute.cuda_setup import RankContext
from ficco.execute.options import TimingOptions
from ficco.execute.timing import time_rounds
from ficco.measure.record import Summary


def signatures(
    backend: Backend, results: dict, runners: dict, graphed: set, opts: TimingOptions
) -> None:
    """The inefficiency signature of each schedule (``ficco.measure.record``).

    Decomposition: the schedule's GEMM-only and comm-only parts, each run alone end to end
    (captured as graphs where the schedule itself was timed as a graph replay, on every rank
    alike, so host issue cost never counts as a decomposition loss).

    Contention: per-task spans (CUDA events around each task on its own stream) of the full
    run against the same spans of the part run alone, all from runs issued while the GPU is
    held (:func:`_held_spans`): an eager run of small tasks is host-bound, and its spans would
    time the host's launches. A pushed-to receiver's wait for its sender's signal is not work
    of its own and is left out of the sums."""
    import torch
    import torch.distributed as dist

    ctx = backend.ctx
    clock = backend.clock(opts)
    for name, runner in runners.items():
        parts = {"gemm": lambda r=runner: r("gemm"), "comm": lambda r=runner: r("comm")}
        if name in graphed:
            captured = {}
            for part, fn in parts.items():
                try:
                    captured[part] = backend.capture(fn).replay
                except Exception:
                    backend.recover()
            if backend.all_ranks(len(captured) == len(parts)):
                parts = captured
        alone = time_rounds(
            parts, TimingOptions(warmup=1, rounds=opts.signature_rounds), clock, "queued"
        )
        full = _held_spans(
            backend, runner, "full", opts.signature_rounds, opts.flush_l2, opts.timeline
        )
        gemm = _held_spans(backend, runner, "gemm", opts.signature_rounds, opts.flush_l2)
        comm = _held_spans(backend, runner, "comm", opts.signature_rounds, opts.flush_l2)
        local = torch.tensor(
            [full["gemm"], full["comm"], gemm["gemm"], comm["comm"]], device=ctx.device
        )
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        m = results[name]
        m.gemm_chunks_alone_ms = Summary.of(alone["gemm"]).median_ms
        m.comm_chunks_alone_ms = Summary.of(alone["comm"]).median_ms
        m.gemm_in_overlap_ms = Summary.of(local[0].tolist()).median_ms
        m.comm_in_overlap_ms = Summary.of(local[1].tolist()).median_ms
        m.gemm_tasks_alone_ms = Summary.of(local[2].tolist()).median_ms
        m.comm_tasks_alone_ms = Summary.of(local[3].tolist()).median_ms
        retries = full["retries"] + gemm["retries"] + comm["retries"]
        if retries:
            m.extra["signature_hold_retries"] = retries
        if opts.timeline:  # the last held round of the full run
            m.extra["timeline"] = full["timeline"]


#: the longest the GPU is held while one run is issued (a run that takes longer to issue
#: is traced with the host's launches in its spans, and says so)
HOLD_LIMIT_MS = 200.0


def _sleep_cycles_per_ms(ctx: RankContext) -> float:
    """How many ``torch.cuda._sleep`` cycles last a millisecond on this GPU (measured once)."""
    import torch

    if not ctx.sleep_cycles_per_ms:
        torch.cuda._sleep(1_000_000)  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        ctx.sleep_cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)
    return ctx.sleep_cycles_per_ms


def _held_spans(
    backend: Backend,
    runner: Callable,
    mode: str,
    rounds: int,
    flush_l2: bool = True,
    keep_trace: bool = False,
) -> dict:
    """Sums of per-task spans ('gemm', 'comm': one per round) of ``runner(mode)``, each run
    issued while a spin kernel holds the GPU, so every task is queued before the first one
    starts and its span is GPU execution alone. The hold lasts twice the host's issue time
    of one run; when the host still finishes after the hold ends, the round is repeated with
    a hold twice as long (``retries`` counts them; at ``HOLD_LIMIT_MS`` the round is kept).
    ``keep_trace``: also the last round's spans as a timeline (:func:`_timeline`)."""
    import torch

    ctx = backend.ctx
    cycles_per_ms = _sleep_cycles_per_ms(ctx)
    began = time.perf_counter()
    runner(mode, [])  # warm, and time the host's issue of a traced run
    hold_ms = min(HOLD_LIMIT_MS, 2.0 * (time.perf_counter() - began) * 1e3 + 0.2)
    if ctx.shares_gpu:
        # the ranks' fence waits for the GPU, so no hold outlasts it: spans include issue
        # (the timings of ranks that share a GPU mean nothing anyway)
        hold_ms = 0.0
    torch.cuda.synchronize()
    sums: dict = {"gemm": [], "comm": [], "retries": 0}
    while len(sums["gemm"]) < rounds:
        trace: list = []
        if flush_l2:
            ctx.flush.zero_()
        if hold_ms:
            torch.cuda._sleep(int(hold_ms * cycles_per_ms))
        held = torch.cuda.Event()
        held.record()
        ctx.fence.barrier(channel=0)
        reference = torch.cuda.Event(enable_timing=True)
        reference.record()  # every lane forks from this stream after it
        runner(mode, trace)
        covered = not held.query()  # still held when the host finished issuing
        # every rank decides alike whether this round counts (the ranks run it together)
        short = not backend.all_ranks(covered) and 0 < hold_ms < HOLD_LIMIT_MS
        torch.cuda.synchronize()
        if short:
            hold_ms = min(HOLD_LIMIT_MS, 2.0 * hold_ms)
            sums["retries"] += 1
            continue
        for kind in ("gemm", "comm"):
            sums[kind].append(sum(s.elapsed_time(e) for _, k, s, e, _ in trace if k == kind))
        if keep_trace:
            sums["timeline"] = _timeline(backend.rank, covered, reference, trace)
    return sums


def _timeline(rank: int, covered: bool, reference, trace: list) -> dict:
    """One held run's per-task spans in ms from ``reference`` (recorded after the start
    barrier, before any task), with each task's lane and kind (``ficco.measure.timeline``)."""
    spans = [
        {
            "task": task_id,
            "lane": lane,
            "kind": kind,
            "start_ms": reference.elapsed_time(start),
            "end_ms": reference.elapsed_time(end),
        }
        for task_id, kind, start, end, lane in trace
    ]
    return {"rank": rank, "hold_covered_issue": covered, "spans": spans}
