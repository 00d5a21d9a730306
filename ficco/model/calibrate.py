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
   whole-schedule ``median_ms`` (CUDA-graph schedules), then the eager host's issue costs
   by least squares on the host-bound eager schedules, then the NCCL slowdowns on the rest.

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
    SCHEMA,
    TRANSFER_CLASSES,
    ModelParams,
)
from ficco.model.predict import Predictor, graphed
from ficco.plan import build_plan
from ficco.problem import Problem
from ficco.space import Schedule
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
    stride: int = 3,
    host_lead: bool = True,
) -> tuple[dict, dict]:
    """Contention (grid search) and host costs on whole-schedule times (``host_lead``: fit
    the eager host's lead; False: none, the host's whole issue time shows)."""
    import numpy as np

    contention = dict(base.contention)
    host = dict(base.host)
    graph_samples = [s for s in samples if graphed(s.schedule)][::stride]
    eager_samples = [s for s in samples if not graphed(s.schedule)][::stride]

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
    # eager schedules: the host's issue costs (host time is linear in them) and its lead,
    # fitted at every point of the NCCL contention grid on the GPU times that point gives
    keys = ("fixed_ms", "gemm_ms", "p2p_ms", "strided_ms", "reduce_ms", "copy_ms")
    counts, serial = [], []
    serial_of = predictor(contention, host)
    for s in eager_samples:
        plan = build_plan(s.problem, s.schedule, 0)
        row = []
        for key in keys:
            probe = dict.fromkeys(HOST_KEYS, 0.0)
            probe[key] = 1.0
            row.append(CostModel(machine, _with(base, host=probe)).host_ms(plan))
        counts.append(row)
        serial.append(sum(serial_of.parts_ms(s.problem)) if host_lead else 0.0)
    a, lead_unit = np.array(counts), np.array(serial)
    y = np.array([s.median_ms for s in eager_samples])
    best = (math.inf, 0.0, 0.0, {})
    for g in SLOWDOWN_GRID:
        for c in SLOWDOWN_GRID:
            pr = predictor(dict(contention, nccl_gemm=g, nccl_comm=c), host)
            gpu = np.array([pr.schedule_time(s.problem, s.schedule).gpu_ms for s in eager_samples])
            fitted = fit_host(a, lead_unit, gpu, y, host_lead)
            coef, lead = fitted[: len(keys)], fitted[len(keys)]
            pred = np.maximum(gpu, a @ coef - lead * lead_unit)
            score = _log_errors(list(pred), list(y))
            if score < best[0]:
                costs = {k: float(v) for k, v in zip(keys, coef, strict=True)}
                best = (score, g, c, dict(costs, lead_serial=float(lead)))
    contention.update(nccl_gemm=best[1], nccl_comm=best[2])
    host.update(best[3])
    return contention, host


def fit_host(counts, lead_unit, gpu, measured, with_lead: bool):
    """Eager host costs (per op class) and lead by robust least squares on log time:
    ``time = max(gpu, counts @ costs - lead x lead_unit)``; returns costs then lead."""
    import numpy as np
    from scipy.optimize import least_squares

    n = counts.shape[1]

    def predicted(x):
        coef = np.exp(x[:n])
        lead = math.exp(x[n]) if with_lead else 0.0
        return np.maximum(gpu, np.maximum(counts @ coef - lead * lead_unit, 1e-6))

    x0 = np.log([0.1, 0.03, 0.13, 0.16, 0.1, 0.01][:n] + [0.5])
    fit = least_squares(lambda x: np.log(predicted(x) / measured), x0, loss="soft_l1", f_scale=0.1)
    return [*np.exp(fit.x[:n]), math.exp(fit.x[n]) if with_lead else 0.0]


def fit_timed_scale(
    samples: list[Sample], machine: Machine, base: ModelParams
) -> tuple[tuple[float, float], ...]:
    """Measured time over simulated GPU time of the serial schedules (nothing overlaps there,
    so the ratio is the timed run's own cost), as the median per octave of duration."""
    bins: dict[int, list[float]] = defaultdict(list)
    pr = Predictor(machine, _with(base, timed_scale=((0.0, 1.0),)))
    for s in samples:
        if s.schedule.overlapped or not graphed(s.schedule):
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
    host_lead: bool = True,
) -> ModelParams:
    """Parameters fitted on a store's records (and a single-GPU GEMM benchmark's rows, and a
    GEMM curve's cuBLAS rows)."""
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
    contention, host = fit_overlap(samples, machine, base, host_lead=host_lead)
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
            "host_lead": host_lead,
            "fingerprints": sorted({r.get("fingerprint_id", "") for r in records} - {""}),
        },
    )


def calibrate_store(
    store: str | Path,
    machine: Machine,
    bench_gemm: str | Path | None = None,
    gemm_curve: str | Path | None = None,
    host_lead: bool = True,
) -> ModelParams:
    bench = json.loads(Path(bench_gemm).read_text()) if bench_gemm else None
    curve = json.loads(Path(gemm_curve).read_text()) if gemm_curve else None
    return calibrate(
        load_store_records(store),
        machine,
        bench,
        source=str(store),
        gemm_curve=curve,
        host_lead=host_lead,
    )
