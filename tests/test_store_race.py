"""Racing writers on one local store: several processes, one record per key, none lost."""

import json
import multiprocessing
import warnings
from collections import Counter

import pytest

from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile import RECORDS_FILE, ProfileStore, StoreWarning, load_frame, open_store

FP = {
    "backend": "cuda",
    "gpu": "NVIDIA H200",
    "gpu_count": 2,
    "sm_count": 132,
    "driver": "580.1",
    "cuda": "13.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "nccl": "2.28.9",
    "git_commit": "abc",
}
PROBLEMS = [
    Problem(pattern="ag_gemm", m=64 * (i + 1), n=32, k=16, world=2, dtype="fp32", name=f"t.p{i}")
    for i in range(3)
]
NAMES = ["gemm_alone", "comm_alone", "serial/nccl/cublas", "shard/ce/cublas", "shard/nccl/cublas"]
WRITERS = 4


def measurement(problem: Problem, name: str, writer: int) -> Measurement:
    kind = "baseline" if name.endswith("_alone") else "schedule"
    return Measurement(
        problem=problem.to_dict(),
        name=name,
        kind=kind,
        median_ms=1.0 + writer,
        samples=3,
        detail=f"writer {writer}",
    )


def race_writer(spec: str, writer: int, barrier, results) -> None:
    """Like a sweep: ask done(), measure, append; the barrier makes every writer find each key
    not done before any of them appends it, so all of them race for every key. ``spec``: a
    store directory or database URL."""
    store = open_store(spec, {**FP, "git_commit": f"w{writer}"})
    written = 0
    for problem in PROBLEMS:
        for name in NAMES:
            fresh = (problem.key, name) not in store.done()
            barrier.wait()
            if fresh:
                stored = store.append(measurement(problem, name, writer))
                written += stored["detail"] == f"writer {writer}"
    store.close()
    results.put((writer, written, store.races_lost))


def race(spec: str) -> list[tuple[int, int, int]]:
    """Run :func:`race_writer` in WRITERS processes; their (writer, written, races lost)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WRITERS, timeout=30)  # a writer that dies breaks it, not hangs it
    results = ctx.Queue()
    procs = [
        ctx.Process(target=race_writer, args=(spec, w, barrier, results)) for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    return [results.get(timeout=5) for _ in range(WRITERS)]


def check_one_record_each(outcome: list[tuple[int, int, int]], records: list[dict]) -> None:
    """Each key written by one writer, seen there by the others; one record per key."""
    keys = len(PROBLEMS) * len(NAMES)
    assert sum(written for _, written, _ in outcome) == keys  # each key written by one writer
    assert sum(lost for _, _, lost in outcome) == (WRITERS - 1) * keys  # the others saw it there
    counts = Counter((r["problem_key"], r["name"], r["fingerprint_id"]) for r in records)
    assert len(counts) == keys and set(counts.values()) == {1}
    assert {(p.key, n) for p in PROBLEMS for n in NAMES} == {(k, n) for k, n, _ in counts}


def test_racing_writers_leave_exactly_one_record_per_key(tmp_path):
    path = tmp_path / "store"
    outcome = race(str(path))
    lines = (path / RECORDS_FILE).read_text().splitlines()
    check_one_record_each(outcome, [json.loads(line) for line in lines])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn, corrupt or duplicate line
        frame = load_frame(path)
    assert len(frame) == len(PROBLEMS) * len(NAMES)


def test_a_writer_cuts_the_torn_line_of_a_killed_writer_before_appending(tmp_path):
    problem = PROBLEMS[0]
    store = ProfileStore.open(tmp_path / "s", FP)
    store.append(measurement(problem, "gemm_alone", 0))
    records = tmp_path / "s" / RECORDS_FILE
    good = records.read_text()
    with records.open("a") as fh:  # another writer killed mid-line
        fh.write(good[:50])
    with pytest.warns(StoreWarning, match="torn last line"):
        store.append(measurement(problem, "comm_alone", 0))
    store.close()
    lines = records.read_text().splitlines()
    assert lines[0] == good.strip() and len(lines) == 2
    assert json.loads(lines[1])["name"] == "comm_alone"


def test_a_reader_sees_other_writers_records_and_a_late_append_keeps_the_first(tmp_path):
    problem = PROBLEMS[0]
    writer = ProfileStore.open(tmp_path / "s", FP)
    writer.append(measurement(problem, "gemm_alone", 0))
    reader = ProfileStore.read(tmp_path / "s")
    other = ProfileStore.open(tmp_path / "s", FP)
    assert len(reader) == 1 and (problem.key, "gemm_alone") in other.done()
    assert (problem.key, "comm_alone") not in writer.done()  # writer goes on to measure it
    other.append(measurement(problem, "comm_alone", 1))
    assert len(reader) == 2 and reader.records()[1]["detail"] == "writer 1"
    stored = writer.append(measurement(problem, "comm_alone", 0))
    assert stored["detail"] == "writer 1" and writer.races_lost == 1
    with pytest.raises(ValueError, match="already stored"):  # now known here: a caller's bug
        writer.append(measurement(problem, "comm_alone", 0))
    writer.close()
    other.close()
    assert [r["detail"] for r in ProfileStore.read(tmp_path / "s").records()] == [
        "writer 0",
        "writer 1",
    ]


def test_keys_learned_while_appending_are_lost_races_not_errors(tmp_path):
    """record_baselines asks done() once, then appends each baseline: the first append reads
    another writer's records of both, and the second must not be refused as a duplicate."""
    problem = PROBLEMS[0]
    mine = ProfileStore.open(tmp_path / "s", FP)
    assert mine.done() == set()
    other = ProfileStore.open(tmp_path / "s", FP)
    for name in ("gemm_alone", "comm_alone"):
        other.append(measurement(problem, name, 1))
    for name in ("gemm_alone", "comm_alone"):
        assert mine.append(measurement(problem, name, 0))["detail"] == "writer 1"
    assert mine.races_lost == 2 and len(mine) == 2
    mine.close()
    other.close()


# --- claims: racing sweeps measure each problem once ----------------------------------------


def test_a_claim_is_exclusive_names_its_holder_and_is_removed_when_released(tmp_path):
    import os

    first = ProfileStore.open(tmp_path / "s", FP)
    second = ProfileStore.open(tmp_path / "s", FP)  # another open file: another writer
    key = PROBLEMS[0].key
    with first.claim(key) as mine:
        assert mine.held
        other = second.claim(key)
        assert not other.held and f"pid {os.getpid()} on " in other.holder
        with second.claim(PROBLEMS[1].key) as another:
            assert another.held  # other problems stay free
    assert not mine.held
    assert not list((tmp_path / "s" / "claims").iterdir())
    with second.claim(key) as again:
        assert again.held
    first.close()
    second.close()


CLAIM_AND_WAIT = """
import sys, time
from ficco.profile import open_store
store = open_store(sys.argv[1], {fp!r})
claim = store.claim(sys.argv[2])
print("held" if claim.held else "not held", flush=True)
time.sleep(120)
"""


def check_sigkill_releases_a_claim(spec: str) -> None:
    """A claimer killed by SIGKILL, mid-measurement as it were, leaves its problem free."""
    import signal
    import subprocess
    import sys
    import time

    key = PROBLEMS[0].key
    code = CLAIM_AND_WAIT.format(fp=FP)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, spec, key], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        store = open_store(spec, FP)
        claim = store.claim(key)
        assert not claim.held and f"pid {proc.pid} on " in claim.holder
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 20  # a database notices the closed connection soon after
    while not (claim := store.claim(key)).held and time.monotonic() < deadline:
        time.sleep(0.2)
    assert claim.held
    claim.release()
    store.close()


def test_sigkill_of_a_claimer_releases_its_claim(tmp_path):
    check_sigkill_releases_a_claim(str(tmp_path / "s"))


class SlowRunner:
    """A runner whose measurements take a while and name the writer that made them."""

    backend = "synthetic"

    def __init__(self, writer: int) -> None:
        from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM

        self.writer = writer
        self.baseline_names = (BASELINE_GEMM, BASELINE_COMM)

    def restrict(self, problem, schedules):
        return list(schedules)

    def check(self, problems) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def issue_mode(self):
        return None

    def _made(self, problem, name: str, kind: str) -> Measurement:
        import time

        time.sleep(0.05)
        m = measurement(problem, name, self.writer)
        m.kind = kind
        return m

    def measure(self, problem, schedules, on_result=None):
        out = []
        for s in schedules:
            out.append(self._made(problem, str(s), "schedule"))
            if on_result:
                on_result(out[-1])
        return out

    def baselines(self, problem):
        return [self._made(problem, name, "baseline") for name in self.baseline_names]

    def fingerprint(self):
        return FP


SWEEP_PROBLEMS = [
    Problem(pattern="gemm_rs", m=64 * (i + 1), n=32, k=16, world=2, dtype="fp32", name=f"s.p{i}")
    for i in range(6)
]


def sweep_writer(spec: str, writer: int, barrier, results, strategy: str) -> None:
    from ficco.space import SpaceOptions
    from ficco.sweep import SweepOptions, get_strategy

    space = SpaceOptions(chunk_counts=(2,), sm_reserves=(0,), gemms=("cublas",))
    store = open_store(spec, FP)
    options = SweepOptions(limit_schedules=3, trials=3, batch=3)
    barrier.wait()
    result = get_strategy(strategy)(SWEEP_PROBLEMS, space, SlowRunner(writer), store, options)
    store.close()
    measured = sum(o.measured for o in result.outcomes)
    results.put((writer, measured, store.races_lost, dict(getattr(result, "claimed", {}))))


def sweep_race(
    spec: str, writers: int = 2, strategy: str = "exhaustive"
) -> list[tuple[int, int, int, dict]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers, timeout=60)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=sweep_writer, args=(spec, w, barrier, results, strategy))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in range(writers)]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * writers
    return out


def check_each_problem_measured_once(outcome, records) -> None:
    """No writer lost a race for a key (no work done twice); every problem's records come
    from one writer; each writer skipped, as claimed, only problems the others measured."""
    assert [lost for _, _, lost, _ in outcome] == [0] * len(outcome)
    writers_of: dict[str, set] = {}
    for r in records:
        writers_of.setdefault(r["problem_key"], set()).add(r["detail"])
    assert set(writers_of) == {p.key for p in SWEEP_PROBLEMS}
    assert all(len(w) == 1 for w in writers_of.values()), writers_of
    schedules = sum(1 for r in records if r["kind"] == "schedule")
    assert sum(measured for _, measured, _, _ in outcome) == schedules
    assert sum(len(claimed) for *_, claimed in outcome) >= 1  # they did race


@pytest.mark.parametrize("strategy", ["exhaustive", "optuna"])
def test_two_racing_sweeps_on_a_directory_measure_each_problem_once(strategy, tmp_path):
    outcome = sweep_race(str(tmp_path / "s"), strategy=strategy)
    check_each_problem_measured_once(outcome, ProfileStore.read(tmp_path / "s").records())
