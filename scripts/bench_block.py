"""A tensor- and sequence-parallel transformer block, forward + backward, with ficco's ops.

The block (Llama-3 layout, W ranks, sequence-parallel residual stream ``x_shard [S/W, H]``):

    h   = rmsnorm(x_shard)
    qkv = all_gather_matmul(h, w_qkv)          # [S, (Hq + 2 Hkv) d / W]   column-parallel
    o   = causal attention over this rank's heads
    x   = x_shard + matmul_reduce_scatter(o, w_o)       # [S/W, H]         row-parallel
    h   = rmsnorm(x)
    gu  = all_gather_matmul(h, w_gate_up)      # [S, 2 F / W]
    y   = x + matmul_reduce_scatter(silu(g) * u, w_down)

run by three implementations of the two linears, side by side in one run:

- ``ficco``: ``ficco.ops.all_gather_matmul`` / ``matmul_reduce_scatter``, each call picking its
  schedule from the shipped table for that call's shape (backward through ficco too);
- ``serial``: NCCL (gloo on CPU) all-gather, then matmul; matmul, then reduce-scatter;
- ``async_tp``: PyTorch's symmetric-memory micro-pipeline (``fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter``, backward the dual op), CUDA only.

Each implementation runs eager and ``torch.compile``d (``--modes``). Every step of every
implementation is first verified: loss and every gradient (input and the four weights) against
the serial eager block's, as relative Frobenius error (bf16: 2e-2, fp32: 1e-4). Only verified
implementations are timed: on CUDA, steps interleaved round by round across implementations,
CUDA events around one forward + backward, per step the max over ranks, median over rounds.
``--tokens`` lists the token counts; the ``varying`` case cycles through them step after step
(the op picks per call, so a changing token count needs no retuning). On CPU the script checks
correctness only: CPU timings exercise the harness and are not reported.

Usage:
    python scripts/bench_block.py --world 2                       # 2 GPUs, the full suite
    python scripts/bench_block.py --world 2 --backend cpu --scale 64 --tokens 64,96 --modes eager
Writes ``--out`` (default ``$OUT/bench_block.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rank_spawn import end_rank, spawn_ranks  # noqa: E402

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import RanksClock, time_rounds  # noqa: E402

MODELS = ("llama3-8b", "llama3-70b")
TOKENS = (2048, 4096, 8192, 16384, 32768)
IMPLS = ("ficco", "serial", "async_tp")
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GRAD_NAMES = ("x", "w_qkv", "w_o", "w_gate_up", "w_down")


@dataclass(frozen=True)
class BlockDims:
    """One rank's share of a block: ``hidden`` H, local query/kv heads, head width, local FFN."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int

    @classmethod
    def of(cls, model_name: str, world: int, scale: int) -> BlockDims:
        """``model_name``'s layer split over ``world`` ranks, every width divided by ``scale``
        (CPU checks run the same block at 1/scale of the width)."""
        from ficco.workloads import get_model

        m = get_model(model_name)
        heads, kv_heads = m.heads // world, max(1, m.kv_heads // world)
        if m.heads % world or (m.kv_heads >= world and m.kv_heads % world):
            raise SystemExit(f"--world: {model_name}'s heads do not split over {world} ranks")
        head_dim = max(8, m.head_dim // scale)
        return cls(
            name=model_name,
            hidden=max(8 * world, m.hidden // scale),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            ffn=max(8, m.ffn // scale // world),
        )


def rmsnorm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# -- the three implementations of the two linears -------------------------------------------


class _SerialAllGatherMatmul(torch.autograd.Function):
    """all_gather(a_shard) @ b; backward: reduce_scatter(grad @ b^T) and a_full^T @ grad."""

    @staticmethod
    def forward(ctx, a_shard, b, group):
        a_full = _all_gather_rows(a_shard, group)
        ctx.save_for_backward(a_full, b)
        ctx.group = group
        return a_full @ b

    @staticmethod
    def backward(ctx, grad):
        a_full, b = ctx.saved_tensors
        return _reduce_scatter_rows(grad @ b.t(), ctx.group), a_full.t() @ grad, None


class _SerialMatmulReduceScatter(torch.autograd.Function):
    """reduce_scatter(a @ b); backward: all_gather(grad) @ b^T and a^T @ all_gather(grad)."""

    @staticmethod
    def forward(ctx, a, b, group):
        ctx.save_for_backward(a, b)
        ctx.group = group
        return _reduce_scatter_rows(a @ b, group)

    @staticmethod
    def backward(ctx, grad_shard):
        a, b = ctx.saved_tensors
        grad = _all_gather_rows(grad_shard, ctx.group)
        return grad @ b.t(), a.t() @ grad, None


def _all_gather_rows(t: torch.Tensor, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    out = torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    with warnings.catch_warnings():  # newer torch renames it; the GPU image's has only this
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(out, t.contiguous(), group=group)
    return out


def _reduce_scatter_rows(t: torch.Tensor, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    rows = t.shape[0] // world
    if t.device.type == "cpu":  # gloo has no reduce-scatter: all-reduce, keep this rank's rows
        t = t.contiguous()
        dist.all_reduce(t, group=group)
        rank = dist.get_rank(group)
        return t[rank * rows : (rank + 1) * rows].clone()
    out = torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.reduce_scatter_tensor(out, t.contiguous(), group=group)
    return out


class _AsyncTpAllGatherMatmul(torch.autograd.Function):
    """PyTorch async-TP: fused_all_gather_matmul; backward through fused_matmul_reduce_scatter."""

    @staticmethod
    def forward(ctx, a_shard, b, group_name):
        a_full, (c,) = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, group_name)
        ctx.save_for_backward(a_full, b)
        ctx.group_name = group_name
        return c

    @staticmethod
    def backward(ctx, grad):
        a_full, b = ctx.saved_tensors
        grad_a = torch.ops.symm_mem.fused_matmul_reduce_scatter(
            grad, b.t().contiguous(), "sum", 0, ctx.group_name
        )
        return grad_a, a_full.t() @ grad, None


class _AsyncTpMatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, group_name):
        ctx.save_for_backward(a, b)
        ctx.group_name = group_name
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)

    @staticmethod
    def backward(ctx, grad_shard):
        a, b = ctx.saved_tensors
        grad_full, (grad_a,) = torch.ops.symm_mem.fused_all_gather_matmul(
            grad_shard, [b.t().contiguous()], 0, ctx.group_name
        )
        return grad_a, a.t() @ grad_full, None


def ficco_choices() -> dict[str, str]:
    """problem key -> "schedule (source)" of every ficco op call of the run, forward and
    backward (where the table's pick could not run here, the op says so and runs serial:
    the JSON shows which)."""
    import sys

    if "ficco.ops" not in sys.modules:
        return {}
    from ficco.ops import schedule_counts

    return {c.problem.key: f"{c.schedule} ({c.source})" for c in schedule_counts()}


def linears(impl: str, group):
    """(all_gather_matmul, matmul_reduce_scatter) of ``impl``, both ``f(a, b)``."""
    if impl == "ficco":
        import ficco.ops

        return (
            lambda a, b: ficco.ops.all_gather_matmul(a, b, group),
            lambda a, b: ficco.ops.matmul_reduce_scatter(a, b, group),
        )
    if impl == "serial":
        return (
            lambda a, b: _SerialAllGatherMatmul.apply(a, b, group),
            lambda a, b: _SerialMatmulReduceScatter.apply(a, b, group),
        )
    if impl == "async_tp":
        name = group.group_name
        return (
            lambda a, b: _AsyncTpAllGatherMatmul.apply(a, b, name),
            lambda a, b: _AsyncTpMatmulReduceScatter.apply(a, b, name),
        )
    raise ValueError(f"impl: unknown {impl!r}; expected one of {', '.join(IMPLS)}")


def block(x_shard, weights, dims: BlockDims, ag_mm, mm_rs):
    """The block's forward (module docstring). ``x_shard [S/W, H]`` -> ``[S/W, H]``."""
    w_qkv, w_o, w_gate_up, w_down = weights
    qkv = ag_mm(rmsnorm(x_shard), w_qkv)  # [S, (hq + 2 hkv) d]
    s, d = qkv.shape[0], dims.head_dim
    q, k, v = qkv.split([dims.heads * d, dims.kv_heads * d, dims.kv_heads * d], dim=-1)
    q = q.view(s, dims.heads, d).transpose(0, 1)
    k = k.view(s, dims.kv_heads, d).transpose(0, 1)
    v = v.view(s, dims.kv_heads, d).transpose(0, 1)
    repeat = dims.heads // dims.kv_heads
    k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
    # batched [1, hq, S, d]: 3-D inputs take SDPA's math kernel, an [hq, S, S] matrix (16 GiB
    # at 16384 tokens: the first 2-GPU run ran out of memory), 4-D ones the flash kernel
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    x = x_shard + mm_rs(o.transpose(0, 1).reshape(s, dims.heads * d), w_o)
    gate, up = ag_mm(rmsnorm(x), w_gate_up).chunk(2, dim=-1)
    return x + mm_rs(F.silu(gate) * up, w_down)


def make_weights(dims: BlockDims, rank: int, dtype, device, seed: int):
    """This rank's weight shards, generated from one seed (every rank draws the same full
    weights and keeps its own columns/rows, so runs and implementations agree)."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    h, d = dims.hidden, dims.head_dim
    shapes = (
        (h, (dims.heads + 2 * dims.kv_heads) * d),
        (dims.heads * d, h),
        (h, 2 * dims.ffn),
        (dims.ffn, h),
    )
    return [
        (torch.randn(*shape, generator=gen) / math.sqrt(shape[0])).to(dtype).to(device)
        for shape in shapes
    ]


def one_step(fn, x_shard, weights, probe):
    """Forward + backward; the loss and the gradients (input, four weights)."""
    x = x_shard.detach().requires_grad_(True)
    ws = [w.detach().requires_grad_(True) for w in weights]
    y = fn(x, ws)
    loss = (y.float() * probe).sum()
    loss.backward()
    return loss.detach(), [x.grad] + [w.grad for w in ws]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# -- one rank ------------------------------------------------------------------------------


def rank_main(rank: int, world: int, init_file: str, args: dict, result_file: str) -> None:
    cuda = args["backend"] == "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "0" if cuda else "1")
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=device
        )
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    group = dist.group.WORLD
    if cuda:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(group.group_name)
    rows = run_suite(rank, world, device, group, args)
    if rank == 0:
        result = {"rows": rows, "ficco_choices": dict(sorted(ficco_choices().items()))}
        Path(result_file).write_text(json.dumps(result))
    dist.barrier()
    end_rank(cuda)


def run_suite(rank: int, world: int, device, group, args: dict) -> list[dict]:
    dtype = DTYPES[args["dtype"]]
    cuda = device.type == "cuda"
    impls = [i for i in args["impls"] if cuda or i != "async_tp"]
    rows = []
    for model_name in args["models"]:
        dims = BlockDims.of(model_name, world, args["scale"])
        weights = make_weights(dims, rank, dtype, device, args["seed"])
        cases = [[t] for t in args["tokens"]] + ([list(args["tokens"])] if args["varying"] else [])
        for tokens_cycle in cases:
            for mode in args["modes"]:
                if mode == "compiled":
                    # each case compiles its own block (new linears: dynamo's guards on them
                    # failed every case, and past the recompile limit it ran uncompiled)
                    torch._dynamo.reset()
                rows.append(
                    run_case(
                        rank, world, device, group, dims, weights, tokens_cycle, mode, impls, args
                    )
                )
                if rank == 0:
                    print(json.dumps(_short(rows[-1])), flush=True)
                    if args["run"]["out"]:  # what a run cut short has measured stays
                        write_report(args, rows, partial=True)
    return rows


def _short(row: dict) -> dict:
    keep = (
        "model", "tokens", "mode", "ok", "ms", "serial_over_ficco", "async_tp_over_ficco",
        "errors", "failures",
    )  # fmt: skip
    return {k: row[k] for k in keep if k in row}


def run_case(rank, world, device, group, dims, weights, tokens_cycle, mode, impls, args) -> dict:
    """One (model, token count or cycle, mode): verify every implementation, then time them."""
    dtype = DTYPES[args["dtype"]]
    inputs = []
    for i, tokens in enumerate(tokens_cycle):
        gen = torch.Generator().manual_seed(args["seed"] + 7 * i + 1000 * rank)
        x = torch.randn(tokens // world, dims.hidden, generator=gen).to(dtype).to(device)
        probe = torch.randn(tokens // world, dims.hidden, generator=gen).to(device)
        inputs.append((x, probe))
    reference = [
        one_step(_block_fn(dims, "serial", group, "eager"), x, weights, probe)
        for x, probe in inputs
    ]
    row = {
        "model": dims.name,
        "dims": dims.__dict__,
        "tokens": tokens_cycle[0] if len(tokens_cycle) == 1 else "varying",
        "tokens_cycle": tokens_cycle,
        "mode": mode,
        "ok": {},
        "errors": {},
        "failures": {},
    }
    fns = {}
    for impl in impls:
        try:
            fn = _block_fn(dims, impl, group, mode)
            worst = 0.0
            for (x, probe), (loss_ref, grads_ref) in zip(inputs, reference, strict=True):
                loss, grads = one_step(fn, x, weights, probe)
                errs = [relative_error(loss, loss_ref)] + [
                    relative_error(g, r) for g, r in zip(grads, grads_ref, strict=True)
                ]
                worst = max(worst, *errs)
            ok = worst <= TOLERANCE[dtype]
            row["errors"][impl] = worst
            fns[impl] = fn
        except Exception as err:  # recorded and the run goes on
            ok = False
            row["failures"][impl] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            if args.get("traceback"):
                traceback.print_exc()
        row["ok"][impl] = _all_ranks_true(ok, device)
    if device.type == "cuda":
        timed = [i for i in impls if row["ok"].get(i) and i in fns]
        row["ms"] = time_steps({i: fns[i] for i in timed}, inputs, weights, args["rounds"], device)
        ms = row["ms"]
        if "ficco" in ms:
            for base in ("serial", "async_tp"):
                if base in ms:
                    row[f"{base}_over_ficco"] = ms[base] / ms["ficco"]
    return row


def _block_fn(dims, impl, group, mode):
    ag_mm, mm_rs = linears(impl, group)

    def fn(x, ws):
        return block(x, ws, dims, ag_mm, mm_rs)

    if mode == "compiled":
        return torch.compile(fn, dynamic=False)
    return fn


def _all_ranks_true(flag: bool, device) -> bool:
    t = torch.tensor([0 if flag else 1], device=device)
    dist.all_reduce(t)
    return int(t.item()) == 0


def time_steps(fns: dict, inputs, weights, rounds: int, device) -> dict[str, float]:
    """Median over ``rounds`` of one step's time per implementation (a step runs the whole
    token cycle), interleaved round by round (rotated), per round the max over ranks
    (``ficco.execute.timing``: `time_rounds` on a `RanksClock`), after two untimed steps."""
    if not fns:  # every implementation failed its check: nothing to time
        return {}

    def cycle(fn):
        def run() -> None:
            for x, probe in inputs:
                one_step(fn, x, weights, probe)

        return run

    samples = time_rounds(
        {name: cycle(fn) for name, fn in fns.items()},
        TimingOptions(warmup=2, rounds=rounds),
        RanksClock(device),
        "synced",
        rotate=True,
    )
    return {name: statistics.median(v) for name, v in samples.items()}


# -- the run -------------------------------------------------------------------------------


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict]) -> dict:
    out = {"cases": len(rows), "incorrect": {}}
    for row in rows:
        for impl, ok in row["ok"].items():
            out["incorrect"].setdefault(impl, 0)
            out["incorrect"][impl] += 0 if ok else 1
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        out[mode] = {
            f"{base}_over_ficco_geomean": geomean(
                [r[f"{base}_over_ficco"] for r in mine if f"{base}_over_ficco" in r]
            )
            for base in ("serial", "async_tp")
        }
    return out


def block_arguments(description: str, rounds: int) -> argparse.ArgumentParser:
    """The options this script and bench_decode.py share (world, backend, dtype, scale...)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="bf16 on CUDA, fp32 on CPU"
    )
    p.add_argument("--scale", type=int, default=1, help="divide every width by this (CPU checks)")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = block_arguments(__doc__.split("\n\n")[0], rounds=10)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--no-varying", action="store_true", help="skip the varying-token case")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--traceback", action="store_true")
    args = p.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    for t in tokens:
        if t <= 0 or t % args.world:
            p.error(f"--tokens: each count must be a positive multiple of --world, got {t}")
    for mode in args.modes.split(","):
        if mode not in ("eager", "compiled"):
            p.error(f"--modes: expected eager and/or compiled, got {mode!r}")
    if args.scale < 1:
        p.error(f"--scale: must be >= 1, got {args.scale}")
    args.tokens = tokens
    return args


def write_report(config: dict, rows: list[dict], *, partial: bool = False, **extra) -> dict:
    """The run's report (to ``config["run"]["out"]`` where set): its configuration, the
    environment's fingerprint, the summary and every case's row, and ``extra``; ``partial``
    marks one written while cases are still to run."""
    run = config["run"]
    report = {
        "benchmark": "tensor/sequence-parallel transformer block, forward + backward",
        **({"partial": True} if partial else {}),
        "config": {k: v for k, v in config.items() if k != "run"},
        "world": run["world"],
        "fingerprint": run["fingerprint"],
        "summary": summarize(rows),
        "rows": rows,
        **extra,
        "timings": "CUDA events"
        if config["backend"] == "cuda"
        else "none: CPU runs check correctness only",
    }
    if run["out"]:
        Path(run["out"]).write_text(json.dumps(report, indent=1))
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = args.dtype or ("bf16" if args.backend == "cuda" else "fp32")
    if args.backend == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world: {args.world} GPUs needed, {torch.cuda.device_count()} visible")
    config = {
        "backend": args.backend,
        "models": args.models.split(","),
        "tokens": args.tokens,
        "varying": not args.no_varying,
        "modes": args.modes.split(","),
        "impls": args.impls.split(","),
        "dtype": dtype,
        "scale": args.scale,
        "rounds": args.rounds,
        "seed": args.seed,
        "traceback": args.traceback,
    }
    from ficco.measure.fingerprint import fingerprint

    out = args.out or (
        os.path.join(os.environ["OUT"], "bench_block.json") if os.environ.get("OUT") else None
    )
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    # what every rank is given besides the configuration: where rank 0 writes the report
    # (after each case too, marked partial) and the environment it names
    config["run"] = {"out": out, "world": args.world, "fingerprint": fingerprint(args.backend)}
    started = time.time()
    result = spawn_ranks(rank_main, args.world, config)
    report = write_report(
        config, result["rows"], ficco_choices=result["ficco_choices"],
        wall_s=time.time() - started,
    )  # fmt: skip
    if out:
        print(f"wrote {out}")
    print(json.dumps(report["summary"], indent=1))
    bad = sum(report["summary"]["incorrect"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
