"""Measurements and inefficiency signatures (pure Python: no torch).

One :class:`Measurement` per (problem, schedule or baseline, run). Times are milliseconds,
per iteration the max across ranks, summarized as the median over interleaved rounds with
the spread ``p90 - p10``.

Signature, for problem P and schedule S, times isolated unless named:

=====================  ======================================================================
``t_gemm``, ``t_comm``  the undecomposed GEMM (cuBLAS) and collective (NCCL), each alone
``serial``              ``t_gemm + t_comm``; ``ideal`` = ``max(t_gemm, the fastest collective
                        alone)`` (``ficco.patterns.ideal_ms``: gemm_ar's fastest all-reduce),
                        and never below the physical floor (``ficco.measure.floor``)
``gemm_decomp_loss``    (S's GEMM chunks run alone, back to back) / ``t_gemm`` - 1
``comm_decomp_loss``    (S's comm chunks run alone) / ``t_comm`` - 1
``gemm_contention``     S's GEMM chunks inside the overlapped run / the same chunks alone - 1
``comm_contention``     same for the comm chunks
``speedup``             ``serial`` / t(S)
``pct_ideal``           (``speedup`` - 1) / (``serial``/``ideal`` - 1)
=====================  ======================================================================

Contention compares like with like: the summed spans (CUDA events around each task on its
own stream) of S's GEMM (comm) tasks in the overlapped run against the same spans when that
part runs alone, both from runs queued before the GPU starts (``*_tasks_alone_ms``; records
without them fall back to the part's time alone). The comm side holds every task that is not
a GEMM: transfers and collectives, and the local copies and reductions of the collective.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ficco.patterns import ideal_ms
from ficco.patterns.spec import BASELINE_ASYNC_TP as BASELINE_ASYNC_TP
from ficco.patterns.spec import BASELINE_COMM as BASELINE_COMM
from ficco.patterns.spec import BASELINE_GEMM as BASELINE_GEMM
from ficco.verdict import Verdict

# Names of the baselines every benchmark measures beside the schedules (defined with the
# pattern specs, whose baselines and ideal name them): gemm_alone (undecomposed cuBLAS GEMM,
# isolated: t_gemm), comm_alone (undecomposed NCCL collective, isolated: t_comm), async_tp
#: ``Measurement.extra`` key of a run whose timings mean nothing (ranks that share a GPU): its
#: value says why; such records are verdicts only, and a profile store refuses them
VERIFICATION_ONLY = "verification_only"


@dataclass(frozen=True, slots=True)
class Summary:
    median_ms: float
    spread_ms: float  # p90 - p10
    samples: int

    @classmethod
    def of(cls, samples_ms: list[float]) -> Summary:
        if not samples_ms:
            return cls(math.nan, math.nan, 0)
        ordered = sorted(samples_ms)
        if len(ordered) == 1:
            return cls(ordered[0], 0.0, 1)
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        return cls(statistics.median(ordered), deciles[-1] - deciles[0], len(ordered))


@dataclass(slots=True)
class Measurement:
    """One timed, verified run of a schedule (``kind='schedule'``) or a baseline."""

    problem: dict[str, Any]
    """``Problem.to_dict()``."""
    name: str
    """The schedule's string form, or a baseline name."""
    kind: str = "schedule"  # "schedule" | "baseline"
    verdict: str = "ok"
    """A :class:`ficco.verdict.Verdict` value."""
    median_ms: float = math.nan
    spread_ms: float = math.nan
    samples: int = 0
    rounds: int = 0
    """Timed rounds this measurement took (fixed, or chosen by ``rounds="auto"``); 0 where
    nothing was timed."""
    max_abs_err: float = math.nan
    tolerance: float = math.nan
    gemm_chunks_alone_ms: float = math.nan
    """Sum of the schedule's GEMM tasks run alone, back to back (median)."""
    comm_chunks_alone_ms: float = math.nan
    """Sum of the schedule's communication tasks run alone (median)."""
    gemm_in_overlap_ms: float = math.nan
    """Sum of the GEMM tasks' spans inside the overlapped run (per-task events, median)."""
    comm_in_overlap_ms: float = math.nan
    """Same for the communication tasks (transfers, collectives, their copies and
    reductions; not a receiver's wait for its sender)."""
    gemm_tasks_alone_ms: float = math.nan
    """Sum of the same GEMM tasks' spans when the GEMM part runs alone (the reference of
    GEMM contention)."""
    comm_tasks_alone_ms: float = math.nan
    """Same for the communication tasks run alone."""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:  # stored as the string value; an unknown verdict is refused, never kept
            self.verdict = Verdict(self.verdict).value
        except ValueError:
            known = ", ".join(v.value for v in Verdict)
            raise ValueError(f"verdict: {self.verdict!r} is not one of {known}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


def _spans_alone(m: Measurement, side: str) -> float:
    """The reference of a side's contention: its task spans run alone where measured (the
    same quantity as the spans in the overlapped run), else the part's time alone."""
    spans = getattr(m, f"{side}_tasks_alone_ms")
    return spans if not math.isnan(spans) else getattr(m, f"{side}_chunks_alone_ms")


#: The chunk geometry a signature carries (``ficco.plan.geometry``: the one definition).
GEOMETRY_FIELDS = ("chunk_bytes", "chunk_gemm_flops", "gemm_launches", "transfers")


def chunk_geometry(m: Measurement) -> dict[str, float]:
    """What the measured schedule makes of its problem, from the one chunk geometry: bytes
    of one transfer chunk, FLOPs of one GEMM launch, launches and transfers per rank (the
    decomposition a signature's losses come from). NaN for baselines."""
    if m.kind != "schedule":
        return dict.fromkeys(GEOMETRY_FIELDS, math.nan)
    # A store's records come back for every frame built from them (training builds three:
    # every round, and each half), dozens of schedules to a problem: each (problem,
    # schedule) geometry is computed once (`_geometry_values`'s cache)
    values = _geometry_values(json.dumps(m.problem, sort_keys=True), m.name)
    return dict(zip(GEOMETRY_FIELDS, values, strict=True))


@functools.lru_cache(maxsize=1 << 16)
def _geometry_values(problem_json: str, schedule: str) -> tuple[float, float, float, float]:
    """`chunk_geometry`'s values for a problem (its dict as sorted JSON) and a schedule (its
    string form: a stored record names its schedule so, the store's edge)."""
    from ficco.plan import geometry
    from ficco.problem import Problem
    from ficco.space import Schedule

    geo = geometry(Problem.from_dict(json.loads(problem_json)), Schedule.parse(schedule))
    return (
        float(geo.transfer_bytes),
        float(geo.gemm_flops),
        float(geo.gemm_launches),
        float(geo.transfers),
    )


def signature(m: Measurement, isolated_ms: Mapping[str, float]) -> dict[str, float]:
    """The inefficiency signature of a schedule's measurement given the problem's isolated
    baselines (``isolated_ms``: baseline name -> median ms; ``gemm_alone`` is ``t_gemm``,
    ``comm_alone`` is ``t_comm``, and the ideal is :func:`ficco.patterns.ideal_ms` of them
    all), with its chunk geometry (:func:`chunk_geometry`). Quantities that were not measured
    come out NaN."""

    def ratio(num: float, den: float) -> float:
        return num / den - 1 if den and not math.isnan(num) and not math.isnan(den) else math.nan

    t_gemm_ms = isolated_ms.get(BASELINE_GEMM, math.nan)
    t_comm_ms = isolated_ms.get(BASELINE_COMM, math.nan)
    serial = t_gemm_ms + t_comm_ms
    # the baselines' ideal, never below physics (``ficco.measure.floor``, where held to one)
    ideal = max(ideal_ms(m.problem["pattern"], isolated_ms), m.extra.get("floor_ms", 0.0))
    speedup = serial / m.median_ms if m.median_ms and not math.isnan(m.median_ms) else math.nan
    headroom = serial / ideal - 1 if ideal else math.nan
    return {
        **chunk_geometry(m),
        "t_gemm_ms": t_gemm_ms,
        "t_comm_ms": t_comm_ms,
        "serial_ms": serial,
        "ideal_ms": ideal,
        "gemm_decomp_loss": ratio(m.gemm_chunks_alone_ms, t_gemm_ms),
        "comm_decomp_loss": ratio(m.comm_chunks_alone_ms, t_comm_ms),
        "gemm_contention": ratio(m.gemm_in_overlap_ms, _spans_alone(m, "gemm")),
        "comm_contention": ratio(m.comm_in_overlap_ms, _spans_alone(m, "comm")),
        "speedup": speedup,
        "pct_ideal": (speedup - 1) / headroom if headroom and headroom > 0 else math.nan,
    }
