"""The decode step of one tensor-parallel transformer block (no sequence parallelism), W ranks.

Per rank, batch ``B`` of new tokens, the activation ``x [B, H]`` replicated:

    qkv = rmsnorm(x) @ w_qkv                         # [B, (hq + 2 hkv) d / W], no communication
    o   = attention of the new tokens over a KV cache of ``--context`` positions (SDPA)
    x   = x + all_reduce(o @ w_o)                    # row-parallel out-projection
    gu  = rmsnorm(x) @ w_gate_up                     # [B, 2 F / W]
    y   = x + all_reduce((silu(g) * u) @ w_down)     # row-parallel fc2

with the two ``all_reduce(a @ b)`` done these ways, side by side in one run:

- ``ficco``: ``ficco.ops.matmul_all_reduce``, the schedule picked per call (serial with one
  warning while no table covers gemm_ar);
- ``nccl``: ``torch.mm`` then ``dist.all_reduce``;
- ``two_shot``: ``torch.mm`` into a symmetric buffer, then PyTorch's
  ``two_shot_all_reduce_`` (CUDA only);
- ``lamport1``: ``torch.mm``, then ficco's one-shot kernel with epoch-valued flags
  (``ficco.kernels.allreduce_lamport``; CUDA only);
- ``fused_norm``: the out-projection's all-reduce, the residual add and the next RMSNorm as
  one op (``ficco.ops.all_reduce_add_rms_norm``: one kernel on CUDA; on CPU the gloo
  all-reduce then the same arithmetic), fc2's all-reduce as ``lamport1`` (CUDA) or
  ``ficco`` (CPU);
- ``no_comm``: the all-reduces left out: the step's ideal, its output wrong by design (not
  verified, only timed).

Every implementation's output is first checked against the ``nccl`` step's (relative
Frobenius error, bf16 2e-2, fp32 1e-4). On CUDA each step is then captured in a CUDA graph, as
engines replay decode steps (first calls made outside capture), and timed by replaying it:
implementations interleaved round by round, CUDA events, the max over ranks, median over
rounds. On CPU the script checks correctness only.

Usage:
    python scripts/bench_decode.py --world 2 [--model llama3-70b] [--out FILE]
    python scripts/bench_decode.py --world 2 --backend cpu --scale 64 --batches 1,4
Writes ``--out`` (default ``$OUT/bench_decode.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

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

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_block import (  # noqa: E402
    DTYPES,
    TOLERANCE,
    BlockDims,
    block_arguments,
    make_weights,
    relative_error,
    rmsnorm,
)
from rank_spawn import end_rank, spawn_ranks  # noqa: E402

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import RanksClock, time_rounds  # noqa: E402

BATCHES = (1, 4, 16, 64, 256)
IMPLS = ("ficco", "nccl", "two_shot", "lamport1", "fused_norm", "no_comm")
#: implementations that run on CUDA only (symmetric memory, ficco's peer-pointer kernels)
CUDA_ONLY = ("two_shot", "lamport1")


def matmul_all_reduces(impl: str, group, device):
    """``f(a, b) = all_reduce(a @ b)`` as ``impl`` does it."""
    if impl == "ficco":
        import ficco.ops

        return lambda a, b: ficco.ops.matmul_all_reduce(a, b, group)
    if impl == "nccl":

        def nccl(a, b):
            c = a @ b
            dist.all_reduce(c, group=group)
            return c

        return nccl
    if impl == "no_comm":
        return lambda a, b: a @ b
    if impl == "lamport1" or (impl == "fused_norm" and device.type == "cuda"):
        from ficco.execute.allreduce import lamport_all_reduce
        from ficco.space.transports import LAMPORT_ONE_SHOT

        def lamport1(a, b):
            c = a @ b
            out = torch.empty_like(c)
            lamport_all_reduce(LAMPORT_ONE_SHOT, c, out, group.group_name)
            return out

        return lamport1
    if impl == "fused_norm":  # CPU: ficco's op on the gloo group
        return matmul_all_reduces("ficco", group, device)
    if impl == "two_shot":
        import torch.distributed._symmetric_memory as symm_mem

        buffers: dict = {}

        def two_shot(a, b):
            shape = (a.shape[0], b.shape[1])
            if shape not in buffers:  # one symmetric buffer per shape, made outside capture
                buf = symm_mem.empty(shape, dtype=a.dtype, device=device)
                symm_mem.rendezvous(buf, group.group_name)
                buffers[shape] = buf
            out = buffers[shape]
            torch.mm(a, b, out=out)
            torch.ops.symm_mem.two_shot_all_reduce_(out, "sum", group.group_name)
            return out.clone()

        return two_shot
    raise ValueError(f"impl: unknown {impl!r}; expected one of {', '.join(IMPLS)}")


def add_norms(impl: str, group, hidden: int, dtype, device):
    """``f(a, b, residual) = (rmsnorm(new), new)``, ``new = residual + all_reduce(a @ b)``, as
    one op (``fused_norm``), or None (the step adds and normalizes after ``mm_ar``)."""
    if impl != "fused_norm":
        return None
    from ficco.ops import all_reduce_add_rms_norm

    ones = torch.ones(hidden, dtype=dtype, device=device)  # bench_block's rmsnorm: no weight
    return lambda a, b, residual: all_reduce_add_rms_norm(a @ b, residual, ones, group, eps=1e-5)


def decode_step(x, cache, weights, dims: BlockDims, mm_ar, add_norm=None):
    """One decode step (module docstring). ``x [B, H]``; ``cache`` = (k, v) ``[hkv, T, d]``;
    ``add_norm``: the out-projection's all-reduce, residual add and RMSNorm as one call."""
    w_qkv, w_o, w_gate_up, w_down = weights
    b, d = x.shape[0], dims.head_dim
    qkv = rmsnorm(x) @ w_qkv
    q, k_new, v_new = qkv.split([dims.heads * d, dims.kv_heads * d, dims.kv_heads * d], dim=-1)
    k_cache, v_cache = cache
    # each new token attends to the cache and to every new token (a batch of B sequences
    # sharing one cache here: the cost is what matters, the layout is the common one)
    k = torch.cat([k_cache, k_new.view(b, dims.kv_heads, d).transpose(0, 1)], dim=1)
    v = torch.cat([v_cache, v_new.view(b, dims.kv_heads, d).transpose(0, 1)], dim=1)
    repeat = dims.heads // dims.kv_heads
    q = q.view(b, dims.heads, d).transpose(0, 1)  # [hq, B, d]
    o = F.scaled_dot_product_attention(
        q, k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
    )
    attn = o.transpose(0, 1).reshape(b, dims.heads * d)
    if add_norm is None:
        x = x + mm_ar(attn, w_o)
        normed = rmsnorm(x)
    else:
        normed, x = add_norm(attn, w_o, x)
    gate, up = (normed @ w_gate_up).chunk(2, dim=-1)
    return x + mm_ar(F.silu(gate) * up, w_down)


def rank_main(rank: int, world: int, init_file: str, args: dict, result_file: str) -> None:
    cuda = args["backend"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=device
        )
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(dist.group.WORLD.group_name)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    rows = [one_batch(b, rank, world, device, args) for b in args["batches"]]
    if rank == 0:
        Path(result_file).write_text(json.dumps(rows))
    dist.barrier()
    end_rank(cuda)


def one_batch(batch: int, rank: int, world: int, device, args: dict) -> dict:
    import warnings

    dtype = DTYPES[args["dtype"]]
    group = dist.group.WORLD
    cuda = device.type == "cuda"
    dims = BlockDims.of(args["model"], world, args["scale"])
    weights = make_weights(dims, rank, dtype, device, args["seed"])
    gen = torch.Generator().manual_seed(args["seed"] + 1)  # x replicated: the same seed
    x = torch.randn(batch, dims.hidden, generator=gen).to(dtype).to(device)
    cache_gen = torch.Generator().manual_seed(args["seed"] + 100 + rank)  # this rank's heads
    cache = tuple(
        torch.randn(dims.kv_heads, args["context"], dims.head_dim, generator=cache_gen)
        .to(dtype)
        .to(device)
        for _ in range(2)
    )
    impls = [i for i in args["impls"] if cuda or i not in CUDA_ONLY]
    row = {"batch": batch, "ok": {}, "errors": {}, "failures": {}}
    steps = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ficco op's one fallback warning: recorded below
        want = decode_step(x, cache, weights, dims, matmul_all_reduces("nccl", group, device))
        for impl in impls:
            # one f per implementation, kept across calls: two_shot's symmetric buffers are
            # made in the first (eager) call and reused under capture, where freeing one aborts
            mm_ar = matmul_all_reduces(impl, group, device)
            add_norm = add_norms(impl, group, dims.hidden, dtype, device)

            def step(mm_ar=mm_ar, add_norm=add_norm):
                return decode_step(x, cache, weights, dims, mm_ar, add_norm)

            try:
                got = step()
                ok = True
                if impl != "no_comm":
                    row["errors"][impl] = relative_error(got, want)
                    ok = row["errors"][impl] <= TOLERANCE[dtype]
                steps[impl] = step
            except Exception as err:  # recorded; the run goes on
                ok = False
                row["failures"][impl] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            flag = torch.tensor([0 if ok else 1], device=device)
            dist.all_reduce(flag)
            row["ok"][impl] = int(flag.item()) == 0
        if cuda:
            row.update(time_graphed({i: steps[i] for i in impls if row["ok"][i]}, args, device))
    return row


def time_graphed(steps: dict, args: dict, device) -> dict:
    """Each step captured in a CUDA graph and replayed, interleaved (rotated: `time_rounds` on
    a `RanksClock`, two untimed replays first); median of the max over ranks. A step whose
    capture fails is timed eagerly and says so."""
    graphs, mode = {}, {}
    for name, step in steps.items():
        try:
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream())
            dist.barrier()
            with torch.cuda.graph(graph, stream=side):
                step()
            graphs[name], mode[name] = graph.replay, "graph"
        except Exception as err:
            graphs[name], mode[name] = step, f"eager (capture failed: {type(err).__name__})"
            torch.cuda.synchronize()
        dist.barrier()
    samples = time_rounds(
        graphs, TimingOptions(warmup=2, rounds=args["rounds"]), RanksClock(device), "synced",
        rotate=True,
    )  # fmt: skip
    ms = {name: statistics.median(v) for name, v in samples.items()}
    out = {"ms": ms, "mode": mode}
    for mine in ("ficco", "lamport1", "fused_norm"):
        if mine not in ms:
            continue
        for base in ("nccl", "two_shot"):
            if base in ms:
                out[f"{base}_over_{mine}"] = ms[base] / ms[mine]
        if "no_comm" in ms:
            out[f"{mine}_over_no_comm"] = ms[mine] / ms["no_comm"]
    return out


def main(argv=None) -> int:
    p = block_arguments(__doc__.split("\n\n")[0], rounds=20)
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--context", type=int, default=2048, help="KV-cache positions")
    p.add_argument("--impls", default=",".join(IMPLS))
    args = p.parse_args(argv)
    if args.backend == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world: {args.world} GPUs needed, {torch.cuda.device_count()} visible")
    for impl in args.impls.split(","):
        if impl not in IMPLS:
            p.error(f"--impls: unknown {impl!r}; expected some of {', '.join(IMPLS)}")
    config = {
        "backend": args.backend,
        "model": args.model,
        "batches": [int(b) for b in args.batches.split(",")],
        "context": args.context,
        "impls": args.impls.split(","),
        "dtype": args.dtype or ("bf16" if args.backend == "cuda" else "fp32"),
        "scale": args.scale,
        "rounds": args.rounds,
        "seed": args.seed,
    }
    started = time.time()
    rows = spawn_ranks(rank_main, args.world, config)
    from ficco.measure.fingerprint import fingerprint

    def geomean(key):
        values = [r[key] for r in rows if key in r]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    report = {
        "benchmark": "tensor-parallel decode step: ficco's matmul_all_reduce, lamport1 and the "
        "fused all-reduce + residual + RMSNorm vs NCCL vs two-shot",
        "config": config,
        "world": args.world,
        "fingerprint": fingerprint(args.backend),
        "summary": {
            "incorrect": sum(not ok for r in rows for i, ok in r["ok"].items() if i != "no_comm"),
            "nccl_over_ficco_geomean": geomean("nccl_over_ficco"),
            "two_shot_over_ficco_geomean": geomean("two_shot_over_ficco"),
            "ficco_over_no_comm_geomean": geomean("ficco_over_no_comm"),
            "two_shot_over_lamport1_geomean": geomean("two_shot_over_lamport1"),
            "two_shot_over_fused_norm_geomean": geomean("two_shot_over_fused_norm"),
            "nccl_over_fused_norm_geomean": geomean("nccl_over_fused_norm"),
        },
        "rows": rows,
        "timings": "CUDA graphs"
        if args.backend == "cuda"
        else "none: CPU runs check correctness only",
        "wall_s": time.time() - started,
    }
    out = args.out or (
        os.path.join(os.environ["OUT"], "bench_decode.json") if os.environ.get("OUT") else None
    )
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")
    print(json.dumps(report["summary"], indent=1))
    return 1 if report["summary"]["incorrect"] else 0


if __name__ == "__main__":
    sys.exit(main())
