"""All-reduce on W GPUs: (a) every transport alone, (b) ficco's gemm_ar schedules on real layers.

(a) Every all-reduce transport, 8 KiB ... 256 MiB, eager and in CUDA graphs (bf16, sum):

- ``nccl``: ``dist.all_reduce``;
- ``one_shot`` / ``two_shot``: PyTorch symmetric memory's ``one_shot_all_reduce`` (each rank
  reads every peer's buffer and reduces) and ``two_shot_all_reduce_`` (reduce-scatter, then
  all-gather, on SMs);
- ``ce_pull``: copy engines: each rank pulls every peer's partial from its symmetric buffer on a
  side stream (``cudaMemcpyAsync`` through ``copy_``), then adds them to its own on the
  caller's stream; a device-side symmetric-memory barrier before the pull (peers' partials are
  ready) and after it (nobody overwrites a buffer a peer still reads);
- ``ce_pull_batched``: the same with every peer's copy of one rank issued back to back on one
  stream, and in graphs the whole step captured once, so the copies' fixed cost is paid at
  replay, not at launch (the DMA-Latte recipe without a driver batch API);
- ``lamport1`` / ``lamport2``: ficco's Triton one-shot / two-shot kernels with epoch-valued
  flags (``ficco.kernels.allreduce_lamport``: no barrier per call), up to ``LAMPORT_MAX_BYTES``;
- all-reduce + residual add + RMSNorm (decode sizes, up to ``NORM_MAX_BYTES``; the buffer as
  rows of ``NORM_HIDDEN``): ``nccl_norm``, ``one_shot_norm``, ``two_shot_norm``,
  ``lamport1_norm``: that all-reduce, then ``x + residual`` and ``F.rms_norm`` (unfused);
  ``fused_norm``: ``ficco.ops.all_reduce_add_rms_norm``, one kernel. Verified against the
  fp32 sum plus the residual, normalized (the same tolerance).

Protocol: each transport is first verified on fresh random inputs (every rank's result equal
to the fp32 sum of all ranks' inputs within bf16 tolerance; a transport that fails, raises or
cannot be captured is recorded with its reason and the run goes on); then timed: per size,
transports interleaved round by round; eager: CUDA events around one call after the ranks
align on a host barrier; graphed: ``--graph-iters`` calls captured in one graph, the replay's
time divided by the calls; per round the max over ranks; median and p10/p90 over rounds.
Bus bandwidth = 2 (W - 1) / W x bytes / time (NCCL's convention).

(b) The row-parallel layers (out-proj, fc2) of ``--models`` at W ranks, M in ``--tokens``, as
gemm_ar problems: every schedule the space enumerates (``LAYER_SPACE``: every transport, the
symmetric-memory kernels ``symm1``/``symm2`` and ficco's ``lamport1``/``lamport2`` included,
cuBLAS, 2/4/8 chunks, no SM reserve),
run by ficco's executor (``ficco.execute``: verified against an fp32 reference, captured
and verified again, timed in interleaved rounds with the L2 flushed, the max over ranks,
median), beside serial NCCL + cuBLAS (eager and graphed), serial with the two-shot kernel
(the schedule ``serial/symm2/cublas``) and the ideal: max(GEMM alone, the fastest all-reduce
alone of NCCL, one-shot and two-shot, each the faster of eager and graphed).

Usage:
    python scripts/bench_allreduce.py --world 2 [--quick] [--parts a,b] [--out FILE]
    python scripts/bench_allreduce.py --world 1 --quick --parts a  # one GPU: the code paths
Writes ``--out`` (default ``$OUT/bench_allreduce.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rank_spawn import spawn_ranks  # noqa: E402

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import RanksClock, time_rounds  # noqa: E402

PLAIN = ("nccl", "one_shot", "two_shot", "ce_pull", "ce_pull_batched", "lamport1", "lamport2")
#: all-reduce + residual + RMSNorm: the unfused sequences (an all-reduce of PLAIN, then torch)
#: and ficco's fused op
UNFUSED_NORM = ("nccl_norm", "one_shot_norm", "two_shot_norm", "lamport1_norm")
FUSED_NORM = "fused_norm"
TRANSPORTS = (*PLAIN, *UNFUSED_NORM, FUSED_NORM)
LAMPORT_MAX_BYTES = 64 << 20  # the decode-to-prefill range; one-shot scratch is 6 W x bytes
NORM_MAX_BYTES = 4 << 20  # decode: 512 tokens x 4096 x bf16
NORM_HIDDEN = 8192
NORM_EPS = 1e-5
#: (b): the models and token counts of the layer suite
MODELS = ("llama3-8b", "llama3-70b", "mistral-large-2")
TOKENS = (1, 4, 16, 64, 256, 512, 2048, 8192)
#: (b): M up to this is decode, above it prefill (the issue's two target regimes)
DECODE_MAX_M = 512
SIZES = tuple(8192 << i for i in range(16))  # 8 KiB ... 256 MiB
TOLERANCE = 2e-2  # bf16 sum of W partials against the fp32 sum, relative Frobenius


def applies(name: str, nbytes: int) -> bool:
    """Whether ``name`` is measured at ``nbytes`` (its size range)."""
    if name in (*UNFUSED_NORM, FUSED_NORM):
        return nbytes <= NORM_MAX_BYTES
    return nbytes <= LAMPORT_MAX_BYTES if name.startswith("lamport") else True


class AllReduce:
    """One transport over one symmetric buffer of ``numel`` bf16 elements (a ``*_norm`` one:
    then the residual add and RMSNorm of the sum, as ``[rows, NORM_HIDDEN]``)."""

    def __init__(self, name: str, numel: int, group, device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.name, self.group, self.device = name, group, device
        self.norm = name in (*UNFUSED_NORM, FUSED_NORM)
        if self.norm:
            self.cols = min(numel, NORM_HIDDEN)
            self.rows = numel // self.cols
            gen = torch.Generator(device=device).manual_seed(7)  # replicated: every rank's
            self.residual = torch.randn(self.rows, self.cols, device=device, generator=gen).to(
                torch.bfloat16
            )
            self.weight = (1 + 0.1 * torch.randn(self.cols, device=device, generator=gen)).to(
                torch.bfloat16
            )
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
        self.handle = symm_mem.rendezvous(self.buf, group.group_name)
        self.peers = [p for p in range(self.world) if p != self.rank]
        self.staging = torch.empty((len(self.peers), numel), dtype=torch.bfloat16, device=device)
        self.side = torch.cuda.Stream(device=device)
        self.out = torch.empty(numel, dtype=torch.bfloat16, device=device)

    def __call__(self) -> torch.Tensor:
        """All-reduce ``self.buf`` (then the residual add and RMSNorm); returns the result."""
        if not self.norm:
            return self._all_reduce(self.name)
        import torch.nn.functional as F

        if self.name == FUSED_NORM:
            from ficco.ops import all_reduce_add_rms_norm

            rows = self.buf.view(self.rows, self.cols)
            normed, _ = all_reduce_add_rms_norm(
                rows, self.residual, self.weight, self.group, eps=NORM_EPS
            )
            return normed
        summed = self._all_reduce(self.name.removesuffix("_norm"))
        new_residual = summed.view(self.rows, self.cols) + self.residual
        return F.rms_norm(new_residual, (self.cols,), self.weight, NORM_EPS)

    def reference(self, summed: torch.Tensor) -> torch.Tensor:
        """What ``self()`` should return, from the fp32 sum of the ranks' inputs."""
        if not self.norm:
            return summed
        import torch.nn.functional as F

        new_residual = summed.view(self.rows, self.cols) + self.residual.float()
        return F.rms_norm(new_residual, (self.cols,), self.weight.float(), NORM_EPS)

    def _all_reduce(self, name: str) -> torch.Tensor:
        if name == "nccl":
            dist.all_reduce(self.buf, group=self.group)
            return self.buf
        if name == "one_shot":
            return torch.ops.symm_mem.one_shot_all_reduce(self.buf, "sum", self.group.group_name)
        if name == "two_shot":
            torch.ops.symm_mem.two_shot_all_reduce_(self.buf, "sum", self.group.group_name)
            return self.buf
        if name in ("ce_pull", "ce_pull_batched"):
            return self._ce_pull(batched=name == "ce_pull_batched")
        if name in ("lamport1", "lamport2"):
            from ficco.execute.allreduce import lamport_all_reduce
            from ficco.space.transports import LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT

            kind = LAMPORT_ONE_SHOT if name == "lamport1" else LAMPORT_TWO_SHOT
            lamport_all_reduce(kind, self.buf, self.out, self.group.group_name)
            return self.out
        raise ValueError(f"transport: unknown {name!r}; expected one of {', '.join(TRANSPORTS)}")

    def _ce_pull(self, batched: bool) -> torch.Tensor:
        caller = torch.cuda.current_stream(self.device)
        self.handle.barrier(channel=0)  # every peer's partial is written
        if batched or len(self.peers) <= 1:
            self.side.wait_stream(caller)
            with torch.cuda.stream(self.side):
                for i, peer in enumerate(self.peers):
                    self.staging[i].copy_(self._peer(peer))
            caller.wait_stream(self.side)
        else:  # one stream per peer: the copies may run on separate copy engines
            for i, peer in enumerate(self.peers):
                stream = torch.cuda.Stream(device=self.device)
                stream.wait_stream(caller)
                with torch.cuda.stream(stream):
                    self.staging[i].copy_(self._peer(peer))
                caller.wait_stream(stream)
        self.handle.barrier(channel=1)  # nobody overwrites a partial a peer still reads
        torch.sum(torch.cat([self.buf[None], self.staging]), dim=0, out=self.out)
        return self.out

    def _peer(self, peer: int) -> torch.Tensor:
        return self.handle.get_buffer(peer, tuple(self.buf.shape), self.buf.dtype)


def verify(op: AllReduce, seed: int) -> float:
    """Relative error of ``op`` on fresh random partials against the fp32 sum."""
    gen = torch.Generator(device=op.device).manual_seed(seed + 1000 * op.rank)
    mine = torch.randn(op.buf.numel(), device=op.device, generator=gen).to(torch.bfloat16)
    every = [torch.empty_like(mine) for _ in range(op.world)]
    dist.all_gather(every, mine, group=op.group)
    want = op.reference(torch.stack([t.float() for t in every]).sum(0))
    op.buf.copy_(mine)
    torch.cuda.synchronize(op.device)
    dist.barrier(group=op.group)
    got = op().float()
    torch.cuda.synchronize(op.device)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def capture(op: AllReduce, iters: int) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device=op.device)
    stream.wait_stream(torch.cuda.current_stream(op.device))
    with torch.cuda.stream(stream):
        op()  # warm-up outside capture (lazy initialisations)
    torch.cuda.synchronize(op.device)
    dist.barrier(group=op.group)
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(iters):
            op()
    torch.cuda.synchronize(op.device)
    return graph


def _stats(values: list[float]) -> dict:
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(values), "p10_ms": at(0.1), "p90_ms": at(0.9)}


def one_size(nbytes: int, group, device, args: dict) -> list[dict]:
    """Verify, then time, every transport at one size (eager and graphed)."""
    world = dist.get_world_size(group)
    numel = nbytes // 2
    ops, rows, timed = {}, {}, {}
    for name in [t for t in args["transports"] if applies(t, nbytes)]:
        row = rows[name] = {"transport": name, "bytes": nbytes, "world": world}
        try:
            op = ops[name] = AllReduce(name, numel, group, device)
            err = verify(op, args["seed"])
            row["rel_error"] = err
            ok = err <= TOLERANCE
            if not ok:
                row["failure"] = f"relative error {err:.3g} > {TOLERANCE}"
        except Exception as err:  # recorded; the run goes on
            ok = False
            row["failure"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            if args["traceback"]:
                traceback.print_exc()
        if _all_ranks(ok, device):
            ops[name].buf.zero_()  # timing inputs: zeros stay zeros however often reduced
            timed[name] = {"eager": []}
            try:
                graph = capture(ops[name], args["graph_iters"])
                timed[name]["graph"] = []
                timed[name]["_graph"] = graph
            except Exception as err:
                row["graph_failure"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            torch.cuda.synchronize(device)
            _all_ranks(True, device)
        elif "failure" not in row:
            row["failure"] = "failed on another rank"
    # every transport eager and graphed, interleaved (rotated), one untimed call each first;
    # a graphed sample is one replay of graph_iters calls
    fns = {}
    for name, got in timed.items():
        fns[f"{name}\teager"] = ops[name]
        if got.get("_graph") is not None:
            fns[f"{name}\tgraph"] = got["_graph"].replay
    samples = time_rounds(
        fns, TimingOptions(warmup=1, rounds=args["rounds"]), RanksClock(device, group), "synced",
        rotate=True,
    )  # fmt: skip
    for key, values in samples.items():
        name, mode = key.split("\t")
        per_call = args["graph_iters"] if mode == "graph" else 1
        timed[name][mode] = [v / per_call for v in values]
    for name, samples in timed.items():
        for mode in ("eager", "graph"):
            if samples.get(mode):
                stats = _stats(samples[mode])
                stats["bus_gbps"] = 2 * (world - 1) / world * nbytes / stats["median_ms"] / 1e6
                rows[name][mode] = stats
    return list(rows.values())


def _all_ranks(flag: bool, device) -> bool:
    t = torch.tensor([0 if flag else 1], device=device)
    dist.all_reduce(t)
    return int(t.item()) == 0


def rank_main(rank: int, world: int, init_file: str, args: dict, result_file: str) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=device
    )
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    group = dist.group.WORLD
    enable_symm_mem_for_group(group.group_name)
    try:
        rows = []
        for nbytes in args["sizes"]:
            new = one_size(nbytes, group, device, args)
            rows.extend(new)
            if rank == 0:
                best = {
                    r["transport"]: round(1000 * r[m]["median_ms"], 1)
                    for r in new
                    for m in ("graph",)
                    if m in r
                }
                print(f"{nbytes >> 10} KiB graphed us: {best}", flush=True)
        if rank == 0:
            Path(result_file).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def summarize(rows: list[dict]) -> dict:
    """Per size and mode: the fastest transport and its speed-up over NCCL."""
    out: dict[str, dict] = {}
    for mode in ("eager", "graph"):
        per = {}
        for nbytes in sorted({r["bytes"] for r in rows}):
            here = {
                r["transport"]: r[mode]["median_ms"]
                for r in rows
                if r["bytes"] == nbytes and mode in r
            }
            plain = {k: v for k, v in here.items() if k in PLAIN}
            if not plain:
                continue
            best = min(plain, key=plain.get)  # of the plain all-reduces (no norm)
            per[str(nbytes)] = {
                "best": best,
                "best_us": 1000 * here[best],
                "nccl_over_best": here["nccl"] / here[best] if "nccl" in here else None,
                **norm_speedup(here),
            }
        out[mode] = per
    out["failures"] = [
        {k: r[k] for k in ("transport", "bytes", "failure") if k in r}
        for r in rows
        if "failure" in r
    ]
    return out


def norm_speedup(here: dict[str, float]) -> dict:
    """At one size: the fused all-reduce + residual + RMSNorm against the fastest unfused
    sequence (how many times faster), where both were measured."""
    unfused = {k: v for k, v in here.items() if k in UNFUSED_NORM}
    if FUSED_NORM not in here or not unfused:
        return {}
    fastest = min(unfused, key=unfused.get)
    return {
        "fastest_unfused_norm": fastest,
        "unfused_over_fused_norm": here[fastest] / here[FUSED_NORM],
    }


def layer_space():
    """(b)'s space: every transport (new ones included as the space grows), cuBLAS, 2/4/8
    chunks, no SM reserve (cuBLAS takes none)."""
    from ficco.space import Gemm, SpaceOptions

    return SpaceOptions(chunk_counts=(2, 4, 8), sm_reserves=(0,), gemms=(Gemm.CUBLAS,))


def fused_space():
    """(b)'s fused schedules: the producer's epilogue all-reduces (``+fused``, a Triton GEMM
    by construction), 2/4/8 chunks, no SM reserve; the Triton twins of the unfused schedules
    are left out (they would double the run to say what the GEMM benchmark already says)."""
    from ficco.space import Compute, Gemm, SpaceOptions

    return SpaceOptions(
        chunk_counts=(2, 4, 8), sm_reserves=(0,), gemms=(Gemm.TRITON,), computes=(Compute.FUSED,)
    )


def layer_schedules(problem) -> list:
    """Every schedule (b) runs for ``problem``: the cuBLAS space, then the fused schedules."""
    from ficco.space import enumerate_schedules

    return list(enumerate_schedules(problem, layer_space())) + list(
        enumerate_schedules(problem, fused_space())
    )


def layer_jobs(models, tokens, world: int) -> list:
    """(b)'s (problem, schedules) jobs, small M first (a run cut short covers every layer)."""
    from ficco.workloads import ParallelSetup, get_model, model_problems

    setup = ParallelSetup(world=world, tokens=tuple(tokens), phase="decode")
    problems = [p for name in models for p in model_problems(get_model(name), setup)[0]]
    problems.sort(key=lambda p: (p.m, p.name))
    return [(p, layer_schedules(p)) for p in problems]


def layer_row(problem, measured) -> dict:
    """One layer shape: bench_overlap's row plus the all-reduce baselines of the ideal."""
    import math

    from bench_overlap import shape_row

    from ficco.patterns import ideal_ms, spec_of

    row = shape_row(problem, measured)
    ok = {m.name: m.median_ms for m in measured if m.verdict == "ok"}
    comm = {name: ok[name] for name in spec_of(problem.pattern).comm_alone if name in ok}
    fastest = min(comm, key=comm.get) if comm else None
    ideal = ideal_ms(problem.pattern, ok)
    serial_graph = row["serial_graph_ms"]
    best = row["best_ms"]
    row.update(
        phase="decode" if problem.m <= DECODE_MAX_M else "prefill",
        comm_alone_ms=comm,
        fastest_comm=fastest,
        ideal_ms=ideal,  # against the fastest all-reduce alone, not NCCL's alone
        best_vs_ideal=best / ideal if best == best else math.nan,
        serial_two_shot_ms=ok.get("serial/symm2/cublas", math.nan),
        best_vs_serial_two_shot=ok.get("serial/symm2/cublas", math.nan) / best,
        best_vs_serial_graph=serial_graph / best,
        best_transport=row["best"].split("/")[1] if row["best"] else None,
    )
    return row


def layer_summary(rows: list[dict]) -> dict:
    """Per phase: geomeans of the best schedule against each baseline and the ideal."""
    from bench_overlap import geomean

    out = {}
    for phase in ("decode", "prefill"):
        mine = [r for r in rows if r["phase"] == phase]
        if not mine:
            continue
        out[phase] = {
            "shapes": len(mine),
            "best_vs_serial_nccl_eager_geomean": geomean([r["best_vs_serial"] for r in mine]),
            "best_vs_serial_nccl_graph_geomean": geomean([r["best_vs_serial_graph"] for r in mine]),
            "best_vs_serial_two_shot_geomean": geomean(
                [r["best_vs_serial_two_shot"] for r in mine]
            ),
            "best_over_ideal_geomean": geomean([r["best_vs_ideal"] for r in mine]),
            "incorrect": sum(
                c["verdict"] == "incorrect" for r in mine for c in r["candidates"].values()
            ),
            "best_transports": {
                t: sum(r["best_transport"] == t for r in mine)
                for t in sorted({r["best_transport"] for r in mine if r["best_transport"]})
            },
        }
    return out


def run_layers(args, world: int, out: str | None) -> dict:
    """(b): every schedule of every layer shape, verified and timed by ficco's executor."""
    from bench_overlap import run_suite

    from ficco.execute import TimingOptions
    from ficco.execute.pool import PoolFailure
    from ficco.execute.run import check_gpus

    check_gpus(world)
    models = args.models.split(",")[: 1 if args.quick else None]
    tokens = (1, 64, 2048) if args.quick else tuple(int(t) for t in args.tokens.split(","))
    jobs = layer_jobs(models, tokens, world)
    opts = TimingOptions(rounds=5 if args.quick else args.rounds, issue=("queued",))
    started = time.time()
    rows: dict[int, dict] = {}

    def progress(index, msg):
        verdict = f" -> {msg['verdict']}" if msg.get("verdict") else ""
        p = jobs[index][0]
        print(
            f"    [{time.time() - started:6.1f}s] {p.name} m={p.m}: {msg.get('phase')} "
            f"{msg.get('name')}{verdict}",
            flush=True,
        )

    def done(index, measured, graphs):
        p = jobs[index][0]
        rows[index] = layer_row(p, measured) | {"graphs": graphs}
        r = rows[index]
        print(
            f"[{time.time() - started:6.1f}s] {p.name:22s} m={p.m:<5d} best {r['best']} "
            f"{r['best_ms']:.4f} ms; serial graphed {r['serial_graph_ms']:.4f}, two-shot "
            f"{r['serial_two_shot_ms']:.4f}, ideal {r['ideal_ms']:.4f}",
            flush=True,
        )
        if out:  # a run cut short still leaves what it measured
            Path(out + ".partial").write_text(json.dumps(list(rows.values()), default=float))

    results, _ = run_suite(jobs, opts, world, args.stall_timeout, progress, done)
    failures = [
        {"key": p.key, "name": p.name, "error": str(res)}
        for (p, _), res in zip(jobs, results, strict=True)
        if isinstance(res, PoolFailure)
    ]
    shapes = [rows[i] for i in sorted(rows)]
    return {
        "space": {
            "chunk_counts": list(layer_space().chunk_counts),
            "transports": [t.value for t in layer_space().transports],
            "gemms": [g.value for g in layer_space().gemms],
            "plus": "every +fused schedule (Triton, 2/4/8 chunks)",
            "schedules_per_shape": {p.key: len(s) for p, s in jobs},
        },
        "models": models,
        "tokens": list(tokens),
        "rounds": opts.rounds,
        "issue": list(opts.issue),
        "summary": layer_summary(shapes),
        "failures": failures,
        "shapes": shapes,
        "wall_s": time.time() - started,
    }


def _paragraph(start: str) -> str:
    """The paragraph of this docstring that starts with ``start`` (the protocol in the JSON)."""
    return next(p.strip() for p in __doc__.split("\n\n") if p.startswith(start))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--parts", default="a,b", help="a: transports alone; b: layer schedules")
    p.add_argument("--quick", action="store_true", help="(a) 4 sizes, (b) one model, 3 M; 5 rounds")
    p.add_argument("--transports", default=",".join(TRANSPORTS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--graph-iters", type=int, default=10)
    p.add_argument("--models", default=",".join(MODELS), help="(b) catalog models")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="(b) token counts M")
    p.add_argument("--stall-timeout", type=float, default=120.0, help="(b) seconds = a hang")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traceback", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    for part in parts:
        if part not in ("a", "b"):
            p.error(f"--parts: unknown part {part!r}; expected a, b or a,b")
    for name in args.transports.split(","):
        if name not in TRANSPORTS:
            p.error(f"--transports: unknown {name!r}; expected some of {', '.join(TRANSPORTS)}")
    if args.world < 1 or torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world: {args.world} GPUs needed, {torch.cuda.device_count()} visible")
    config = {
        "sizes": list(SIZES[::5] if args.quick else SIZES),
        "transports": args.transports.split(","),
        "rounds": 5 if args.quick else args.rounds,
        "graph_iters": args.graph_iters,
        "seed": args.seed,
        "traceback": args.traceback,
    }
    out = args.out or (
        os.path.join(os.environ["OUT"], "bench_allreduce.json") if os.environ.get("OUT") else None
    )
    started = time.time()
    from ficco.measure.fingerprint import fingerprint

    report = {
        "benchmark": "all-reduce: (a) transports alone, eager and graphed; (b) gemm_ar layers",
        "protocol": {
            "a": _paragraph("Protocol:"),
            "b": _paragraph("(b)"),
        },
        "world": args.world,
        "fingerprint": fingerprint("cuda"),
    }
    if "a" in parts:
        rows = spawn_ranks(rank_main, args.world, config)
        report["transports"] = {"config": config, "summary": summarize(rows), "rows": rows}
        print(json.dumps(report["transports"]["summary"], indent=1)[:4000])
    if "b" in parts:
        report["layers"] = run_layers(args, args.world, out)
        print(json.dumps(report["layers"]["summary"], indent=1))
    report["wall_s"] = time.time() - started
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1, default=float))
        Path(out + ".partial").unlink(missing_ok=True)
        print(f"wrote {out}")
    layers = report.get("layers", {})
    bad = layers.get("failures") or any(s["incorrect"] for s in layers.get("summary", {}).values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
