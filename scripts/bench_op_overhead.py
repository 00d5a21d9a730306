"""Host time an op call adds over the schedule it runs (``ficco.ops``), per call, in µs.

Each rank calls each op many times on one shape with the plan's execution left out
(``ficco.ops.runner.execute`` replaced by a no-op for the timed loop, after real warm-up calls
that decided, planned and, on GPUs, rendezvoused), so what is timed is the wrapper: the eager
autograd Function, the cached per-call decision, the output and workspace allocation and the
local-shard copy. Reported per op: the whole call, the runner alone (no autograd), the cached
decision alone (``call_plan``), and one bare output allocation for comparison; median of 5
batches of ``--calls`` calls, rank 0's figures.

Usage: python scripts/bench_op_overhead.py [--backend cuda|cpu] [--world 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rank_spawn import end_rank, spawn_ranks  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(100):
        fn()
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(batches)


def rank_main(rank: int, world: int, init: str, args: dict, result_file: str) -> None:
    cuda = args["backend"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world, device_id=device)  # fmt: skip
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)  # fmt: skip
    import ficco.ops
    import ficco.ops.runner as runner

    dtype = torch.bfloat16 if cuda else torch.float32
    m, n, k = args["m"], args["n"], args["k"]
    a_shard = torch.randn(m // world, k, device=device).to(dtype)
    a = torch.randn(m, k // world, device=device).to(dtype)
    b_ag = torch.randn(k, n // world, device=device).to(dtype)
    b_rs = torch.randn(k // world, n, device=device).to(dtype)
    name = dist.group.WORLD.group_name
    cases = {
        "all_gather_matmul": (ficco.ops.all_gather_matmul, runner.run_ag_gemm, a_shard, b_ag),
        "matmul_reduce_scatter": (ficco.ops.matmul_reduce_scatter, runner.run_gemm_rs, a, b_rs),
        "matmul_all_reduce": (ficco.ops.matmul_all_reduce, runner.run_gemm_ar, a, b_rs),
    }  # fmt: skip
    rows = {}
    import warnings

    warnings.simplefilter("ignore")  # gemm_ar's one fallback warning
    for op_name, (op, run, lhs, rhs) in cases.items():
        for _ in range(3):
            op(lhs, rhs)  # real calls: decide, plan, rendezvous
        if cuda:
            torch.cuda.synchronize()
        real = runner.execute
        runner.execute = lambda *a, **kw: None
        try:
            call = runner.call_plan(op_name, lhs, rhs, name, "", "")
            rows[op_name] = {
                "schedule": str(call.choice.schedule),
                "op_call_us": per_call_us(lambda op=op, lhs=lhs, rhs=rhs: op(lhs, rhs), args["calls"]),
                "runner_us": per_call_us(lambda run=run, lhs=lhs, rhs=rhs: run(lhs, rhs, name, "", ""), args["calls"]),
                "call_plan_us": per_call_us(lambda p=op_name, lhs=lhs, rhs=rhs: runner.call_plan(p, lhs, rhs, name, "", ""), args["calls"]),
                "one_output_allocation_us": per_call_us(lambda lhs=lhs: lhs.new_empty((m, n)), args["calls"]),
            }  # fmt: skip
        finally:
            runner.execute = real
    if rank == 0:
        Path(result_file).write_text(json.dumps(rows))
    dist.barrier()
    end_rank(cuda)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.backend == "cpu":  # small shapes: the CPU allocator, not the shape, is timed
        args.m, args.n, args.k = 128, 64, 64
    config = vars(args) | {}
    rows = spawn_ranks(rank_main, args.world, config)
    from ficco.measure.fingerprint import fingerprint

    report = {
        "benchmark": "host time of an op call with the schedule's execution left out",
        "config": config,
        "fingerprint": fingerprint(args.backend),
        "ops": rows,
        "target_us": 10,
    }
    out = args.out or (os.path.join(os.environ["OUT"], "bench_op_overhead.json") if os.environ.get("OUT") else None)  # fmt: skip
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
