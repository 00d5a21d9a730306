"""Kill a sweep with SIGKILL partway, rerun it, and check the store: one record per
(problem, schedule), nothing recorded before the kill lost, every problem at its budget.

The CPU suite does this with the cpu backend (tests/test_sweep.py); this script does it on
the machine the sweep is meant for, with the real runner: ``--backend cuda`` keeps a pool of
one process per GPU across problems, and the kill takes the whole process group down (as a
scheduler's preemption does), ranks included, mid-measurement. Writes
``sweep_kill_resume.json`` under ``--out`` and prints it.

Usage (2 GPUs): python scripts/sweep_kill_resume.py --world 2 --out $OUT
        (CPU):  python scripts/sweep_kill_resume.py --backend cpu --shapes tiny.csv --world 2 \\
                    --out /tmp/k -- --gemm cublas --limit-schedules 6
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from ficco.workloads import read_shapes_csv, write_shapes_csv

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHAPES = ROOT / "profiles" / "h200x2" / "shapes.csv"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, default=DEFAULT_SHAPES)
    parser.add_argument("--problems", type=int, default=4, help="first N rows of --shapes")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--strategy", choices=["exhaustive", "optuna"], default="optuna")
    parser.add_argument("--trials", type=int, default=10, help="optuna: schedules per problem")
    parser.add_argument(
        "--kill-at", type=int, default=8, help="SIGKILL once the store holds this many records"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("sweep_args", nargs="*", help="more `ficco sweep` options, after --")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    problems = [p for p in read_shapes_csv(args.shapes) if p.world == args.world]
    problems = problems[: args.problems]
    if not problems:
        raise SystemExit(f"{args.shapes}: no shapes of world {args.world}")
    shapes = args.out / "shapes.csv"
    write_shapes_csv(problems, shapes)
    store = args.out / "store"
    command = [sys.executable, "-m", "ficco.cli", "sweep", "--shapes", str(shapes)]
    command += ["--world", str(args.world), "--store", str(store), "--backend", args.backend]
    command += ["--strategy", args.strategy, *args.sweep_args]
    if args.strategy == "optuna":
        command += ["--trials", str(args.trials)]
    log = store / "records.jsonl"

    # 1. the sweep, killed with its whole process group once --kill-at records are stored
    started = time.monotonic()
    with (args.out / "killed_run.log").open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
        while proc.poll() is None and _count(log) < args.kill_at:
            time.sleep(0.05)
        finished_first = proc.poll() is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_after_s = time.monotonic() - started
    text = log.read_text() if log.exists() else ""
    before = [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
    torn = len(text) - sum(map(len, before))
    time.sleep(2.0)  # let the killed ranks' GPU contexts go
    survivors = _processes_of(str(store))

    # 2. the same command again, to the end
    started = time.monotonic()
    rerun = subprocess.run([*command, "--json"], capture_output=True, text=True)
    rerun_s = time.monotonic() - started
    (args.out / "rerun.log").write_text(rerun.stderr)

    # 3. the store
    after_text = log.read_text()
    records = [json.loads(line) for line in after_text.splitlines()]
    pairs = Counter((r["problem_key"], r["name"]) for r in records)
    per_problem = Counter(r["problem_key"] for r in records if r["kind"] == "schedule")
    verdicts = Counter(r["verdict"] for r in records)
    summary = json.loads(rerun.stdout) if rerun.returncode == 0 else {}
    result = {
        "command": " ".join(command[1:]),
        "killed": {
            "after_s": round(killed_after_s, 1),
            "sweep_had_finished": finished_first,
            "complete_records": len(before),
            "torn_bytes": torn,
            "processes_left_after_kill": survivors,
        },
        "rerun": {
            "exit_code": rerun.returncode,
            "seconds": round(rerun_s, 1),
            "measured": summary.get("measured"),
            "reused": summary.get("reused"),
        },
        "store": {
            "records": len(records),
            "problems": len(per_problem),
            "schedules_per_problem": sorted(per_problem.values()),
            "verdicts": dict(verdicts),
            "duplicated_pairs": sum(n > 1 for n in pairs.values()),
            "records_before_kill_kept_in_order": after_text.startswith("".join(before)),
        },
    }
    checks = {
        "killed partway": not finished_first and len(before) > 0,
        "rerun exited 0": rerun.returncode == 0,
        "one record per (problem, schedule)": result["store"]["duplicated_pairs"] == 0,
        "nothing recorded before the kill lost": result["store"][
            "records_before_kill_kept_in_order"
        ],
        "every problem swept": len(per_problem) == len(problems),
    }
    if args.strategy == "optuna":
        checks["every problem at its trial budget"] = set(per_problem.values()) == {args.trials}
    result["checks"] = checks
    result["ok"] = all(checks.values())
    result["fingerprint"] = json.loads((store / "header.json").read_text())["fingerprint"]
    text = json.dumps(result, indent=2, default=str)
    (args.out / "sweep_kill_resume.json").write_text(text + "\n")
    print(text)
    if not result["ok"]:
        raise SystemExit(1)


def _count(log: Path) -> int:
    try:
        with log.open("rb") as fh:
            return sum(1 for line in fh if line.endswith(b"\n"))
    except FileNotFoundError:
        return 0


def _processes_of(marker: str) -> list[str]:
    """Command lines of processes still running that mention ``marker`` (the store), or are
    multiprocessing spawn children (the ranks name no store): what the kill left behind."""
    left = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline or "multiprocessing.spawn" in cmdline:
            left.append(f"{pid_dir.name}: {cmdline[:160]}")
    return left


if __name__ == "__main__":
    main()
