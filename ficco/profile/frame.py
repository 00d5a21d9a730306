"""Profile records as one pandas DataFrame: one row per measurement.

Columns (consumers rely on these names):

``pattern m n k world dtype experts``  the problem (``experts`` is <NA> for ag_gemm/gemm_rs)
``top_k routing``                       all-to-alls: experts per token (<NA> when not stated)
                                        and the W x experts token counts as JSON text (None
                                        for uniform routing, and in records that predate it)
``problem_key problem_name model``      ``Problem.key``, its name (``llama3-70b.fc1``), and the
                                        name before the first ``.`` (``""`` when unnamed)
``name kind verdict``                   schedule string or baseline name; ``schedule`` or
                                        ``baseline``; ``ok``, ``incorrect``, ``oom`` ...
``median_ms spread_ms samples max_abs_err tolerance``
``gemm_chunks_alone_ms comm_chunks_alone_ms gemm_in_overlap_ms comm_in_overlap_ms``
``gemm_tasks_alone_ms comm_tasks_alone_ms``
``detail fingerprint_id backend git_commit recorded_at``
``device``                              what measured it, from the record's fingerprint:
                                        ``2x NVIDIA H200 (cuda)``, ``host x86_64 (cpu)``
signature columns                       ``t_gemm_ms t_comm_ms serial_ms ideal_ms
                                        gemm_decomp_loss comm_decomp_loss gemm_contention
                                        comm_contention speedup pct_ideal``, from
                                        :func:`ficco.measure.record.signature` with the
                                        problem's ``gemm_alone`` / ``comm_alone`` baselines
                                        (and gemm_ar's symmetric-memory all-reduces alone,
                                        for its ideal; NaN where a baseline was not
                                        measured or failed),
                                        baselines of the same fingerprint only

A store whose records carry more than one fingerprint (machines or software stacks mixed,
e.g. records copied in from another GPU) is refused by :func:`load_frame` unless the caller
picks one (:func:`pick_fingerprint`): ranking schedules on a mix of hardware is wrong without
a word. :func:`frame_from_records` keeps them all, apart by ``fingerprint_id`` (the report
draws each machine on its own).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.measure.record import BASELINE_GEMM, signature
from ficco.patterns import spec_of
from ficco.profile.store import Store, measurement_of

if TYPE_CHECKING:
    import pandas as pd

PROBLEM_COLUMNS = ("pattern", "m", "n", "k", "world", "dtype", "experts")
ROUTING_COLUMNS = ("top_k", "routing")
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
    + ROUTING_COLUMNS
    + ("problem_key", "problem_name", "model")
    + MEASUREMENT_COLUMNS
    + ("fingerprint_id", "backend", "git_commit", "recorded_at", "device")
    + SIGNATURE_COLUMNS
)


class MixedFingerprints(ValueError):
    """Records of more than one fingerprint, and no pick among them."""


def model_of(problem_name: str) -> str:
    """``'llama3-70b.fc1'`` -> ``'llama3-70b'``; ``''`` for an unnamed problem."""
    return problem_name.split(".", 1)[0] if problem_name else ""


def device_of(fp: dict[str, Any]) -> str:
    """``'2x NVIDIA H200 (cuda)'``, ``'host x86_64 (cpu)'``: what a fingerprint measured on."""
    backend = fp.get("backend") or "?"
    if fp.get("gpu"):
        return f"{fp.get('gpu_count') or '?'}x {fp['gpu']} ({backend})"
    return f"host {fp.get('host_cpu') or '?'} ({backend})"


def baseline_times(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """``{(problem_key, fingerprint_id): {baseline: median ms}}`` of the ok isolated-part
    baseline records: ``gemm_alone`` and the pattern's collectives alone (its spec's
    ``comm_alone``; a missing or failed one is absent)."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        ok = r.get("kind") == "baseline" and r.get("verdict") == "ok"
        if ok and r["name"] in isolated_parts(r["problem"]["pattern"]):
            key = (r["problem_key"], r.get("fingerprint_id", ""))
            found.setdefault(key, {}).setdefault(r["name"], r["median_ms"])
    return found


def isolated_parts(pattern: str) -> tuple[str, ...]:
    """The baselines a pattern's signature reads: the GEMM alone and its collectives alone."""
    return (BASELINE_GEMM, *spec_of(pattern).comm_alone)


def frame_from_records(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame of stored records (see the module docstring for the columns)."""
    import pandas as pd

    times = baseline_times(records)
    rows = []
    for r in records:
        problem = r["problem"]
        name = problem.get("name", "") or ""
        key = (r["problem_key"], r.get("fingerprint_id", ""))
        isolated = times.get(key, {})
        fp = r.get("fingerprint") or {}
        row = {col: problem.get(col) for col in PROBLEM_COLUMNS}
        routing = problem.get("routing")
        row.update(
            top_k=problem.get("top_k"),
            routing=json.dumps(routing, separators=(",", ":")) if routing else None,
        )
        row.update(problem_key=r["problem_key"], problem_name=name, model=model_of(name))
        row.update({col: r.get(col) for col in MEASUREMENT_COLUMNS})
        row.update(
            fingerprint_id=r.get("fingerprint_id", ""),
            backend=fp.get("backend", ""),
            git_commit=fp.get("git_commit", ""),
            recorded_at=r.get("recorded_at", ""),
            device=device_of(fp),
        )
        sig = signature(measurement_of(r), isolated)
        if r["name"] in isolated_parts(problem["pattern"]):  # the parts, not schedules
            sig.update(dict.fromkeys(SIGNATURE_COLUMNS[4:], math.nan))
        row.update(sig)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("m", "n", "k", "world", "samples"):
        frame[col] = frame[col].astype("int64")
    frame["experts"] = frame["experts"].astype("Int64")
    frame["top_k"] = frame["top_k"].astype("Int64")
    floats = [c for c in MEASUREMENT_COLUMNS if c.endswith(("_ms", "_err", "tolerance"))]
    frame[floats + list(SIGNATURE_COLUMNS)] = frame[floats + list(SIGNATURE_COLUMNS)].astype(
        "float64"
    )
    return frame


def load_frame(store: str | Path | Store, fingerprint: str | None = None) -> pd.DataFrame:
    """Every measurement of a store (a directory, a database URL or a :class:`Store`) as one
    DataFrame, of one fingerprint: MixedFingerprints when the records carry several and
    ``fingerprint`` picks none (see :func:`pick_fingerprint`)."""
    from ficco.profile.stores import open_store

    if isinstance(store, Store):
        records, source = store.records(), store.location
    else:
        with open_store(store) as opened:
            records, source = opened.records(), opened.location
    return pick_fingerprint(frame_from_records(records), fingerprint, source=f"store {source}")


def fingerprint_counts(frame: pd.DataFrame) -> list[tuple[str, str, int]]:
    """``(fingerprint id, device, records)`` of each fingerprint in ``frame``, most first."""
    ids = frame["fingerprint_id"].fillna("").astype(str)
    devices = frame["device"] if "device" in frame.columns else frame.get("backend", ids)
    counts = ids.value_counts()
    described = dict(zip(ids, devices.fillna("").astype(str), strict=True))
    return [(fp, described.get(fp, ""), int(n)) for fp, n in counts.items()]


def pick_fingerprint(
    frame: pd.DataFrame, fingerprint: str | None = None, *, source: str = "the frame"
) -> pd.DataFrame:
    """The rows of one fingerprint.

    ``fingerprint`` None: ``frame`` itself when its records carry at most one fingerprint,
    else MixedFingerprints naming each (id, device, record count) and how to pick. A given
    ``fingerprint`` that no record carries is a ValueError naming the ones there."""
    counts = fingerprint_counts(frame)
    listing = "; ".join(f"{fp or '(none)'}: {dev or '?'}, {n} records" for fp, dev, n in counts)
    if fingerprint is not None:
        if fingerprint not in {fp for fp, _, _ in counts}:
            raise ValueError(
                f"fingerprint: {fingerprint!r} is not a fingerprint of {source}; its records "
                f"carry {listing or 'none'}"
            )
        picked = frame[frame["fingerprint_id"].fillna("").astype(str) == fingerprint]
        return picked.reset_index(drop=True)
    if len(counts) > 1:
        first = counts[0][0]
        raise MixedFingerprints(
            f"{source}: its records come from {len(counts)} machines or software stacks "
            f"(fingerprints {listing}); ranking schedules on a mix of hardware is wrong. Pick "
            f"one: fingerprint={first!r} in Python, --fingerprint {first} on the command line"
        )
    return frame
