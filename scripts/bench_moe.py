"""MoE dispatch + expert GEMMs and expert GEMMs + combine on W GPUs, in one run.

Two parts:

``layers`` (default): the expert layers (``a2a_gemm``: dispatch, up-projection; ``gemm_a2a``:
down-projection, combine) of Mixtral-8x7B, DeepSeek-V3, Qwen3-235B-A22B and GPT-OSS-120B from
ficco's catalog, at 256 ... 16384 tokens per rank, with uniform routing and with a skewed one
(``ficco.routing``: a seeded top-k router, Zipf-like popularity, ``--alpha``). Every schedule
of the sweep space (transports ce, nccl and seg -- seg: a step's transfers as one
segment-copy kernel --, cuBLAS GEMMs, 2/4/8 chunks) is verified against the collectives
reference, then timed beside the serial plan (``all_to_all_single`` with splits, one GEMM per
expert block) issued eagerly and in a CUDA graph, and the ideal, max(GEMMs alone, all-to-all
alone), with the protocol of ``scripts/bench_overlap.py`` (whose runner it uses). The summary
says, per pattern and routing, where each transport wins (``by_transport``).

``transfers``: the all-to-all alone, 64 KiB ... 1 GiB sent per rank, evenly to every rank:
NCCL ``all_to_all_single``, ficco's copy-engine all-to-all (each rank pulls its block from
every peer's symmetric buffer, one side stream per peer, between two device barriers), the
same pulls as one segment-copy kernel launch (``seg_pull``, between the same barriers), and
PyTorch's ``all_to_all_vdev`` where the build has it (it needs NVSHMEM; recorded as
unavailable otherwise). Verified first, then timed eager, median over rounds of the max over
ranks.

Not measured here: a symmetric-memory all-to-all + grouped GEMM baseline in the layers part
(``all_to_all_vdev`` appears in the transfers part only).

Usage:
    python scripts/bench_moe.py --world 2 [--quick] [--out FILE]
    python scripts/bench_moe.py --world 2 --part transfers [--out FILE]
Writes ``$OUT/bench_moe.json`` (or ``bench_moe_transfers.json``) when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MODELS = ("mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b")
PATTERNS = ("a2a_gemm", "gemm_a2a")
TOKENS_PER_RANK = (256, 1024, 4096, 16384)
TRANSFER_BYTES = tuple(65536 << i for i in range(0, 15, 2))  # 64 KiB ... 1 GiB, x4 steps


def layer_problems(world: int, models, tokens_per_rank, alpha: float, seed: int):
    """The catalog's expert layers of ``models``, uniform and skewed (same sizes)."""
    from ficco.routing import with_skewed_routing
    from ficco.workloads import ParallelSetup, get_model, model_problems

    out = []
    for name in models:
        model = get_model(name)
        setup = ParallelSetup(world=world, tokens=tuple(t * world for t in tokens_per_rank))
        for p in model_problems(model, setup)[0]:
            if p.pattern.value in PATTERNS:
                out.append(p)
                out.append(with_skewed_routing(p, top_k=model.top_k, alpha=alpha, seed=seed))
    out.sort(key=lambda p: (p.m, p.name))  # small first: a cut-short run covers every layer
    return out


def candidates(problem):
    from ficco.space import Gemm, SpaceOptions, Transport, enumerate_schedules

    space = SpaceOptions(
        chunk_counts=(2, 4, 8),
        sm_reserves=(0,),
        # nccl_ce: unavailable without its probe; seg: ce's transfers, a step's as one kernel
        transports=(Transport.CE, Transport.NCCL, Transport.SEG),
        gemms=(Gemm.CUBLAS,),
    )
    return list(enumerate_schedules(problem, space))


def by_transport(rows: list[dict]) -> dict:
    """Per pattern, per transport (the middle part of a schedule's name): on how many
    problems its best verified schedule was the best of all (``wins``), and the geomean of
    its best over the best of all (``best_vs_best``: 1.0 where it always wins)."""
    out: dict[str, dict] = {}
    for row in rows:
        ok = {
            name: c["median_ms"]
            for name, c in row["candidates"].items()
            if c["kind"] == "schedule" and c["verdict"] == "ok" and c["median_ms"] > 0
        }
        if not ok:
            continue
        best = min(ok.values())
        per: dict[str, float] = {}
        for name, ms in ok.items():
            transport = name.split("/")[1]
            per[transport] = min(ms, per.get(transport, math.inf))
        mine = out.setdefault(row["problem"]["pattern"], {})
        for transport, ms in per.items():
            entry = mine.setdefault(transport, {"problems": 0, "wins": 0, "logs": []})
            entry["problems"] += 1
            entry["wins"] += ms == best
            entry["logs"].append(math.log(ms / best))
    for mine in out.values():
        for entry in mine.values():
            logs = entry.pop("logs")
            entry["best_vs_best"] = math.exp(sum(logs) / len(logs))
    return out


def run_layers(args) -> dict:
    import bench_overlap as bo

    from ficco.execute import TimingOptions
    from ficco.execute.pool import PoolFailure
    from ficco.execute.run import check_gpus
    from ficco.measure.fingerprint import fingerprint

    tokens = (256, 4096) if args.quick else tuple(int(t) for t in args.tokens.split(","))
    models = MODELS[:1] if args.quick else tuple(args.models.split(","))
    problems = layer_problems(args.world, models, tokens, args.alpha, args.seed)
    jobs = [(p, candidates(p)) for p in problems]
    issues = tuple(args.issue or ("synced", "queued"))
    opts = TimingOptions(rounds=5 if args.quick else args.rounds, issue=issues)
    started = time.time()
    partial: dict[int, dict] = {}

    def progress(index, msg):
        verdict = f" -> {msg['verdict']}" if msg.get("verdict") else ""
        p = jobs[index][0]
        print(f"    [{time.time() - started:6.1f}s] {p.name} m={p.m}: {msg.get('phase')} "
              f"{msg.get('name')}{verdict}", flush=True)  # fmt: skip

    def done(index, measured, graphs):
        p = jobs[index][0]
        partial[index] = {
            issue: bo.shape_row(p, bo.under(measured, issue)) | {"graphs": graphs}
            for issue in issues
        }
        row = partial[index][issues[0]]
        print(f"[{time.time() - started:6.1f}s] {p.name} m={p.m}: best {row['best']} "
              f"{row['best_ms']:.3f} ms, serial {row['serial_ms']:.3f}, ideal "
              f"{row['ideal_ms']:.3f}", flush=True)  # fmt: skip

    check_gpus(args.world)
    results, _ = bo.run_suite(jobs, opts, args.world, args.stall_timeout, progress, done)
    failures = [
        {"key": p.key, "name": p.name, "error": str(res)}
        for (p, _), res in zip(jobs, results, strict=True)
        if isinstance(res, PoolFailure)
    ]
    rows_of = {issue: [partial[i][issue] for i in sorted(partial)] for issue in issues}
    summary = {}
    for issue in issues:
        summary[issue] = {}
        for routing in ("uniform", "skewed"):
            mine = [
                r for r in rows_of[issue] if r["name"].endswith("+skew") == (routing == "skewed")
            ]
            summary[issue][routing] = bo.summarize(mine)
            for pattern, where in by_transport(mine).items():
                summary[issue][routing].setdefault(pattern, {})["by_transport"] = where
    return {
        "benchmark": "MoE expert layers: all-to-all + GEMM schedules vs serial and ideal",
        "fingerprint": fingerprint("cuda"),
        "config": {
            "world": args.world,
            "models": list(models),
            "tokens_per_rank": list(tokens),
            "skew_alpha": args.alpha,
            "routing_seed": args.seed,
            "rounds": opts.rounds,
            "issue": list(issues),
        },
        "summary": summary,
        "failures": failures,
        "by_issue": rows_of,
        "wall_s": time.time() - started,
    }


# -- transfers ----------------------------------------------------------------------------


def _transfer_rank(rank: int, world: int, init: str, config: dict, result_file: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init}", rank=rank, world_size=world, device_id=device
    )
    symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
    try:
        rows = [_transfer_size(nbytes, rank, world, device, config) for nbytes in config["sizes"]]
        if rank == 0:
            Path(result_file).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _transfer_size(nbytes: int, rank: int, world: int, device, config: dict) -> dict:
    """Verify, then time, every all-to-all transport at one size (bf16, equal blocks)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from ficco.execute.options import TimingOptions
    from ficco.execute.timing import RanksClock, time_rounds

    group_name = dist.group.WORLD.group_name
    numel = nbytes // 2 // world * world
    block = numel // world  # elements this rank sends each rank
    send = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
    handle = symm_mem.rendezvous(send, group_name)
    recv = torch.empty_like(send)
    gen = torch.Generator(device=device).manual_seed(rank)
    send.copy_(torch.randn(numel, device=device, generator=gen).to(torch.bfloat16))
    # the reference: every peer's block for this rank, gathered with plain all_gather
    every = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(every, send)
    want = torch.cat([every[p][rank * block : (rank + 1) * block] for p in range(world)])
    streams = [torch.cuda.Stream(device=device) for _ in range(world)]

    def nccl():
        dist.all_to_all_single(recv, send)

    def ce_pull():
        caller = torch.cuda.current_stream()
        handle.barrier(channel=0)  # every peer's send buffer is written
        for peer in range(world):
            src = send if peer == rank else handle.get_buffer(peer, (numel,), send.dtype)
            streams[peer].wait_stream(caller)
            with torch.cuda.stream(streams[peer]):
                recv[peer * block : (peer + 1) * block].copy_(
                    src[rank * block : (rank + 1) * block]
                )
            caller.wait_stream(streams[peer])
        handle.barrier(channel=1)  # nobody rewrites a buffer a peer still reads

    fns = {"nccl": nccl, "ce_pull": ce_pull}
    row = {"bytes_per_rank": numel * 2, "world": world, "failures": {}}
    try:
        from ficco.kernels.segment_copy import SegmentCopy

        pulls = SegmentCopy(
            [
                (
                    (send if peer == rank else handle.get_buffer(peer, (numel,), send.dtype))[
                        rank * block : (rank + 1) * block
                    ],
                    recv[peer * block : (peer + 1) * block],
                )
                for peer in range(world)
            ]
        )

        def seg_pull():
            handle.barrier(channel=0)
            pulls()  # every peer's block and the local one: one launch
            handle.barrier(channel=1)

        fns["seg_pull"] = seg_pull
    except ValueError as err:  # a block that is not whole 16-byte vectors
        row["failures"]["seg_pull"] = str(err)[:300]
    vdev = getattr(torch.ops.symm_mem, "all_to_all_vdev", None)
    if vdev is None:
        row["failures"]["all_to_all_vdev"] = "this torch has no symm_mem.all_to_all_vdev"
    else:
        try:
            out_v = symm_mem.empty(numel * 2, dtype=torch.bfloat16, device=device)
            splits = symm_mem.empty((3, world), dtype=torch.int64, device=device)
            splits[0].fill_(block)

            def all_to_all_vdev():
                vdev(send, out_v, splits, group_name)

            all_to_all_vdev()
            torch.cuda.synchronize()
            if not torch.equal(out_v[:numel], want):
                raise RuntimeError("output differs from the reference")
            fns["all_to_all_vdev"] = all_to_all_vdev
        except Exception as err:  # recorded; the run goes on
            row["failures"]["all_to_all_vdev"] = f"{type(err).__name__}: {err}"[:300]
    for name in [n for n in ("nccl", "ce_pull", "seg_pull") if n in fns]:
        recv.fill_(float("nan"))
        fns[name]()
        torch.cuda.synchronize()
        if not torch.equal(recv, want):
            row["failures"][name] = "output differs from the reference"
            fns.pop(name)
    # one untimed call each, then interleaved rounds, each sample the max over ranks
    samples = time_rounds(
        fns, TimingOptions(warmup=1, rounds=config["rounds"]), RanksClock(device), "synced"
    )
    for name, values in samples.items():
        med = statistics.median(values)
        row[name] = {"median_ms": med, "gbps": (world - 1) / world * numel * 2 / med / 1e6}
    if rank == 0:
        print({k: v for k, v in row.items() if k != "failures"}, row["failures"], flush=True)
    return row


def run_transfers(args) -> dict:
    from rank_spawn import spawn_ranks

    from ficco.measure.fingerprint import fingerprint

    sizes = TRANSFER_BYTES[::3] if args.quick else TRANSFER_BYTES
    config = {"sizes": list(sizes), "rounds": 5 if args.quick else args.rounds}
    started = time.time()
    rows = spawn_ranks(_transfer_rank, args.world, config)

    def ratio(row, name="ce_pull"):
        if "nccl" in row and name in row:
            return row["nccl"]["median_ms"] / row[name]["median_ms"]
        return math.nan

    def seg_vs_ce(row):
        if "seg_pull" in row and "ce_pull" in row:
            return row["ce_pull"]["median_ms"] / row["seg_pull"]["median_ms"]
        return math.nan

    big = [ratio(r) for r in rows if r["bytes_per_rank"] >= 16 << 20]
    small = [ratio(r) for r in rows if r["bytes_per_rank"] < 1 << 20]
    big = [v for v in big if v == v]
    return {
        "benchmark": "all-to-all alone: NCCL vs copy-engine pull vs segment-copy kernel pull "
        "vs all_to_all_vdev",
        "fingerprint": fingerprint("cuda"),
        "config": config | {"world": args.world},
        "summary": {
            "ce_over_nccl_speedup_geomean_16MiB_up": math.exp(sum(map(math.log, big)) / len(big))
            if big
            else None,
            "ce_over_nccl_speedup_below_1MiB": small,
            "seg_over_nccl_speedup": {r["bytes_per_rank"]: ratio(r, "seg_pull") for r in rows},
            "seg_over_ce_speedup": {r["bytes_per_rank"]: seg_vs_ce(r) for r in rows},
        },
        "rows": rows,
        "wall_s": time.time() - started,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--part", choices=("layers", "transfers"), default="layers")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", default=",".join(MODELS), help="split a long run over calls")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS_PER_RANK)), help="per rank")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--alpha", type=float, default=1.2, help="skew of expert popularity")
    p.add_argument("--seed", type=int, default=0, help="routing seed")
    p.add_argument("--stall-timeout", type=float, default=180.0)
    p.add_argument("--issue", action="append", choices=("synced", "queued"))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = run_layers(args) if args.part == "layers" else run_transfers(args)
    name = "bench_moe.json" if args.part == "layers" else "bench_moe_transfers.json"
    out = args.out or (os.path.join(os.environ["OUT"], name) if os.environ.get("OUT") else name)
    Path(out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps(report["summary"], indent=1, default=float)[:6000])
    print(f"wrote {out}")
    return 1 if report.get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
