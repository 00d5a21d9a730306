"""Which part of a timed CUDA run hangs: one problem run timed (verify, capture, time) under
several configurations, each on fresh ranks with a short no-progress limit, so a hang costs
``--timeout`` seconds, not the pool's 120.

The default problem is tests/gpu/test_seg_gpu.py's gemm_a2a with skewed routing (m=2048,
n=512, k=256, 8 experts, top-2, alpha 1.2, seed 0) and its seven seg/ce schedules, whose
timing hung on 2 H200s in NCCL's all_to_all (every schedule had verified) while the executor
captured NCCL all-to-alls; it now keeps them eager (``ficco.execute.capture``). Configurations:

- ``full``: as the test runs it (schedules and baselines, graphs 'all', NCCL all-to-alls
  eager);
- ``a2a-captured``: as ``full`` with NCCL's all-to-alls captured
  (``FICCO_CAPTURE_NCCL_ALL_TO_ALL=1``), as before the rule: the configuration that hung;
- ``no-baselines``: the schedules alone (no NCCL call is timed);
- ``graphs-ce``: NCCL plans stay eager (no NCCL call is captured);
- and, each with NCCL's all-to-alls captured (they bisect the hang):
  ``baselines``: the baselines beside the one schedule ``serial/nccl/cublas`` (NCCL only);
  ``no-graph-register``: ``NCCL_GRAPH_REGISTER=0`` (NCCL does not register the buffers of
  captured calls); ``no-graph-mixing``: ``NCCL_GRAPH_MIXING_SUPPORT=0`` (NCCL's ordering of
  captured against eager calls off; its documentation says that mechanism has deadlocked);
  ``synced``: 'synced' issue (hosts wait for their GPU before every iteration).

Usage (2 GPUs): python scripts/timing_hang_bisect.py [--configs full baselines ...]
[--timeout 45]. Prints one line per configuration: ok, or the failure; writes
``$OUT/timing_hang_bisect.json`` when ``$OUT`` is set. ``--dry-run`` lists what would run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEDULES = (
    "serial/seg/cublas",
    "serial/ce/cublas",
    "shard/seg/cublas+hi",
    "finer-c2-m/seg/cublas",
    "finer-c4-m/seg/cublas+merged",
    "finer-c2-m/seg/triton+sm16",
    "finer-c2-m/ce/cublas",
)
CONFIGS = (
    "full",
    "a2a-captured",
    "no-baselines",
    "baselines",
    "graphs-ce",
    "no-graph-register",
    "no-graph-mixing",
    "synced",
)
#: the configurations that capture NCCL's all-to-alls, as the executor did when it hung
A2A_CAPTURED = ("a2a-captured", "baselines", "no-graph-register", "no-graph-mixing", "synced")
#: NCCL environment per configuration (the ranks are spawned with it)
NCCL_ENV = {
    "no-graph-register": {"NCCL_GRAPH_REGISTER": "0"},
    "no-graph-mixing": {"NCCL_GRAPH_MIXING_SUPPORT": "0"},
}


def config_env(name: str) -> dict[str, str]:
    """The environment configuration ``name`` spawns its ranks with."""
    from ficco.space.transports import CAPTURE_NCCL_ALL_TO_ALL_ENV

    env = dict(NCCL_ENV.get(name, {}))
    if name in A2A_CAPTURED:
        env[CAPTURE_NCCL_ALL_TO_ALL_ENV] = "1"
    return env


def problem(pattern: str, skewed: bool):
    from ficco.problem import Problem
    from ficco.routing import with_skewed_routing

    p = Problem(pattern=pattern, m=2048, n=512, k=256, world=2, experts=8)
    return with_skewed_routing(p, top_k=2, alpha=1.2, seed=0) if skewed else p


def run_config(name: str, p, timeout_s: float, backend: str = "cuda") -> dict:
    """One configuration on fresh ranks of ``backend`` (``cpu`` tries the flow GPU-free): its
    verdicts, or the pool's failure."""
    from ficco.execute import RunOptions, TimingOptions
    from ficco.execute.pool import PoolFailure
    from ficco.execute.run import backend_pool, measure_in
    from ficco.space import Schedule

    timing = TimingOptions(rounds=3, warmup=1)
    schedules = [Schedule.parse(s) for s in SCHEDULES]
    if name == "baselines":  # a run needs one schedule: the serial NCCL plan the baselines are
        schedules = [Schedule.parse("serial/nccl/cublas")]
    if name == "graphs-ce":
        timing = replace(timing, graphs="ce")
    if name == "synced":
        timing = replace(timing, issue=("synced",))
    env = config_env(name)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the ranks are spawned with this environment
    started = time.time()
    phases: list[str] = []
    try:
        with backend_pool(backend, p.world, RunOptions(timeout_s=timeout_s)) as pool:
            got = measure_in(
                pool,
                p,
                schedules,
                timing,
                lambda msg: phases.append(f"{msg.get('phase')} {msg.get('name')}"),
                baselines=name != "no-baselines",
            )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if isinstance(got, PoolFailure):
        verdicts, outcome = {}, f"failed: {got} (last phases: {phases[-3:]})"
    else:
        verdicts = {m.name: m.verdict for m in got}
        bad = {n: v for n, v in verdicts.items() if v != "ok"}
        outcome = "ok" if not bad else f"not ok: {bad}"
    return {"config": name, "outcome": outcome, "verdicts": verdicts, "s": time.time() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="gemm_a2a", choices=("gemm_a2a", "a2a_gemm"))
    parser.add_argument("--even", action="store_true", help="uniform routing, not skewed")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--timeout", type=float, default=45.0, help="no-progress limit, s")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    p = problem(args.pattern, not args.even)
    if args.dry_run:
        print(f"{p.key}: configs {args.configs}, schedules {list(SCHEDULES)}")
        for name in args.configs:
            print(f"  {name}: environment {config_env(name)}")
        return 0
    rows = []
    for name in args.configs:
        row = run_config(name, p, args.timeout, args.backend)
        rows.append(row)
        print(f"[{row['s']:6.1f}s] {name}: {row['outcome'][:400]}", flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "timing_hang_bisect.json").write_text(
                json.dumps({"problem": p.key, "runs": rows}, indent=1)
            )
    return 0 if all(r["outcome"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
