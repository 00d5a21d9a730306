"""The selector's dataset: one row per problem, built from a profile frame.

Input: the frame ``ficco.profile.load_frame`` returns, one row per measurement, with the
problem's columns (``pattern, m, n, k, world, dtype, experts``, and for the all-to-alls
``top_k`` and ``routing``: JSON text of the W x experts token counts, missing or empty for
uniform routing, as in frames of records written before routing was stored), ``problem_key``,
``problem_name``, ``model``, the schedule or baseline ``name``, ``kind``, ``verdict``,
``median_ms``, ``spread_ms`` (p90 - p10 of repeated timings) and signature columns.

Rules:

* Only ``kind == 'schedule'`` rows with ``verdict == 'ok'`` give times. A schedule measured
  ``incorrect`` on a problem in any run is never a candidate for that problem;
  other failures (oom, timeout, ...) only drop that run. Several ok runs of one schedule on one
  problem are summarized by the median of their medians and the largest spread.
* The **oracle** time of a problem is its fastest candidate's median.
* The **label** is the fastest candidate, with ties inside the measured noise resolved toward
  the simpler schedule: every candidate ``s`` with ``t_s - t_best <= max(noise_s,
  noise_best)`` is tied with the fastest, and the tie goes to the lowest
  ``Schedule.complexity`` (then the lower time, then the name). ``noise`` is the uncertainty
  of a median, not the scatter of single timings: ``spread / sqrt(samples)`` (for normal
  timings p90 - p10 is about 2.56 sigma and the median's standard error about
  1.25 sigma / sqrt(n), so this is about two standard errors). Without a ``samples`` column
  the spread itself is used.
* A problem with no candidate is left out and listed in ``excluded`` with the reason.

The full per-schedule times stay in ``times`` so the regret of any pick can be computed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pandas as pd

from ficco.measure.record import BASELINE_ASYNC_TP, BASELINE_COMM, BASELINE_GEMM
from ficco.problem import Problem
from ficco.space import Schedule

#: The schedule every problem can run: whole NCCL collective, then the whole cuBLAS GEMM.
SERIAL = "serial/nccl/cublas"
#: One step per peer shard, copy-engine transfers, cuBLAS (what async-TP decomposes into).
SHARD_CE = "shard/ce/cublas"

PROBLEM_COLUMNS: tuple[str, ...] = ("pattern", "m", "n", "k", "world", "dtype", "experts")
#: The all-to-alls' routing: ``top_k`` (<NA> when not stated) and ``routing`` (JSON text, or
#: None / "" for uniform). Optional in a frame: absent means uniform and unstated.
ROUTING_COLUMNS: tuple[str, ...] = ("top_k", "routing")
REQUIRED_COLUMNS: tuple[str, ...] = (
    "pattern",
    "m",
    "n",
    "k",
    "world",
    "dtype",
    "problem_key",
    "name",
    "median_ms",
)
BASELINE_NAMES = frozenset({BASELINE_GEMM, BASELINE_COMM, BASELINE_ASYNC_TP})
#: Frame columns whose values identify the environment a record was measured in.
FINGERPRINT_COLUMNS: tuple[str, ...] = ("fingerprint_id", "fingerprint", "env_id")


@dataclass(slots=True)
class Dataset:
    """Problems, their labels and every candidate's time, indexed by ``problem_key``."""

    problems: pd.DataFrame
    """One row per problem: ``pattern, m, n, k, world, dtype, experts, top_k, routing,
    problem_name, model``."""
    labels: pd.Series
    """The label schedule of each problem (fastest, ties within noise toward simpler)."""
    times: pd.DataFrame
    """problem x schedule: median ms of the ok runs; NaN where not measured ok."""
    noise: pd.DataFrame
    """problem x schedule: the tie window of the label rule, the largest
    ``spread / sqrt(samples)`` of the ok runs (ms)."""
    oracle_ms: pd.Series
    """The fastest candidate's median per problem."""
    baseline_ms: pd.DataFrame
    """problem x baseline name (``async_tp``, ``gemm_alone``, ``comm_alone``): median ms."""
    serial_ms: pd.Series
    """Reference for speedups: the frame's ``serial_ms`` (``t_gemm + t_comm``, ``ficco.measure.record``) where measured, else the ``serial/nccl/cublas`` schedule's time."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Problems left out, with the reason."""
    fingerprints: list[str] = field(default_factory=list)
    """Distinct environment fingerprint ids of the records (when the frame carries them)."""

    @property
    def keys(self) -> list[str]:
        return list(self.problems.index)

    def __len__(self) -> int:
        return len(self.problems)

    def problem(self, key: str) -> Problem:
        """The :class:`Problem` of one row, with its routing and top-k where the frame has them."""
        return problem_from_row(self.problems.loc[key])

    def problem_list(self) -> list[Problem]:
        return [problem_from_row(row) for row in self.problems.to_dict("records")]

    def subset(self, keys) -> Dataset:
        """The rows of ``keys`` (in that order)."""
        keys = list(keys)
        per_problem = (self.labels, self.times, self.noise, self.oracle_ms, self.serial_ms)
        index = self.problems.index
        if index.is_unique and all(part.index.equals(index) for part in per_problem):
            # rows aligned with the problems' (as build_dataset makes them): found once
            rows = index.get_indexer(keys)
            if (rows < 0).any():
                raise KeyError([k for k, r in zip(keys, rows, strict=True) if r < 0])
            take = lambda part: part.iloc[rows]  # noqa: E731
        else:
            take = lambda part: part.loc[keys]  # noqa: E731
        labels, times, noise, oracle_ms, serial_ms = map(take, per_problem)
        return Dataset(
            problems=take(self.problems),
            labels=labels,
            times=times,
            noise=noise,
            oracle_ms=oracle_ms,
            baseline_ms=self.baseline_ms.reindex(keys),
            serial_ms=serial_ms,
            excluded=dict(self.excluded),
            fingerprints=list(self.fingerprints),
        )

    def time_of(self, key: str, schedule: str) -> float:
        """Median ms of ``schedule`` on problem ``key``; NaN when it has no ok measurement."""
        if schedule not in self.times.columns:
            return math.nan
        return float(self.times.at[key, schedule])

    def times_of(self, keys: list[str], schedules: list) -> list[float]:
        """:meth:`time_of` of each ``(keys[i], schedules[i])``, looked up at once (KeyError
        for a key that is not a problem of this dataset)."""
        rows = self.times.index.get_indexer(keys)
        if (rows < 0).any():
            raise KeyError([k for k, r in zip(keys, rows, strict=True) if r < 0])
        cols = self.times.columns.get_indexer(schedules)
        values = self.times.to_numpy(dtype=float)
        return [
            float(values[r, c]) if c >= 0 else math.nan for r, c in zip(rows, cols, strict=True)
        ]


def _missing(value) -> bool:
    return value is None or (not isinstance(value, list | tuple | str) and pd.isna(value))


def problem_from_row(row) -> Problem:
    """A :class:`Problem` from a frame row (a Series, or a dict of one) with the
    ``PROBLEM_COLUMNS`` (and, optionally, the ``ROUTING_COLUMNS``: missing or empty means
    uniform routing, top-k unstated)."""
    experts = row.get("experts")
    experts = None if _missing(experts) else int(experts)
    top_k = row.get("top_k")
    top_k = None if _missing(top_k) else int(top_k)
    routing = row.get("routing")
    if _missing(routing) or routing == "":
        routing = None
    elif isinstance(routing, str):
        routing = json.loads(routing)
    return Problem(
        pattern=str(row["pattern"]),
        m=int(row["m"]),
        n=int(row["n"]),
        k=int(row["k"]),
        world=int(row["world"]),
        dtype=str(row["dtype"]),
        experts=experts,
        routing=routing,
        top_k=top_k,
        name=str(row.get("problem_name", "") or ""),
    )


def pick_label(times: pd.Series, noise: pd.Series) -> str:
    """The label among the measured candidates of one problem (see the module docstring).

    ``times`` and ``noise`` (the tie window of each, ms) are indexed by schedule name; NaN
    times are not candidates."""
    measured = times.dropna()
    if measured.empty:
        raise ValueError("times: no schedule was measured ok, so there is no label")
    best = measured.idxmin()
    t_best = measured[best]
    windows = noise.to_dict() if isinstance(noise, pd.Series) else dict(noise)
    n_best = _window(windows, best)
    tied = {
        name: t for name, t in measured.items() if t - t_best <= max(_window(windows, name), n_best)
    }
    return min(tied, key=lambda name: (Schedule.parse(name).complexity, tied[name], name))


def _window(values: dict, name: str) -> float:
    value = values.get(name, 0.0)
    return 0.0 if value is None or math.isnan(value) else float(value)


def _with_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"frame: missing column(s) {missing}; a profile frame has one row per measurement "
            f"with at least {list(REQUIRED_COLUMNS)}"
        )
    frame = frame.copy()
    if "experts" not in frame.columns:
        frame["experts"] = math.nan
    if "top_k" not in frame.columns:  # frames of records written before routing was stored
        frame["top_k"] = pd.NA
    if "routing" not in frame.columns:
        frame["routing"] = None
    if "kind" not in frame.columns:
        frame["kind"] = [
            "baseline" if name in BASELINE_NAMES else "schedule" for name in frame["name"]
        ]
    if "verdict" not in frame.columns:
        frame["verdict"] = "ok"
    if "spread_ms" not in frame.columns:
        frame["spread_ms"] = 0.0
    if "samples" not in frame.columns:
        frame["samples"] = 1
    if "problem_name" not in frame.columns:
        frame["problem_name"] = ""
    frame["problem_name"] = frame["problem_name"].fillna("").astype(str)
    if "model" not in frame.columns:
        frame["model"] = [
            name.split(".")[0] if name else key
            for name, key in zip(frame["problem_name"], frame["problem_key"], strict=True)
        ]
    frame["model"] = frame["model"].fillna("").astype(str)
    # An unnamed problem belongs to no model: it is its own group.
    unnamed = frame["model"] == ""
    frame.loc[unnamed, "model"] = frame.loc[unnamed, "problem_key"]
    return frame


def build_dataset(frame: pd.DataFrame) -> Dataset:
    """The :class:`Dataset` of a profile frame (one row per measurement)."""
    frame = _with_defaults(frame)
    if frame.empty:
        raise ValueError("frame: has no measurements; sweep some problems first (ficco sweep)")
    problems = (
        frame.drop_duplicates("problem_key")
        .set_index("problem_key")[[*PROBLEM_COLUMNS, *ROUTING_COLUMNS, "problem_name", "model"]]
        .sort_index()
    )
    shapes = frame.drop_duplicates(["problem_key", *PROBLEM_COLUMNS[:-1]])
    clashing = shapes["problem_key"][shapes["problem_key"].duplicated()].unique()
    if len(clashing):
        raise ValueError(
            f"frame: problem_key {clashing[0]!r} has rows with different shapes; a key names "
            "one problem"
        )

    sched = frame[frame["kind"] == "schedule"]
    for name in sched["name"].unique():
        try:
            Schedule.parse(name)
        except ValueError as err:
            raise ValueError(f"frame: row with kind 'schedule' has name {name!r}: {err}") from None
    incorrect = set(
        map(tuple, sched.loc[sched["verdict"] == "incorrect", ["problem_key", "name"]].values)
    )
    ok = sched[sched["verdict"] == "ok"]
    wrong = [
        (key, name) in incorrect for key, name in zip(ok["problem_key"], ok["name"], strict=True)
    ]
    ok = ok[~pd.Series(wrong, index=ok.index, dtype=bool)]
    ok = ok[ok["median_ms"].notna() & (ok["median_ms"] > 0)]
    grouped = ok.groupby(["problem_key", "name"])
    times = grouped["median_ms"].median().unstack().reindex(problems.index)
    samples = ok["samples"].fillna(1).clip(lower=1).astype(float)
    ok = ok.assign(noise_ms=ok["spread_ms"].fillna(0.0) / samples.pow(0.5))
    noise = ok.groupby(["problem_key", "name"])["noise_ms"].max().unstack()
    noise = noise.reindex(index=problems.index, columns=times.columns).fillna(0.0)
    times = times.reindex(columns=sorted(times.columns))
    noise = noise.reindex(columns=times.columns)

    excluded: dict[str, str] = {}
    for key in problems.index:
        if times.loc[key].isna().all():
            excluded[key] = "no schedule measured ok"
    kept = [key for key in problems.index if key not in excluded]
    labels = pd.Series(
        {key: pick_label(times.loc[key], noise.loc[key]) for key in kept}, dtype=object
    )

    base = frame[(frame["kind"] == "baseline") & (frame["verdict"] == "ok")]
    baseline_ms = (
        base.groupby(["problem_key", "name"])["median_ms"].median().unstack().reindex(kept)
        if len(base)
        else pd.DataFrame(index=pd.Index(kept, name="problem_key"))
    )
    serial_ms = times.loc[kept].get(SERIAL, pd.Series(math.nan, index=kept)).astype(float)
    if "serial_ms" in frame.columns:
        signature = frame[frame["serial_ms"].notna()].groupby("problem_key")["serial_ms"].median()
        serial_ms = signature.reindex(kept).astype(float).fillna(serial_ms)
    fingerprints: list[str] = []
    for col in FINGERPRINT_COLUMNS:
        if col in frame.columns:
            fingerprints = sorted({str(v) for v in frame[col].dropna().unique() if str(v)})
            break
    return Dataset(
        problems=problems.loc[kept],
        labels=labels.reindex(kept),
        times=times.loc[kept],
        noise=noise.loc[kept],
        oracle_ms=times.loc[kept].min(axis=1),
        baseline_ms=baseline_ms,
        serial_ms=serial_ms,
        excluded=excluded,
        fingerprints=fingerprints,
    )
