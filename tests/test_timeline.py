"""Timelines: the breakdown adds up to the makespan, bad input is refused, the picture and
the script's redraw work without a GPU; the timing option needs the signature pass."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ficco.execute import TimingOptions
from ficco.measure.timeline import breakdown, check_timeline, lanes_of, plot

ROOT = Path(__file__).resolve().parents[1]


def span(task, lane, kind, start, end):
    return {"task": task, "lane": lane, "kind": kind, "start_ms": start, "end_ms": end}


#: a two-chunk pull: comm 0-1 (head), GEMM 1-3, comm 1-2.5 (hidden), a stall 3-3.5 while
#: the compute stream waits, GEMM 3.5-5, a reduction 5-5.75 (tail); a wait span counts nowhere
PIPELINE = {
    "rank": 0,
    "hold_covered_issue": True,
    "spans": [
        span(0, "comm", "comm", 0.0, 1.0),
        span(1, "compute", "gemm", 1.0, 3.0),
        span(2, "comm", "comm", 1.0, 3.5),
        span(3, "signal", "wait", 0.0, 6.0),
        span(4, "compute", "gemm", 3.5, 5.0),
        span(5, "signal", "comm", 5.0, 5.75),
    ],
}


def test_breakdown_adds_up_and_places_the_gap():
    parts = breakdown(PIPELINE)
    assert parts.makespan_ms == pytest.approx(5.75)  # the wait span is not work
    assert parts.head_ms == pytest.approx(1.0)
    assert parts.gemm_ms == pytest.approx(3.5)
    assert parts.stall_ms == pytest.approx(0.5)
    assert parts.tail_ms == pytest.approx(0.75)
    assert parts.head_ms + parts.gemm_ms + parts.stall_ms + parts.tail_ms == pytest.approx(
        parts.makespan_ms
    )
    assert parts.comm_ms == pytest.approx(4.25)  # 0-3.5 and 5-5.75
    assert parts.overlap_ms == pytest.approx(2.0)  # 1-3 (GEMM) within 0-3.5 (comm)


def test_a_serial_run_exposes_everything_after_its_gemm():
    serial = {"spans": [span(0, "compute", "gemm", 0.0, 2.0), span(1, "compute", "comm", 2.0, 3.0)]}
    parts = breakdown(serial)
    assert (parts.head_ms, parts.stall_ms, parts.tail_ms) == (0.0, 0.0, 1.0)
    assert parts.overlap_ms == 0.0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"spans": "x"}, "list 'spans'"),
        ({"spans": []}, "no spans"),
        ({"spans": [{"task": 0}]}, r"spans\[0\] needs the keys"),
        ({"spans": [span(0, "compute", "idle", 0, 1)]}, r"spans\[0\].kind"),
        ({"spans": [span(0, "compute", "gemm", 2, 1)]}, "before start_ms"),
        ({"spans": [span(0, "compute", "gemm", 0, float("nan"))]}, "finite"),
    ],
)
def test_bad_timelines_are_refused_naming_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        check_timeline(bad)


def test_lanes_are_drawn_compute_first():
    assert lanes_of(PIPELINE) == ["compute", "comm", "signal"]


def test_plot_writes_a_png(tmp_path):
    path = plot(
        [{"title": "demo", "timeline": PIPELINE, "ideal_ms": 4.0, "gemm_alone_ms": 3.2}],
        tmp_path / "t.png",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_script_redraws_a_saved_report_without_a_gpu(tmp_path):
    report = {
        "shapes": [
            {
                "problem_key": "ag_gemm:m8192:n10240:k8192:w2:bf16",
                "ideal_ms": 4.0,
                "gemm_alone_ms": 3.2,
                "schedules": [
                    {"schedule": "finer-c2-m/ce/cublas", "timeline": PIPELINE},
                    {"schedule": "serial/nccl/cublas", "verdict": "ok"},  # no timeline: skipped
                ],
            }
        ]
    }
    saved = tmp_path / "timeline.json"
    saved.write_text(json.dumps(report))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "timeline.py"), "--from-json", str(saved),
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finer-c2-m/ce/cublas: 5.750 ms = head 1.000 + GEMM 3.500 + stalls 0.500" in done.stdout
    assert "serial/nccl/cublas" not in done.stdout
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_timeline_needs_the_signature_pass():
    assert TimingOptions(signatures=True, timeline=True).timeline
    with pytest.raises(ValueError, match="timeline: needs signatures=True"):
        TimingOptions(timeline=True)
