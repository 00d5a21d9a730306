"""The one-GPU lane: ranks that share a GPU run every pattern's schedules, verified, and a
sweep survives real faults (``ficco.execute.cuda_shared``; timings mean nothing here).

    python scripts/gpu_shared.py --out DIR [--worlds 2 4 8] [--junit tests.xml] [--budget-s 400]
    python scripts/gpu_shared.py --backend cpu --out DIR --worlds 2   # the driver on CPU

Parts (faults first), each in one rank pool per world size (started once):

``matrix``  every ``ce``, ``seg`` and ``nccl`` schedule of every pattern (cuBLAS GEMMs), the
            all-to-alls also with a skewed routing, plus a covering set of the whole space
            (Triton GEMMs, SM reserves, and what needs distinct GPUs: fused, symm1/symm2,
            nccl_ce, async-TP, which must be ``unavailable`` with their reason). Verified
            eagerly; ``ce``/``seg`` schedules also captured and their replays verified. At the
            largest world only the covering set runs.
``faults``  a sweep of four problems at W = 2 whose schedules include a hang (a rank never
            reaches its transfer), a CUDA OOM, a rank killed mid-sweep and a corrupted chunk:
            each fault is recorded with its verdict, the sweep goes on (a hung or dead pool is
            replaced and the rest of its problem resubmitted), and the ledger holds every
            (problem, schedule) exactly once.

Writes ``gpu_shared.json`` (counts by verdict and by reason, incorrect verdicts, world sizes,
faults, the pytest counts from ``--junit``, the environment fingerprint) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import shared_faults  # noqa: E402

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.execute.pool import PoolFailure  # noqa: E402
from ficco.execute.run import backend_pool, measure_in  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.routing import with_skewed_routing  # noqa: E402
from ficco.space import Gemm, SpaceOptions, enumerate_schedules  # noqa: E402
from ficco.verdict import Verdict  # noqa: E402

PATTERNS = ("ag_gemm", "gemm_rs", "gemm_ar", "a2a_gemm", "gemm_a2a")
TRANSPORTS = ("ce", "seg", "nccl")
AXES = ("granularity", "chunks", "split", "transport", "order", "compute", "gemm")
AXES += ("sm_reserve", "comm_priority")


def covering(schedules):
    """A few schedules that together take every value of every axis that occurs."""
    chosen, seen = [], set()
    for s in schedules:
        values = {(axis, str(getattr(s, axis, None))) for axis in AXES}
        if values - seen:
            chosen.append(s)
            seen |= values
    return chosen


def problems(world: int, dtype: str) -> list[Problem]:
    out = []
    for pattern in PATTERNS:
        extra = {"experts": 2 * world} if "a2a" in pattern else {}
        p = Problem(pattern=pattern, m=128 * world, n=96, k=64, world=world, dtype=dtype, **extra)
        out.append(p)
        if "a2a" in pattern:
            out.append(with_skewed_routing(p, top_k=2, alpha=1.2, seed=world))
    return out


def matrix_schedules(problem: Problem, every: bool) -> list:
    whole = list(enumerate_schedules(problem))
    chosen = covering(whole)
    if every:
        cublas = enumerate_schedules(problem, SpaceOptions(gemms=(Gemm.CUBLAS,)))
        chosen += [s for s in cublas if s.transport.value in TRANSPORTS and s not in chosen]
    return chosen


def expected_unavailable(backend: str, name: str) -> bool:
    """What this backend may answer ``unavailable`` (everything else must verify)."""
    if backend != "cuda_shared":
        return "+fused" in name or "symm" in name or "nccl_ce" in name or name == "async_tp"
    from ficco.execute.cuda_shared import shared_capability
    from ficco.space import Schedule

    if name in ("async_tp", "comm_one_shot", "comm_two_shot", "comm_lamport", "serial_graph"):
        return True  # baselines over symmetric memory's or the lamport kernels, or NCCL
    try:
        schedule = Schedule.parse(name)
    except ValueError:
        return False
    # the lane's own refusals (fused flag waits, the all-reduce kernels, nccl_ce), from the
    # backend's registry of reasons rather than a list kept here
    return shared_capability(None, schedule) is not None


def run_matrix(backend: str, worlds, dtype: str, deadline: float, log) -> dict:
    summary = {"verdicts": Counter(), "unavailable": Counter(), "failed": [], "incorrect": []}
    summary.update(captured=0, not_captured=[], schedules=0, worlds={}, skipped_for_time=[])
    timing = TimingOptions(rounds=1, warmup=0, graphs="ce")
    for world in worlds:
        every = world != max(worlds) or len(worlds) == 1
        done = 0
        with backend_pool(backend, world, RunOptions(timeout_s=45)) as pool:
            for problem in problems(world, dtype):
                if time.monotonic() > deadline:
                    summary["skipped_for_time"].append(problem.key)
                    continue
                schedules = matrix_schedules(problem, every)
                t0 = time.monotonic()
                got = measure_in(pool, problem, schedules, timing)
                if isinstance(got, PoolFailure):
                    summary["failed"].append({"problem": problem.key, "reason": str(got)})
                    log(f"W={world} {problem.key}: FAILED {got}")
                    continue
                for m in got:
                    summary["verdicts"][m.verdict] += 1
                    if m.kind == "schedule":
                        summary["schedules"] += 1
                        done += 1
                    if m.verdict == Verdict.UNAVAILABLE:
                        summary["unavailable"][m.detail.split(": ", 2)[-1][:120]] += 1
                        if not expected_unavailable(backend, m.name):
                            summary["failed"].append(
                                {"problem": problem.key, "name": m.name, "detail": m.detail}
                            )
                    elif m.verdict == Verdict.INCORRECT:
                        summary["incorrect"].append({"problem": problem.key, "name": m.name})
                    elif m.verdict != Verdict.OK:
                        summary["failed"].append(
                            {
                                "problem": problem.key,
                                "name": m.name,
                                "verdict": m.verdict,
                                "detail": m.detail[:300],
                            }
                        )
                    one_sided = "/ce/" in m.name or "/seg/" in m.name
                    if m.kind == "schedule" and m.verdict == Verdict.OK and one_sided:
                        if m.extra.get("graph") == "graph":
                            summary["captured"] += 1
                        else:
                            summary["not_captured"].append(
                                {
                                    "problem": problem.key,
                                    "name": m.name,
                                    "graph": m.extra.get("graph"),
                                }
                            )
                for m in got:
                    if m.verdict not in ("ok", "unavailable") or (
                        m.verdict == Verdict.UNAVAILABLE
                        and not expected_unavailable(backend, m.name)
                    ):
                        log(f"  {m.name}: {m.verdict}: {m.detail[:400]}")
                bad = sum(1 for m in got if m.verdict not in ("ok", "unavailable"))
                log(
                    f"W={world} {problem.key}: {len(schedules)} schedules, {bad} not ok, "
                    f"{time.monotonic() - t0:.1f} s"
                )
        summary["worlds"][world] = done
    summary["verdicts"] = dict(summary["verdicts"])
    summary["unavailable"] = dict(summary["unavailable"])
    return summary


FAULTS = (
    # (pattern, fault hook, target schedule, the verdict the fault must get)
    ("gemm_rs", shared_faults.hang_rank1, shared_faults.HANG_TARGET, "timeout"),
    ("ag_gemm", shared_faults.out_of_memory, shared_faults.OOM_TARGET, "oom"),
    ("gemm_ar", shared_faults.kill_rank1, shared_faults.KILL_TARGET, "error"),
    ("ag_gemm", shared_faults.corrupt_chunk, shared_faults.CORRUPT_TARGET, "incorrect"),
)
FAULT_NEIGHBOURS = ("serial/nccl/cublas", "finer-c2-m/ce/cublas+hi", "finer-c2-m/nccl/cublas+hi")


def run_faults(backend: str, dtype: str, timeout_s: float, log) -> dict:
    """One sweep over the fault problems in one pool; a job that hangs or loses a rank is
    answered by the pool, its first unrecorded schedule takes that verdict, and the rest of
    the problem is resubmitted (to a fresh pool)."""
    ledger: list[dict] = []
    out = {"faults": [], "ledger_ok": True}
    timing = TimingOptions(rounds=1, warmup=0, graphs="ce")
    with backend_pool(backend, 2, RunOptions(timeout_s=timeout_s)) as pool:
        for index, (pattern, hook, target, want) in enumerate(FAULTS):
            # distinct shapes: each fault's problem is its own key
            problem = Problem(pattern=pattern, m=256 + 64 * index, n=96, k=64, world=2, dtype=dtype)
            names = [target, *FAULT_NEIGHBOURS]
            names = list(dict.fromkeys(names))
            from ficco.space import Schedule

            todo = [Schedule.parse(n) for n in names]
            t0 = time.monotonic()
            while todo:
                got_now: list = []

                def progress(msg, got_now=got_now):
                    if msg.get("phase") == "verified" and "measurement" in msg:
                        m = msg["measurement"]
                        if m.kind == "schedule":
                            got_now.append(m)

                answer = measure_in(pool, problem, todo, timing, progress, plan_hook=hook)
                for m in got_now:
                    ledger.append(
                        {
                            "problem": problem.key,
                            "name": m.name,
                            "verdict": m.verdict,
                            "detail": m.detail[:200],
                        }
                    )
                recorded = {m.name for m in got_now}
                todo = [s for s in todo if str(s) not in recorded]
                if isinstance(answer, PoolFailure) and todo:
                    verdict = answer.verdict.value
                    verdict = "error" if verdict == "launch" else verdict
                    ledger.append(
                        {
                            "problem": problem.key,
                            "name": str(todo[0]),
                            "verdict": verdict,
                            "detail": str(answer)[:200],
                        }
                    )
                    log(f"fault {hook.__name__}: pool answered {str(answer)[:160]}")
                    todo = todo[1:]
            got = {r["name"]: r for r in ledger if r["problem"] == problem.key}
            fault = got.get(target, {})
            neighbours = {n: got.get(n, {}).get("verdict") for n in names if n != target}
            survived = fault.get("verdict") == want and all(v == "ok" for v in neighbours.values())
            out["faults"].append(
                {
                    "fault": hook.__name__,
                    "problem": problem.key,
                    "schedule": target,
                    "verdict": fault.get("verdict"),
                    "expected": want,
                    "detail": fault.get("detail"),
                    "others": neighbours,
                    "survived": survived,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            log(f"fault {hook.__name__}: {fault.get('verdict')} (want {want}); others {neighbours}")
    keys = Counter((r["problem"], r["name"]) for r in ledger)
    out["ledger_records"] = len(ledger)
    out["ledger_ok"] = all(n == 1 for n in keys.values()) and len(keys) == sum(
        len(dict.fromkeys([t, *FAULT_NEIGHBOURS])) for _, _, t, _ in FAULTS
    )
    out["ledger"] = ledger
    return out


def junit_counts(path: Path) -> dict:
    """passed / failed / skipped (by reason) from a pytest junit XML."""
    if not path.exists():
        return {"missing": str(path)}
    counts, reasons, failed = Counter(), Counter(), []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("skipped") is not None:
            counts["skipped"] += 1
            reasons[case.find("skipped").get("message", "")[:200]] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(name)
        else:
            counts["passed"] += 1
    return {**counts, "skipped_by_reason": dict(reasons), "failed_tests": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", default="cuda_shared", choices=["cuda_shared", "cpu"])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--parts", nargs="+", default=["matrix", "faults"])
    parser.add_argument("--junit", type=Path, help="pytest's junit XML of tests/gpu to count")
    parser.add_argument("--budget-s", type=float, default=400.0, help="matrix time budget")
    parser.add_argument("--fault-timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)

    from ficco.measure.fingerprint import fingerprint

    result: dict = {
        "backend": args.backend,
        "timings": "ranks share a GPU: verification only (no figures)",
        "fingerprint": fingerprint("cuda" if args.backend == "cuda_shared" else "cpu"),
        "worlds": args.worlds,
    }
    if "faults" in args.parts:  # first: the faults must run whatever the matrix costs
        result["faults"] = run_faults(args.backend, args.dtype, args.fault_timeout_s, log)
    if "matrix" in args.parts:
        result["matrix"] = run_matrix(
            args.backend, args.worlds, args.dtype, started + args.budget_s, log
        )
    if args.junit:
        result["tests"] = junit_counts(args.junit)
    matrix = result.get("matrix", {})
    faults = result.get("faults", {})
    tests = result.get("tests", {})
    result["summary"] = {
        "schedules_verified": matrix.get("verdicts", {}).get("ok", 0),
        "incorrect": len(matrix.get("incorrect", [])),
        "failed": len(matrix.get("failed", [])),
        "captured_and_verified": matrix.get("captured", 0),
        "not_captured": len(matrix.get("not_captured", [])),
        "worlds_covered": sorted(int(w) for w, n in matrix.get("worlds", {}).items() if n),
        "faults_survived": sum(f["survived"] for f in faults.get("faults", [])),
        "faults": len(faults.get("faults", [])),
        "ledger_exactly_once": faults.get("ledger_ok"),
        "tests_passed": tests.get("passed", 0),
        "tests_failed": tests.get("failed", 0),
        "tests_skipped": tests.get("skipped", 0),
        "seconds": round(time.monotonic() - started, 1),
    }
    (args.out / "gpu_shared.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result["summary"], indent=1))
    ok = (
        not result["summary"]["incorrect"]
        and not result["summary"]["failed"]
        and result["summary"]["faults_survived"] == result["summary"]["faults"]
        and faults.get("ledger_ok", True)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
