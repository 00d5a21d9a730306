"""Calibration: the cost model's parameters fitted on a profile store (numpy and scipy).

In order, each stage on what the previous ones fixed:

1. GEMM: the roofline (``costs.gemm_roofline_ms``) fitted in log space to every measured cuBLAS
   GEMM: the undecomposed GEMM of each problem (``gemm_alone``), each schedule's chunk GEMM
   (its ``gemm_tasks_alone_ms`` over its launches) and the single-GPU benchmark's rows; the log
   residual of each measured shape is kept for the nearest-neighbour correction. Triton's
   ratio to cuBLAS and its SM-budget exponent come from the single-GPU benchmark.
2. Transfers: per op class a fixed cost and an efficiency, by non-negative least squares
   (relative) of each schedule's ``comm_tasks_alone_ms`` on the terms its lowering makes.
3. The timed-run scale by duration, from the serial schedules (measured over simulated).
4. Contention and host: the copy-engine slowdowns and the graph launch cost by a grid search on
   whole-schedule ``median_ms`` (CUDA-graph schedules); then the eager host (issue costs, the
   per-iteration lead, a graph's issue time) by least squares on the store's rounds replayed
   as timed (``ficco.model.rounds``), the NCCL slowdowns by a grid search with that host, and
   the host again.

Never on the prediction path (``ficco predict`` reads the JSON this writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ficco.model.costs import CostModel, gemm_roofline_ms
from ficco.model.machine import Machine
from ficco.model.params import (
    CONTENTION_KEYS,
    HOST_KEYS,
    ISSUE_KEYS,
    SCHEMA,
    TRANSFER_CLASSES,
    ModelParams,
)
from ficco.model.predict import Predictor, graphed
from ficco.model.rounds import RoundCandidate, round_times
from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Compute, Schedule
from ficco.space.geometry import geometry

#: per-task span overheads tried (ms)
SPAN_GRID = (0.0, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008)

#: grid of slowdowns tried for contention (0: none, 1: the two halve each other)
SLOWDOWN_GRID = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


@dataclass(frozen=True, slots=True)
class Sample:
    """One schedule record of the store, reduced to what calibration uses."""

    problem: Problem
    schedule: Schedule
    median_ms: float
    gemm_tasks_alone_ms: float
    comm_tasks_alone_ms: float


def usable_schedule_record(rec: dict) -> bool:
    """An ok schedule record with a finite time and both task signatures: what calibration
    and validation use."""
    if rec.get("kind") == "baseline" or rec.get("verdict") != "ok":
        return False
    values = (rec.get("median_ms"), rec.get("gemm_tasks_alone_ms"), rec.get("comm_tasks_alone_ms"))
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def samples_from_records(records: list[dict]) -> tuple[list[Sample], dict[str, float]]:
    """Schedule samples (ok verdicts, finite timings) and each problem's ``gemm_alone`` time."""
    samples, gemm_alone = [], {}
    for rec in records:
        if rec.get("verdict") != "ok" or not math.isfinite(rec.get("median_ms", math.nan)):
            continue
        if rec.get("kind") == "baseline":
            if rec["name"] == "gemm_alone":
                gemm_alone[Problem.from_dict(rec["problem"]).key] = rec["median_ms"]
            continue
        if not usable_schedule_record(rec):
            continue
        g, c = rec["gemm_tasks_alone_ms"], rec["comm_tasks_alone_ms"]
        problem = Problem.from_dict(rec["problem"])
        samples.append(Sample(problem, Schedule.parse(rec["name"]), rec["median_ms"], g, c))
    return samples, gemm_alone


def load_store_records(store: str | Path) -> list[dict]:
    from ficco.profile import ProfileStore

    return ProfileStore.read(store).records()


# --- 1. GEMM ---


def gemm_points(
    samples: list[Sample],
    gemm_alone: dict[str, float],
    bench_rows: list[dict],
    curve_rows: list[dict] = (),
) -> dict[tuple[int, int, int], float]:
    """Measured cuBLAS time per (m, n, k): the median over every measurement of the shape
    (``curve_rows``: a GEMM curve's rows, ``{"M", "N", "K", "gemm", "median_ms"}``; its cuBLAS
    ones count)."""
    seen: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    problems = {}
    for s in samples:
        problems[s.problem.key] = s.problem
        g = geometry(s.problem, s.schedule)
        seen[(g.gemm_rows, g.gemm_cols, g.gemm_k)].append(s.gemm_tasks_alone_ms / g.gemm_launches)
    for key, ms in gemm_alone.items():
        if key in problems:
            p = problems[key]
            seen[(p.m, p.n, p.k)].append(ms)
    for row in bench_rows:
        if math.isfinite(row.get("cublas_ms", math.nan)):
            seen[(row["M"], row["N"], row["K"])].append(row["cublas_ms"])
    for row in curve_rows:
        if row.get("gemm") == "cublas" and math.isfinite(row.get("median_ms", math.nan)):
            seen[(row["M"], row["N"], row["K"])].append(row["median_ms"])
    return {k: sorted(v)[len(v) // 2] for k, v in seen.items()}


def fit_gemm(points: dict, machine: Machine, bench: dict | None) -> tuple[dict, list]:
    import numpy as np
    from scipy.optimize import least_squares

    keys = list(points)
    measured = np.array([points[k] for k in keys])
    gemm = {"tile_m": 64.0, "tile_n": 128.0, "idw_neighbors": 4.0, "idw_decay": 2.0}

    def params_of(x) -> ModelParams:
        g = dict(gemm, launch_ms=math.exp(x[0]), peak_flops_per_ms=math.exp(x[1]))
        g.update(hbm_eff=math.exp(x[2]), softmax_p=math.exp(x[3]))
        g.update(triton_vs_cublas=1.0, sm_budget_exponent=0.0)
        return _stub(g)

    def resid(x):
        p = params_of(x)
        pred = np.array([gemm_roofline_ms(p, machine, *k) for k in keys])
        return np.log(pred) - np.log(measured)

    x0 = [math.log(0.005), math.log(8e11), math.log(0.85), math.log(3.0)]
    fit = least_squares(resid, x0)
    out = params_of(fit.x).gemm
    residuals = [
        [math.log2(k[0]), math.log2(k[1]), math.log2(k[2]), -float(r)]
        for k, r in zip(keys, resid(fit.x), strict=True)
    ]
    ratios, budget_x, budget_y = [], [], []
    if bench:
        ratios = [
            r["triton_ms"] / r["cublas_ms"] for r in bench.get("rows", []) if r.get("cublas_ms")
        ]
        for row in bench.get("sm_budget", []):
            full = row["budgets"].get(str(machine.sm_count))
            for budget, entry in row["budgets"].items():
                if full and int(budget) < machine.sm_count:
                    budget_x.append(math.log(machine.sm_count / int(budget)))
                    budget_y.append(math.log(entry["ms"] / full["ms"]))
    out["triton_vs_cublas"] = float(np.median(ratios)) if ratios else 1.0
    out["sm_budget_exponent"] = (
        float(np.dot(budget_x, budget_y) / np.dot(budget_x, budget_x)) if budget_x else 1.0
    )
    return out, residuals


def _stub(
    gemm: dict,
    transfer: dict | None = None,
    contention: dict | None = None,
    host: dict | None = None,
    residuals=(),
) -> ModelParams:
    transfer = transfer or {f"{c}_{s}": 1.0 for c in TRANSFER_CLASSES for s in ("fixed_ms", "eff")}
    return ModelParams(
        machine="",
        gemm=gemm,
        transfer=transfer,
        contention=contention or dict.fromkeys(CONTENTION_KEYS, 0.0),
        host=host or dict.fromkeys(HOST_KEYS, 0.0),
        gemm_residuals=tuple(tuple(r) for r in residuals),
        timed_scale=((0.0, 1.0),),
        calibration={},
    )


# --- 2. transfers ---


def fit_transfers(samples: list[Sample], cost: CostModel) -> dict[str, float]:
    """Fixed cost and efficiency per op class from the comm side's summed task times."""
    import numpy as np
    from scipy.optimize import nnls

    columns = [f"{c}_{s}" for c in TRANSFER_CLASSES for s in ("fixed_ms", "inv_eff")]
    rows, target = [], []
    for s in samples:
        row = dict.fromkeys(columns, 0.0)
        for task in cost.lower(build_plan(s.problem, s.schedule, 0)):
            if task.lane == "compute" and task.kind == "sm" and not task.terms:
                continue  # a GEMM
            for cls, count, scaled in task.terms:
                row[f"{cls}_fixed_ms"] += count
                row[f"{cls}_inv_eff"] += scaled
        rows.append([row[c] for c in columns])
        target.append(s.comm_tasks_alone_ms)
    a, y = np.array(rows), np.array(target)
    coef, _ = nnls(a / y[:, None], np.ones(len(y)))
    out = {}
    for cls in TRANSFER_CLASSES:
        fixed = coef[columns.index(f"{cls}_fixed_ms")]
        inv = coef[columns.index(f"{cls}_inv_eff")]
        used = a[:, columns.index(f"{cls}_inv_eff")].any()
        out[f"{cls}_fixed_ms"] = float(fixed)
        # a class no sample exercised keeps the link's full rate (named in the calibration)
        out[f"{cls}_eff"] = float(1.0 / inv) if used and inv > 1e-9 else 1.0
    return out


# --- 3. contention and host ---


def _log_errors(pred: list[float], meas: list[float]) -> float:
    errs = sorted(abs(math.log(p / m)) for p, m in zip(pred, meas, strict=True))
    return errs[len(errs) // 2] + errs[int(0.9 * (len(errs) - 1))]


def fit_overlap(
    samples: list[Sample],
    machine: Machine,
    base: ModelParams,
    records: list[dict] | None = None,
    stride: int = 3,
) -> tuple[dict, dict]:
    """Contention (grid search) and host costs on whole-schedule times. The eager host is
    fitted on the store's rounds as timed (``records``, in the store's order: see
    :func:`store_round`); without records, on each eager schedule timed alone."""
    import numpy as np

    contention = dict(base.contention)
    host = dict(base.host)
    graph_samples = [s for s in samples if graphed(s.schedule, s.problem.pattern)][::stride]

    def predictor(cont: dict, hst: dict) -> Predictor:
        return Predictor(machine, _with(base, contention=cont, host=hst))

    # copy-engine contention (grid), with a graph launch cost solved at every point; first
    # the per-task span overhead, without contention
    ce = [s for s in graph_samples if s.schedule.overlapped]
    measured = np.array([s.median_ms for s in ce])
    best_span = (math.inf, 0.0)
    for span in SPAN_GRID:
        pr = predictor(contention, dict(host, graph_ms=0.0, span_ms=span))
        timed = np.array([pr.schedule_time(s.problem, s.schedule).ms for s in ce])
        launch = max(0.0, float(np.median(measured - timed)))
        best_span = min(best_span, (_log_errors(list(timed + launch), list(measured)), span))
    host["span_ms"] = best_span[1]
    best = (math.inf, 0.0, 0.0, 0.0)
    for g in SLOWDOWN_GRID:
        for c in SLOWDOWN_GRID:
            pr = predictor(dict(contention, ce_gemm=g, ce_comm=c), dict(host, graph_ms=0.0))
            timed = np.array([pr.schedule_time(s.problem, s.schedule).ms for s in ce])
            launch = max(0.0, float(np.median(measured - timed)))
            score = _log_errors(list(timed + launch), list(measured))
            best = min(best, (score, g, c, launch))
    contention.update(ce_gemm=best[1], ce_comm=best[2])
    host.update(graph_ms=best[3])
    # eager schedules: the host's issue costs, the per-iteration lead and a graph's issue
    # time on the rounds (least squares), then the NCCL slowdowns (grid) with those fixed,
    # then the host again at the chosen slowdowns
    rounds = _host_rounds(samples, records, machine, _with(base, host=host), stride)
    nccl = (1.0, 0.1)
    for refit in (True, False, True):
        if refit:
            pr = predictor(dict(contention, nccl_gemm=nccl[0], nccl_comm=nccl[1]), host)
            host.update(fit_round_host([r.at(pr) for r in rounds]))
            continue
        best = (math.inf, nccl)
        for g in SLOWDOWN_GRID:
            for c in SLOWDOWN_GRID:
                pr = predictor(dict(contention, nccl_gemm=g, nccl_comm=c), host)
                score = _round_score([r.at(pr) for r in rounds], host)
                best = min(best, (score, (g, c)))
        nccl = best[1]
    contention.update(nccl_gemm=nccl[0], nccl_comm=nccl[1])
    return contention, host


@dataclass(frozen=True)
class _HostRound:
    """One problem's round for the host fit: its candidates, each eager one's issue counts
    per class (``ISSUE_KEYS``) and, where it is a usable record, its measured median."""

    problem: Problem
    names: tuple[str, ...]
    schedules: tuple[Schedule | None, ...]
    gpu_fixed: tuple[float | None, ...]
    """Graph candidates' and baselines' times (fixed before the host fit); None: eager or
    not costed (see ``costed``)."""
    costed: tuple[bool, ...]
    counts: tuple[tuple[float, ...] | None, ...]
    measured: tuple[float | None, ...]
    rounds: int

    def at(self, pr: Predictor) -> tuple[_HostRound, list[float | None]]:
        """With the eager candidates' GPU times under ``pr``'s contention."""
        gpu = list(self.gpu_fixed)
        for i, s in enumerate(self.schedules):
            if self.counts[i] is not None:
                gpu[i] = pr.schedule_time(self.problem, s).gpu_ms
        return self, gpu


def _host_rounds(
    samples: list[Sample],
    records: list[dict] | None,
    machine: Machine,
    base: ModelParams,
    stride: int,
) -> list[_HostRound]:
    """Every ``stride``-th problem's round per pattern (with an eager schedule; each eager
    schedule alone when there are no records)."""
    pr = Predictor(machine, base)
    probes = []
    for key in ISSUE_KEYS:
        probe = dict.fromkeys(HOST_KEYS, 0.0)
        probe[key] = 1.0
        probes.append(CostModel(machine, _with(base, host=probe)))
    if records is None:  # each eager schedule alone: a round of one
        by_problem = [
            [_sample_record(s)] for s in samples if not graphed(s.schedule, s.problem.pattern)
        ]
    else:
        grouped: dict[str, list[dict]] = defaultdict(list)
        for rec in records:
            grouped[rec.get("problem_key") or Problem.from_dict(rec["problem"]).key].append(rec)
        per_pattern: dict[str, list[list[dict]]] = defaultdict(list)
        for recs in grouped.values():
            if _has_eager(recs):
                per_pattern[recs[0]["problem"]["pattern"]].append(recs)
        by_problem = [recs for group in per_pattern.values() for recs in group[::stride]]
    out = []
    for recs in by_problem:
        problem = Problem.from_dict(recs[0]["problem"])
        cands = store_round(recs, pr)
        usable = {r["name"]: r["median_ms"] for r in recs if usable_schedule_record(r)}
        schedules, gpu, costed, counts, measured = [], [], [], [], []
        for c in cands:
            s = Schedule.parse(c.name) if c.eager else None
            schedules.append(s)
            costed.append(c.gpu_ms is not None)
            if c.eager:
                plan = build_plan(problem, s, 0)
                counts.append(tuple(p.host_ms(plan) for p in probes))
                gpu.append(None)
                measured.append(usable.get(c.name))
            else:
                counts.append(None)
                gpu.append(c.gpu_ms)
                measured.append(None)
        rounds = max((r.get("samples") or 1 for r in recs), default=1)
        out.append(
            _HostRound(
                problem,
                tuple(c.name for c in cands),
                tuple(schedules),
                tuple(gpu),
                tuple(costed),
                tuple(counts),
                tuple(measured),
                int(rounds),
            )
        )
    return out


def _sample_record(s: Sample) -> dict:
    return {
        "problem": s.problem.to_dict(),
        "name": str(s.schedule),
        "kind": "schedule",
        "verdict": "ok",
        "median_ms": s.median_ms,
        "gemm_tasks_alone_ms": s.gemm_tasks_alone_ms,
        "comm_tasks_alone_ms": s.comm_tasks_alone_ms,
        "samples": 1,
    }


def _has_eager(recs: list[dict]) -> bool:
    return any(usable_schedule_record(r) and not graphed(Schedule.parse(r["name"])) for r in recs)


def _round_predictions(
    fits: list[tuple[_HostRound, list[float | None]]], host: dict
) -> tuple[list[float], list[float]]:
    """Predicted and measured medians of every measured eager candidate of the rounds."""
    pred, meas = [], []
    for r, gpu in fits:
        cands = []
        for i, name in enumerate(r.names):
            counts = r.counts[i]
            if counts is None:
                cands.append(RoundCandidate(name, gpu[i] if r.costed[i] else None))
            else:
                issue = sum(n * host[k] for n, k in zip(counts, ISSUE_KEYS, strict=True))
                cands.append(RoundCandidate(name, gpu[i], issue, eager=True))
        times = round_times(cands, host["lead_ms"], host["graph_issue_ms"], r.rounds)
        for t, m in zip(times, r.measured, strict=True):
            if m is not None and t is not None:
                pred.append(max(t, 1e-6))
                meas.append(m)
    return pred, meas


def _round_score(fits: list[tuple[_HostRound, list[float | None]]], host: dict) -> float:
    return _log_errors(*_round_predictions(fits, host))


def fit_round_host(fits: list[tuple[_HostRound, list[float | None]]]) -> dict[str, float]:
    """The eager host's issue costs (``ISSUE_KEYS``), ``lead_ms`` and ``graph_issue_ms`` by
    robust least squares on the log of the rounds' measured eager medians. A cost class no
    eager candidate issues keeps its starting value (nothing measures it). Raising the fixed
    cost, the lead and a graph's issue time together changes no time while backlogs stay
    positive: the rounds determine ``fixed_ms - lead_ms`` and ``graph_issue_ms - lead_ms``
    (what an eager schedule timed alone depends on), not each part."""
    import numpy as np
    from scipy.optimize import least_squares

    keys = (*ISSUE_KEYS, "lead_ms", "graph_issue_ms")
    issued = [
        any(
            r.counts[i] is not None and r.counts[i][k] for r, _ in fits for i in range(len(r.names))
        )
        for k in range(len(ISSUE_KEYS))
    ]
    free = [k for k in range(len(keys)) if k >= len(ISSUE_KEYS) or issued[k]]
    # bounded: the rounds' max() leaves no gradient once a graph's issue time outgrows every
    # backlog, so an unbounded fit can wander off into "no lead anywhere"
    lower = np.log([1e-4] * len(keys))[free]
    upper = np.log([2.0] * len(ISSUE_KEYS) + [0.5, 0.5])[free]
    best = None
    for lead0, issue0 in ((0.05, 0.02), (0.1, 0.1)):
        start = np.log([0.1, 0.03, 0.01, 0.13, 0.16, 0.1, 0.01, lead0, issue0])

        def host_of(x, start=start) -> dict:
            full = start.copy()
            full[free] = x
            return dict(zip(keys, (float(v) for v in np.exp(full)), strict=True))

        def resid(x, host_of=host_of):
            pred, meas = _round_predictions(fits, host_of(x))
            return np.log(np.array(pred) / np.array(meas))

        fit = least_squares(
            resid,
            start[free],
            bounds=(lower, upper),
            loss="soft_l1",
            f_scale=0.1,
            diff_step=1e-3,
            max_nfev=400,
        )
        if best is None or fit.cost < best[0]:
            best = (fit.cost, host_of(fit.x))
    return best[1]


def store_round(records: list[dict], pr: Predictor) -> list[RoundCandidate]:
    """One problem's timed round as its sweep ran it: its verified candidates in the store's
    order (the order the sweep timed them: schedules, then baselines), then the graph twins
    the sweep times beside the isolated parts (a part whose record names ``issue_graph``)."""
    problem = Problem.from_dict(records[0]["problem"])
    gemm, comm = pr.parts_ms(problem)
    parts = {"gemm_alone": gemm, "comm_alone": comm, "serial_eager": gemm + comm}
    parts["serial_graph"] = gemm + comm + pr.params.host["graph_ms"]
    cands, twins = [], []
    for rec in records:
        if rec.get("verdict") != "ok":
            continue  # never timed
        name = rec["name"]
        if rec.get("kind") == "baseline":
            cands.append(RoundCandidate(name, parts.get(name)))  # None: torch's own ops
            if name in ("gemm_alone", "comm_alone") and "issue_graph" in rec.get("extra", {}):
                twins.append(RoundCandidate(f"{name}#graph", parts[name]))
            continue
        schedule = Schedule.parse(name)
        if schedule.compute is Compute.FUSED:
            cands.append(RoundCandidate(name, None))  # no cost for in-kernel waits
            continue
        t = pr.schedule_time(problem, schedule)
        if t.graphed:
            cands.append(RoundCandidate(name, t.ms))
        else:
            cands.append(RoundCandidate(name, t.gpu_ms, t.host_ms, eager=True))
    return cands + twins


def fit_timed_scale(
    samples: list[Sample], machine: Machine, base: ModelParams
) -> tuple[tuple[float, float], ...]:
    """Measured time over simulated GPU time of the serial schedules (nothing overlaps there,
    so the ratio is the timed run's own cost), as the median per octave of duration."""
    bins: dict[int, list[float]] = defaultdict(list)
    pr = Predictor(machine, _with(base, timed_scale=((0.0, 1.0),)))
    for s in samples:
        if s.schedule.overlapped or not graphed(s.schedule, s.problem.pattern):
            continue
        gpu = pr.schedule_time(s.problem, s.schedule).gpu_ms
        bins[round(math.log2(gpu))].append(s.median_ms / gpu)
    points = [
        (float(octave), sorted(r)[len(r) // 2]) for octave, r in sorted(bins.items()) if len(r) >= 5
    ]
    return tuple(points) or ((0.0, 1.0),)


def _with(base: ModelParams, **changes) -> ModelParams:
    return dataclasses.replace(base, **changes)


def calibrate(
    records: list[dict],
    machine: Machine,
    bench_gemm: dict | None = None,
    source: str = "",
    gemm_curve: dict | None = None,
    in_rounds: bool = True,
) -> ModelParams:
    """Parameters fitted on a store's records (and a single-GPU GEMM benchmark's rows, and a
    GEMM curve's cuBLAS rows). ``in_rounds``: fit the eager host on the store's rounds as
    timed (False: on each eager schedule timed alone)."""
    samples, gemm_alone = samples_from_records(records)
    if not samples:
        raise ValueError("records: no ok schedule record with task signatures to calibrate on")
    points = gemm_points(
        samples,
        gemm_alone,
        (bench_gemm or {}).get("rows", []),
        (gemm_curve or {}).get("gemm", []),
    )
    gemm, residuals = fit_gemm(points, machine, bench_gemm)
    base = _stub(gemm, residuals=residuals)
    transfer = fit_transfers(samples, CostModel(machine, base))
    base = _with(base, transfer=transfer)
    base = _with(base, timed_scale=fit_timed_scale(samples, machine, base))
    contention, host = fit_overlap(samples, machine, base, records if in_rounds else None)
    return _with(
        base,
        machine=machine.name,
        contention=contention,
        host=host,
        calibration={
            "schema": SCHEMA,
            "source": source,
            "schedule_records": len(samples),
            "gemm_shapes": len(points),
            "gemm_curve_rows": len((gemm_curve or {}).get("gemm", [])),
            "host_in_rounds": in_rounds,
            "fingerprints": sorted({r.get("fingerprint_id", "") for r in records} - {""}),
        },
    )


def calibrate_store(
    store: str | Path,
    machine: Machine,
    bench_gemm: str | Path | None = None,
    gemm_curve: str | Path | None = None,
    in_rounds: bool = True,
) -> ModelParams:
    bench = json.loads(Path(bench_gemm).read_text()) if bench_gemm else None
    curve = json.loads(Path(gemm_curve).read_text()) if gemm_curve else None
    return calibrate(
        load_store_records(store),
        machine,
        bench,
        source=str(store),
        gemm_curve=curve,
        in_rounds=in_rounds,
    )
