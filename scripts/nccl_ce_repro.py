#!/usr/bin/env python3
"""Minimal reproducer: NCCL zero-CTA (copy-engine) collectives from PyTorch, on 2 GPUs.

ficco's ``nccl_ce`` transport hung on 2xH200 (torch 2.11, NCCL 2.28.9, multicast off): once
at start, once during verification, without an error; an earlier try failed with "unhandled
cuda error ... invalid argument". NCCL 2.28 documents copy-engine AllGather / AlltoAll only
for buffers allocated by ``ncclMemAlloc`` and registered as a symmetric window, on a
communicator whose CTA policy is zero. This script tries the ways PyTorch offers, each in its
own pair of processes with a hard time limit, so a hang is recorded as a hang and the next
attempt still runs:

  zero_plain        cta_policy = ZERO, plain caching-allocator buffers
  zero_symm_nccl    cta_policy = ZERO, ``symm_mem.set_backend("NCCL")`` + ``symm_mem.empty``
                    + ``rendezvous`` (torch's NCCL symmetric memory)
  zero_mempool      cta_policy = ZERO, buffers from ``torch.cuda.MemPool(backend.mem_allocator)``
                    (ncclMemAlloc), the pool registered with the communicator (symmetric
                    registration where this torch's ``register_mem_pool`` takes ``symm``)
  default_mempool   the same buffers on a default-policy communicator (control)
  zero_all_to_all   zero_mempool's buffers through ``all_to_all_single``

Each attempt: an all-gather (or all-to-all) of 64 MiB per rank, checked against the expected
values, then 20 timed calls (CUDA events, bus bandwidth). Per attempt the JSON records
status (ok | error | hang | wrong), the error, the timing, and the tail of the NCCL log
(``NCCL_DEBUG=INFO``, with ``NCCL_DEBUG_SUBSYS=INIT,COLL,REG``).

Run on a 2-GPU machine: ``python scripts/nccl_ce_repro.py`` (JSON to
$OUT/nccl_ce_repro.json, else ./nccl_ce_repro.json; ``--timeout`` seconds per attempt).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ATTEMPTS = ("zero_plain", "zero_symm_nccl", "zero_mempool", "default_mempool", "zero_all_to_all")
BYTES_PER_RANK = 64 << 20
ENV = {
    # multicast (NVLS) stays off on these machines
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,COLL,REG",
}


def rank_main(attempt: str, rank: int, world: int, port: int, result_path: str) -> None:
    """One rank of one attempt; writes its JSON result to ``result_path``."""
    import torch
    import torch.distributed as dist

    out: dict = {"attempt": attempt, "rank": rank, "torch": torch.__version__}
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        opts = dist.ProcessGroupNCCL.Options()
        zero = attempt.startswith("zero")
        if zero:
            config = getattr(opts, "config", None)
            if config is None or not hasattr(config, "cta_policy"):
                raise RuntimeError(
                    "this torch exposes no ProcessGroupNCCL.Options().config.cta_policy"
                )
            policy = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None)
            out["cta_policy_constant"] = (
                "ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO" if policy is not None else "2 (assumed)"
            )
            config.cta_policy = 2 if policy is None else policy
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            device_id=device,
            pg_options=opts,
        )
        group = dist.group.WORLD
        numel = BYTES_PER_RANK // 2  # bf16
        keep = []
        if attempt == "zero_symm_nccl":
            import torch.distributed._symmetric_memory as symm_mem

            symm_mem.set_backend("NCCL")
            src = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
            dst = symm_mem.empty(numel * world, dtype=torch.bfloat16, device=device)
            keep = [
                symm_mem.rendezvous(src, group.group_name),
                symm_mem.rendezvous(dst, group.group_name),
            ]
        elif attempt.endswith("mempool") or attempt == "zero_all_to_all":
            backend = group._get_backend(device)
            pool = torch.cuda.MemPool(backend.mem_allocator)
            with torch.cuda.use_mem_pool(pool):
                src = torch.empty(numel, dtype=torch.bfloat16, device=device)
                dst = torch.empty(numel * world, dtype=torch.bfloat16, device=device)
            try:
                backend.register_mem_pool(pool, symm=True)
                out["registration"] = "register_mem_pool(pool, symm=True)"
            except TypeError:
                backend.register_mem_pool(pool)
                out["registration"] = "register_mem_pool(pool) (no symm argument in this torch)"
            keep = [pool]
        else:
            src = torch.empty(numel, dtype=torch.bfloat16, device=device)
            dst = torch.empty(numel * world, dtype=torch.bfloat16, device=device)
        src.copy_(torch.full((numel,), float(rank + 1), device=device))
        if attempt == "zero_all_to_all":
            src_a2a = dst[:numel].copy_(
                torch.arange(world, device=device)
                .repeat_interleave(numel // world)
                .to(torch.bfloat16)
                + 10 * rank
            )
            recv = dst[numel : 2 * numel]

            def call():
                dist.all_to_all_single(recv, src_a2a, group=group)

            call()
            torch.cuda.synchronize()
            expect = (
                (torch.arange(world, device=device) * 10 + rank)
                .repeat_interleave(numel // world)
                .to(torch.bfloat16)
            )
            correct = bool(torch.equal(recv, expect))
        else:

            def call():
                dist.all_gather_into_tensor(dst, src, group=group)

            call()
            torch.cuda.synchronize()
            expect = (
                torch.arange(1, world + 1, device=device)
                .repeat_interleave(numel)
                .to(torch.bfloat16)
            )
            correct = bool(torch.equal(dst, expect))
        out["correct"] = correct
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        median_ms = times[len(times) // 2]
        out["median_ms"] = median_ms
        out["bus_gbps"] = BYTES_PER_RANK * (world - 1) / (median_ms * 1e-3) / 1e9
        out["status"] = "ok" if correct else "wrong"
        del keep
        dist.destroy_process_group()
    except Exception as err:
        out["status"] = "error"
        out["error"] = f"{type(err).__name__}: {str(err)[:800]}"
    Path(result_path).write_text(json.dumps(out))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_attempt(attempt: str, timeout_s: float, tmp: Path) -> dict:
    port, procs, logs, results = free_port(), [], [], []
    env = {**os.environ, **ENV}
    for rank in range(2):
        result = tmp / f"{attempt}-{rank}.json"
        log = tmp / f"{attempt}-{rank}.log"
        results.append(result)
        logs.append(log)
        with open(log, "w") as fh:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--rank-of",
                        attempt,
                        str(rank),
                        str(port),
                        str(result),
                    ],
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            )
    start, hung = time.monotonic(), False
    while any(p.poll() is None for p in procs):
        if time.monotonic() - start > timeout_s:
            hung = True
            for p in procs:
                p.kill()
            break
        time.sleep(0.5)
    for p in procs:
        p.wait()
    record: dict = {"attempt": attempt, "wall_s": round(time.monotonic() - start, 1), "ranks": []}
    for rank in range(2):
        body = (
            json.loads(results[rank].read_text())
            if results[rank].exists()
            else {"status": "hang" if hung else "no result"}
        )
        body["exit_code"] = procs[rank].returncode
        body["log_tail"] = logs[rank].read_text(errors="replace")[-3000:]
        record["ranks"].append(body)
    statuses = {r.get("status") for r in record["ranks"]}
    record["status"] = "hang" if hung else (statuses.pop() if len(statuses) == 1 else "mixed")
    return record


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-of":
        attempt, rank, port, result = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        rank_main(attempt, rank, 2, port, result)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per attempt")
    parser.add_argument("--attempt", action="append", choices=ATTEMPTS, help="default: all")
    args = parser.parse_args()
    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "nccl_ce_repro.json"
    report = {
        "torch": torch.__version__,
        "env": ENV,
        "bytes_per_rank": BYTES_PER_RANK,
        "attempts": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in args.attempt or ATTEMPTS:
            record = run_attempt(attempt, args.timeout, Path(tmp))
            report["attempts"].append(record)
            path.write_text(json.dumps(report, indent=2))  # what is done survives a crash
            print(f"{attempt:18s} {record['status']:6s} {record['wall_s']:7.1f} s", flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
