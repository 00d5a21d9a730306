"""Profile records as one pandas DataFrame: one row per measurement.

Columns (consumers rely on these names):

``pattern m n k world dtype experts``  the problem (``experts`` is <NA> for ag_gemm/gemm_rs)
``problem_key problem_name model``      ``Problem.key``, its name (``llama3-70b.fc1``), and the
                                        name before the first ``.`` (``""`` when unnamed)
``name kind verdict``                   schedule string or baseline name; ``schedule`` or
                                        ``baseline``; ``ok``, ``incorrect``, ``oom`` ...
``median_ms spread_ms samples max_abs_err tolerance``
``gemm_chunks_alone_ms comm_chunks_alone_ms gemm_in_overlap_ms comm_in_overlap_ms``
``gemm_tasks_alone_ms comm_tasks_alone_ms``
``detail fingerprint_id backend git_commit recorded_at``
signature columns                       ``t_gemm_ms t_comm_ms serial_ms ideal_ms
                                        gemm_decomp_loss comm_decomp_loss gemm_contention
                                        comm_contention speedup pct_ideal``, from
                                        :func:`ficco.measure.record.signature` with the
                                        problem's ``gemm_alone`` / ``comm_alone`` baselines
                                        (NaN where a baseline was not measured or failed)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM, signature
from ficco.profile.store import ProfileStore, Store, measurement_of

if TYPE_CHECKING:
    import pandas as pd

PROBLEM_COLUMNS = ("pattern", "m", "n", "k", "world", "dtype", "experts")
MEASUREMENT_COLUMNS = (
    "name",
    "kind",
    "verdict",
    "median_ms",
    "spread_ms",
    "samples",
    "max_abs_err",
    "tolerance",
    "gemm_chunks_alone_ms",
    "comm_chunks_alone_ms",
    "gemm_in_overlap_ms",
    "comm_in_overlap_ms",
    "gemm_tasks_alone_ms",
    "comm_tasks_alone_ms",
    "detail",
)
SIGNATURE_COLUMNS = (
    "t_gemm_ms",
    "t_comm_ms",
    "serial_ms",
    "ideal_ms",
    "gemm_decomp_loss",
    "comm_decomp_loss",
    "gemm_contention",
    "comm_contention",
    "speedup",
    "pct_ideal",
)
COLUMNS = (
    PROBLEM_COLUMNS
    + ("problem_key", "problem_name", "model")
    + MEASUREMENT_COLUMNS
    + ("fingerprint_id", "backend", "git_commit", "recorded_at")
    + SIGNATURE_COLUMNS
)


def model_of(problem_name: str) -> str:
    """``'llama3-70b.fc1'`` -> ``'llama3-70b'``; ``''`` for an unnamed problem."""
    return problem_name.split(".", 1)[0] if problem_name else ""


def baseline_times(records: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """``{problem_key: (t_gemm_ms, t_comm_ms)}`` from the ok ``gemm_alone``/``comm_alone``
    baseline records (NaN for one that is missing or failed)."""
    found: dict[str, dict[str, float]] = {}
    for r in records:
        ok = r.get("kind") == "baseline" and r.get("verdict") == "ok"
        if ok and r["name"] in (BASELINE_GEMM, BASELINE_COMM):
            found.setdefault(r["problem_key"], {}).setdefault(r["name"], r["median_ms"])
    return {
        key: (times.get(BASELINE_GEMM, math.nan), times.get(BASELINE_COMM, math.nan))
        for key, times in found.items()
    }


def frame_from_records(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame of stored records (see the module docstring for the columns)."""
    import pandas as pd

    times = baseline_times(records)
    rows = []
    for r in records:
        problem = r["problem"]
        name = problem.get("name", "") or ""
        t_gemm, t_comm = times.get(r["problem_key"], (math.nan, math.nan))
        fp = r.get("fingerprint") or {}
        row = {col: problem.get(col) for col in PROBLEM_COLUMNS}
        row.update(problem_key=r["problem_key"], problem_name=name, model=model_of(name))
        row.update({col: r.get(col) for col in MEASUREMENT_COLUMNS})
        row.update(
            fingerprint_id=r.get("fingerprint_id", ""),
            backend=fp.get("backend", ""),
            git_commit=fp.get("git_commit", ""),
            recorded_at=r.get("recorded_at", ""),
        )
        sig = signature(measurement_of(r), t_gemm, t_comm)
        if r["name"] in (BASELINE_GEMM, BASELINE_COMM):  # the parts of serial, not schedules
            sig.update(dict.fromkeys(SIGNATURE_COLUMNS[4:], math.nan))
        row.update(sig)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("m", "n", "k", "world", "samples"):
        frame[col] = frame[col].astype("int64")
    frame["experts"] = frame["experts"].astype("Int64")
    floats = [c for c in MEASUREMENT_COLUMNS if c.endswith(("_ms", "_err", "tolerance"))]
    frame[floats + list(SIGNATURE_COLUMNS)] = frame[floats + list(SIGNATURE_COLUMNS)].astype(
        "float64"
    )
    return frame


def load_frame(store: str | Path | Store) -> pd.DataFrame:
    """Every measurement of a store (a directory or a :class:`Store`) as one DataFrame."""
    if not isinstance(store, Store):
        store = ProfileStore.read(store)
    return frame_from_records(store.records())
