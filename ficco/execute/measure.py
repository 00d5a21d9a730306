"""Measuring one problem on one rank, for every backend: verify, capture, time, sign.

Every rank calls :func:`measure_problem` with the same arguments (it is a collective) and
gets the same rank-merged measurements. Steps:

1. Every schedule is lowered, interpreted once on fresh NaN-poisoned outputs and checked
   against the reference (``ficco.execute.verify``); a schedule that raises is recorded with
   its failure kind and the run goes on. Verdicts are merged across ranks.
2. Where the backend captures (CUDA graphs), a verified schedule is captured and its replay
   verified too: what is timed is what was checked. Every rank must agree before a graph is
   captured or replayed: a graph holding NCCL calls replayed on one rank only would wait
   forever for its peer. What ``ficco.execute.capture`` refuses (NCCL all-to-alls) stays
   eager, its ``extra['graph']`` note saying why.
3. Baselines (``ficco.execute.baselines``) are verified where they write the op's output;
   the serial baseline and the isolated parts of ``ideal`` also get captured twins.
4. Every verified candidate is timed in interleaved rounds (``ficco.execute.timing``), once
   per issue mode; the isolated parts keep the faster of their eager and graph issue, so an
   ``ideal`` that pays launch cost the replays do not pay never flatters a schedule.
5. Signatures where asked (the backend's).
"""

from __future__ import annotations

import functools
import os
import statistics
import traceback
from collections.abc import Callable, Sequence

from ficco.execute.backend import Backend, Buffers
from ficco.execute.baselines import (
    BASELINE_SERIAL_EAGER,
    BASELINE_SERIAL_GRAPH,
    GRAPHED_PART,
    ISOLATED_PARTS,
)
from ficco.execute.buffers import output_of, poison_output
from ficco.execute.buffers import poison as poison_buffer
from ficco.execute.capture import baseline_graph_refusal, graph_refusal
from ficco.execute.interpreter import interpret
from ficco.execute.options import TimingOptions
from ficco.execute.timing import time_rounds
from ficco.execute.verify import RankVerdict, check_output, judge, merge_verdicts
from ficco.measure.floor import judge_floor
from ficco.measure.record import VERIFICATION_ONLY, Measurement, Summary
from ficco.plan import Plan, build_plan
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import Verdict, classify_failure

Report = Callable[[dict], None]


def poison(plan: Plan, bufs: Buffers) -> None:
    """NaN into every non-input buffer (a scaled problem's: its moving row scales too): an
    unwritten element can never pass verification."""
    for spec in plan.buffers:
        if spec.is_input or spec.role == "index":
            continue
        if plan.problem.scaled:
            from ficco.execute.scaled import poison_scaled

            poison_scaled(plan.problem, bufs.tensors, spec.name)
        else:
            poison_buffer(bufs.tensors[spec.name])


def _failure(backend: Backend, err: Exception) -> tuple[Verdict, str]:
    if os.environ.get("FICCO_DEBUG"):
        traceback.print_exc()
    backend.recover()
    return classify_failure(err), f"rank {backend.rank}: {type(err).__name__}: {str(err)[:300]}"


def _measurement(
    problem: Problem, name: str, kind: str, merged: RankVerdict, **extra
) -> Measurement:
    return Measurement(
        problem=problem.to_dict(),
        name=name,
        kind=kind,
        verdict=merged.verdict.value,
        max_abs_err=merged.max_abs_err,
        tolerance=merged.tolerance,
        detail=merged.detail,
        extra=dict(extra),
    )


def measure_problem(
    backend: Backend,
    problem: Problem,
    schedules: Sequence[Schedule],
    seed: int,
    options: TimingOptions | None,
    report: Report,
    *,
    baselines: bool = True,
    plan_hook: Callable[[Plan], Plan] | None = None,
) -> list[Measurement]:
    """Verify, then (``options`` given) time every schedule and the baselines of one
    problem. Returns the schedules' measurements in order, then the baselines'.
    ``plan_hook`` rewrites each plan before it runs (fault injection for tests)."""
    bufs = backend.allocate(problem, seed, schedules)
    exact, plain = backend.reference(problem, bufs, seed)
    results: dict[str, Measurement] = {}
    runners: dict[str, Callable[[], None]] = {}
    traced: dict[str, Callable] = {}  # name -> interpret(prims, mode, trace), for signatures
    graph_notes: dict[str, str] = {}
    if options is not None:
        backend.pretune(problem, schedules, report)
    for index, schedule in enumerate(schedules):
        name, check, failure, detail = str(schedule), None, None, ""
        plan = None
        try:
            plan = build_plan(problem, schedule, backend.rank)
            if plan_hook is not None:
                plan = plan_hook(plan)
            prims = backend.primitives(plan, bufs, index)
            run = functools.partial(interpret, prims)
            poison(plan, bufs)
            run()
            backend.synchronize()
            prims.raise_failures()  # a flag wait that gave up on the device
            check = check_output(output_of(plan, bufs.tensors), exact, plain, problem, schedule)
            if check.ok:
                runners[name], traced[name] = run, run
        except Exception as err:  # recorded; the run goes on
            failure, detail = _failure(backend, err)
        ok = check is not None and check.ok and failure is None
        # the same on every rank, so every rank joins the all_ranks collective or none does
        wants_graph = options is not None and backend.wants_graph(options, schedule)
        refusal = graph_refusal(problem, schedule) if wants_graph else None
        if refusal is not None:  # verified and timed as issued eagerly, saying why
            graph_notes[name], wants_graph = refusal, False
        if wants_graph and backend.all_ranks(ok):
            graph_notes[name], replay = _capture_and_verify(
                backend, runners[name], plan, bufs, (exact, plain), problem, schedule
            )
            if replay is not None:
                runners[name] = replay.replay  # the bound method keeps the graph alive
        local = judge(check, failure, detail)
        if graph_notes.get(name, "").startswith("incorrect"):  # the eager run's error stays
            local = RankVerdict(
                Verdict.INCORRECT,
                local.max_abs_err,
                local.tolerance,
                f"rank {backend.rank}: {graph_notes[name]}",
            )
        merged = merge_verdicts(backend.gather(local))
        extra = {"graph": graph_notes.get(name, "eager")} if backend.can_capture else {}
        m = _measurement(problem, name, "schedule", merged, **extra)
        if m.verdict != Verdict.OK:
            runners.pop(name, None)
            traced.pop(name, None)
        results[name] = m
        report({"phase": "verified", "name": name, "verdict": m.verdict, "measurement": m})
    if options is None:
        return _noted(backend, [results[str(s)] for s in schedules])

    base = backend.baselines(problem, bufs) if baselines else {}
    for name, fn in base.items():
        check, failure, detail = None, None, ""
        try:
            fn()
            backend.synchronize()
            out = getattr(fn, "out", None)
            if out is not None:
                check = check_output(out, exact, plain, problem, Schedule())
        except Exception as err:
            failure, detail = _failure(backend, err)
        local = judge(check, failure, detail) if check or failure else RankVerdict(Verdict.OK)
        m = _measurement(problem, name, "baseline", merge_verdicts(backend.gather(local)))
        results[name] = m
        report({"phase": "verified", "name": name, "verdict": m.verdict})
        if m.verdict == Verdict.OK:
            runners[name] = fn
    part_graphs: set[str] = set()
    if backend.can_capture and options.graphs == "all" and base:
        _graph_baselines(backend, base, results, runners, part_graphs, (exact, plain), problem)

    del exact, plain
    report({"phase": "timing", "name": f"{len(runners)} candidates"})
    clock = backend.clock(options)
    for index, issue in enumerate(options.issue):
        times = time_rounds(runners, options, clock, issue)
        for name in part_graphs:
            graphed = times.pop(name + GRAPHED_PART)
            faster = statistics.median(graphed) < statistics.median(times[name])
            results[name].extra.setdefault("issue_graph", {})[issue] = (
                "graph" if faster else "eager"
            )
            if faster:
                times[name] = graphed
        for name, samples in times.items():
            summary = Summary.of(samples)
            m = results[name]
            m.extra.setdefault("issue", {})[issue] = {
                "median_ms": summary.median_ms,
                "spread_ms": summary.spread_ms,
                "samples": summary.samples,
            }
            if index == 0:
                m.median_ms, m.spread_ms = summary.median_ms, summary.spread_ms
                m.samples = m.rounds = summary.samples
                m.extra["times_ms"] = [round(x, 5) for x in samples]
                if name in part_graphs:
                    m.extra["graph"] = m.extra["issue_graph"][issue]

    # no timing faster than physics: a run that did not do the work is never ok
    judge_floor(results.values(), problem, backend.floor_machine(options))
    if options.signatures:
        graphed = {n for n, note in graph_notes.items() if note == "graph"}
        live = {n: r for n, r in traced.items() if n in runners}
        backend.signatures(results, live, graphed, options)
    return _noted(
        backend,
        [results[str(s)] for s in schedules]
        + [results[n] for n in (*base, BASELINE_SERIAL_GRAPH) if n in results],
    )


def _noted(backend: Backend, measured: list[Measurement]) -> list[Measurement]:
    """Every measurement of a backend whose timings mean nothing says so."""
    if backend.timing_note:
        for m in measured:
            m.extra[VERIFICATION_ONLY] = backend.timing_note
    return measured


def _capture_and_verify(backend, run, plan, bufs, reference, problem, schedule):
    """Capture a verified schedule and verify the replay too. Collective: the replay runs
    only where every rank captured. Returns (note, graph or None)."""
    graph, note = None, ""
    try:
        graph = backend.capture(run)
    except Exception as err:
        backend.recover()
        note = (
            f"eager (capture failed on rank {backend.rank}: {type(err).__name__}: {str(err)[:160]})"
        )
    if not backend.all_ranks(graph is not None):
        return note or "eager (capture failed on another rank)", None
    poison(plan, bufs)
    graph.replay()
    backend.synchronize()
    check = check_output(output_of(plan, bufs.tensors), *reference, problem, schedule)
    if not check.ok:
        return (
            f"incorrect graph replay (max err {check.max_abs_err:.3g} > {check.tolerance:.3g})",
            None,
        )
    return "graph", graph


def _graph_baselines(backend, base, results, runners, part_graphs, reference, problem) -> None:
    """The serial baseline captured (the fair baseline for captured schedules), and captured
    twins of the isolated parts of ``ideal`` (timed beside them; each keeps the faster).
    A baseline ``ficco.execute.capture`` keeps eager gets no twin (no ``serial_graph``), its
    note saying why."""
    refused = {name: baseline_graph_refusal(problem, name) for name in base}  # as every rank
    for name, note in refused.items():
        if note is not None:
            results[name].extra["graph"] = note
    serial_ok = (
        BASELINE_SERIAL_EAGER in results and results[BASELINE_SERIAL_EAGER].verdict == Verdict.OK
    )
    if serial_ok and refused.get(BASELINE_SERIAL_EAGER) is None:
        fn = base[BASELINE_SERIAL_EAGER]
        check, failure, detail, graph, capture_error = None, None, "", None, ""
        try:
            graph = backend.capture(fn)
        except Exception as err:
            capture_error = f"{type(err).__name__}: {str(err)[:200]}"
            backend.recover()
        everyone = backend.all_ranks(graph is not None)  # replay only where every rank captured
        try:
            if not everyone:
                raise RuntimeError(capture_error or "capture failed on another rank")
            poison_output(fn.out)
            graph.replay()
            backend.synchronize()
            check = check_output(fn.out, *reference, problem, Schedule())
        except Exception as err:
            failure = Verdict.UNAVAILABLE
            detail = f"rank {backend.rank}: capture failed: {type(err).__name__}: {str(err)[:200]}"
            backend.recover()
        merged = merge_verdicts(backend.gather(judge(check, failure, detail)))
        m = _measurement(problem, BASELINE_SERIAL_GRAPH, "baseline", merged)
        results[BASELINE_SERIAL_GRAPH] = m
        if m.verdict == Verdict.OK:
            m.extra["graph"] = "graph"
            runners[BASELINE_SERIAL_GRAPH] = graph.replay  # the bound method keeps it alive
    for name in (n for n in ISOLATED_PARTS if n in base and refused.get(n) is None):
        graph = None
        if name in runners:
            try:
                graph = backend.capture(base[name])
            except Exception:
                backend.recover()
        if backend.all_ranks(graph is not None):
            part_graphs.add(name)
            runners[name + GRAPHED_PART] = graph.replay
