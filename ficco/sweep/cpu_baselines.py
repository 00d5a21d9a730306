"""The CPU backend's baselines: the serial plan's collective and GEMM, each timed alone.

W spawned processes over gloo run the ``serial/nccl/cublas`` plan's collective tasks and GEMM
tasks separately, interleaved round by round (comm, gemm, comm, gemm ...) with a barrier before
each, and keep per round the max across ranks (host ``perf_counter``). CPU timings exercise the
harness only; they are never shipped as profiles.
"""

from __future__ import annotations

import json
import queue
import time

from ficco.execute.spawn import init_gloo_rank, spawned_ranks
from ficco.measure.record import Summary
from ficco.problem import Problem


def _worker(
    rank: int,
    world: int,
    init_file: str,
    problem_json: str,
    rounds: int,
    seed: int,
    timeout_s: float,
    results,
) -> None:
    init_gloo_rank(rank, world, init_file, timeout_s)
    import torch
    import torch.distributed as dist

    from ficco.execute.buffers import allocate
    from ficco.execute.cpu import run_collective, run_gemm
    from ficco.plan import CollectiveOp, GemmOp, build_plan
    from ficco.space import Schedule

    try:
        problem = Problem.from_dict(json.loads(problem_json))
        plan = build_plan(problem, Schedule(), rank)  # serial/nccl/cublas
        tensors = allocate(plan, seed)
        comm_ops = [t.op for t in plan.tasks if isinstance(t.op, CollectiveOp)]
        gemm_ops = [t.op for t in plan.tasks if isinstance(t.op, GemmOp)]
        samples: dict[str, list[float]] = {"gemm": [], "comm": []}
        for round_ in range(rounds + 1):  # round 0 warms up
            for kind in ("comm", "gemm"):
                dist.barrier()
                start = time.perf_counter()
                if kind == "comm":
                    for op in comm_ops:
                        run_collective(op, tensors, world)
                else:
                    for op in gemm_ops:
                        run_gemm(op, tensors, plan.schedule.gemm, None)
                elapsed = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if round_:
                    samples[kind].append(float(elapsed))
        if rank == 0:
            results.put({"ok": True, "samples": samples})
    except Exception as err:  # reported to the parent, which records the failure
        if rank == 0:
            results.put({"ok": False, "detail": f"{type(err).__name__}: {err}"})
        raise
    finally:
        dist.destroy_process_group()


def time_serial_parts(
    problem: Problem, *, rounds: int = 5, seed: int = 0, timeout_s: float = 120.0
) -> tuple[Summary, Summary] | str:
    """``(gemm, comm)`` summaries of the undecomposed GEMM and collective on CPU processes,
    or the reason they could not be timed."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()
    args = (json.dumps(problem.to_dict()), rounds, seed, timeout_s, results)
    with spawned_ranks(problem.world, _worker, args) as procs:
        deadline = time.monotonic() + timeout_s + 60
        while True:
            try:
                out = results.get(timeout=1.0)
                break
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    return f"a rank process exited with code {dead[0]}"
                if time.monotonic() > deadline:
                    return "timed out timing the serial parts"
    if not out["ok"]:
        return out["detail"]
    return Summary.of(out["samples"]["gemm"]), Summary.of(out["samples"]["comm"])
