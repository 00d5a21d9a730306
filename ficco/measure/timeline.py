"""A schedule's timeline: one run's per-task GPU spans, where its time goes, and a picture.

The CUDA signature pass records it (``TimingOptions(signatures=True, timeline=True)``): its last
held full run (issued while the GPU is held, so each span is GPU execution); ``extra['timeline']``
holds ``{"rank", "hold_covered_issue", "spans": [{"task", "lane", "kind", "start_ms",
"end_ms"}, ...]}`` with times from a reference event recorded before any task.

:func:`breakdown` splits the run's makespan (first start to last end) into parts that add up
to it exactly, against the ideal ``max(GEMM alone, collective alone)``:

``head_ms``     before the first GEMM starts (communication nothing hides)
``gemm_ms``     the union of the GEMM spans (its excess over the undecomposed GEMM alone is
                the decomposition and contention loss)
``stall_ms``    between the first GEMM's start and the last GEMM's end, no GEMM running
                (the compute stream waiting for a chunk)
``tail_ms``     after the last GEMM ends (the last chunk's communication or reduction)

Kind 'wait' spans (a pushed-to receiver waiting for its sender's signal) are not work and
count in neither union. Pure Python apart from :func:`plot` (matplotlib).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("gemm", "comm", "wait")
#: lanes drawn top to bottom (others after them, by name)
LANE_ORDER = ("compute", "comm", "comm_hi", "signal", "signal_hi")
_SPAN_KEYS = ("task", "lane", "kind", "start_ms", "end_ms")


def check_timeline(timeline: object, where: str = "timeline") -> dict:
    """``timeline`` if it is a recorded timeline; raises ValueError naming what is wrong."""
    if not isinstance(timeline, dict) or not isinstance(timeline.get("spans"), list):
        raise ValueError(f"{where}: expected an object with a list 'spans'")
    for i, span in enumerate(timeline["spans"]):
        if not isinstance(span, dict) or any(key not in span for key in _SPAN_KEYS):
            raise ValueError(f"{where}: spans[{i}] needs the keys {', '.join(_SPAN_KEYS)}")
        if span["kind"] not in KINDS:
            raise ValueError(
                f"{where}: spans[{i}].kind must be one of {KINDS}, got {span['kind']!r}"
            )
        start, end = span["start_ms"], span["end_ms"]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (start, end)):
            raise ValueError(f"{where}: spans[{i}]: start_ms and end_ms must be finite numbers")
        if end < start:
            raise ValueError(f"{where}: spans[{i}]: end_ms {end} is before start_ms {start}")
    if not timeline["spans"]:
        raise ValueError(f"{where}: no spans")
    return timeline


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


@dataclass(frozen=True, slots=True)
class Breakdown:
    makespan_ms: float
    head_ms: float
    gemm_ms: float
    stall_ms: float
    tail_ms: float
    comm_ms: float
    """The union of the communication spans (overlapping the GEMMs or not)."""
    overlap_ms: float
    """Time a GEMM and a communication task ran at once."""

    def to_dict(self) -> dict:
        return asdict(self)


def breakdown(timeline: dict) -> Breakdown:
    """Where one run's time goes; ``head + gemm + stall + tail == makespan``."""
    spans = check_timeline(timeline)["spans"]
    work = [s for s in spans if s["kind"] != "wait"]
    if not work:
        raise ValueError("timeline: only waits, no work")
    first = min(s["start_ms"] for s in work)
    last = max(s["end_ms"] for s in work)
    gemm = _union([(s["start_ms"], s["end_ms"]) for s in work if s["kind"] == "gemm"])
    comm = _union([(s["start_ms"], s["end_ms"]) for s in work if s["kind"] == "comm"])
    overlap = _length(
        _union([(max(a, c), min(b, d)) for a, b in gemm for c, d in comm if max(a, c) < min(b, d)])
    )
    if not gemm:  # nothing but communication: all of it is exposed
        return Breakdown(last - first, last - first, 0.0, 0.0, 0.0, _length(comm), 0.0)
    gemm_ms = _length(gemm)
    head, tail = gemm[0][0] - first, last - gemm[-1][1]
    stall = (gemm[-1][1] - gemm[0][0]) - gemm_ms
    return Breakdown(last - first, head, gemm_ms, stall, tail, _length(comm), overlap)


def lanes_of(timeline: dict) -> list[str]:
    """The timeline's lanes in drawing order."""
    seen = {s["lane"] for s in check_timeline(timeline)["spans"]}
    known = [lane for lane in LANE_ORDER if lane in seen]
    return known + sorted(seen - set(known))


def plot(rows: list[dict], path: str | Path) -> Path:
    """One panel per row (``{"title", "timeline", "ideal_ms"?, "gemm_alone_ms"?}``): each
    lane's spans by kind, the ideal as a line, the breakdown in the panel's label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows: nothing to draw")
    colors = {"gemm": "#3b6fb6", "comm": "#e08a2c", "wait": "#c8c8c8"}
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 1.0 + 1.5 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows, strict=True):
        timeline = row["timeline"]
        lanes = lanes_of(timeline)
        parts = breakdown(timeline)
        first = min(s["start_ms"] for s in timeline["spans"])
        for y, lane in enumerate(lanes):
            for kind in KINDS:
                bars = [
                    (s["start_ms"] - first, s["end_ms"] - s["start_ms"])
                    for s in timeline["spans"]
                    if s["lane"] == lane and s["kind"] == kind
                ]
                if bars:
                    ax.broken_barh(bars, (y - 0.35, 0.7), color=colors[kind], label=kind)
        ideal = row.get("ideal_ms")
        if ideal is not None and math.isfinite(ideal):
            ax.axvline(ideal, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        alone = row.get("gemm_alone_ms")
        stretch = (
            f", GEMM stretch {parts.gemm_ms - alone:.3f}"
            if alone is not None and math.isfinite(alone)
            else ""
        )
        ax.set_title(
            f"{row['title']}: {parts.makespan_ms:.3f} ms = head {parts.head_ms:.3f} + GEMM "
            f"{parts.gemm_ms:.3f} + stalls {parts.stall_ms:.3f} + tail {parts.tail_ms:.3f}"
            f"{stretch}" + (f" (ideal {ideal:.3f}, dashed)" if ideal else ""),
            fontsize=8,
            loc="left",
        )
    axes[-1, 0].set_xlabel("ms from the run's first task")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[0, 0].legend(unique.values(), unique.keys(), fontsize=7, loc="upper right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
