#!/usr/bin/env python3
"""ficco's Triton embedding-bag pooling (``ficco.kernels.embedding``) beside PyTorch's
``EmbeddingBag`` (and FBGEMM's table-batched op where ``fbgemm_gpu`` imports) on one GPU, over
the MLPerf DLRM-DCNv2 tables; then the fused multi-destination stores verified on the same GPU.

Tables: the 26 Criteo-1TB tables of MLPerf DLRM-DCNv2 from ficco's catalog
(``ficco.workloads_dlrm``: rows capped at 40M as MLPerf does, dim 128, MLPerf's multi-hot
sizes as the pooling factors, 1 ... 100, 214 rows per sample over all 26). Rows are capped at
``--row-cap`` (default 4M: the full 204M rows are 52 GB in bf16, 104 GB in fp32); a capped
table is still 20x the L2 or more, so its gathers stay random DRAM reads. Indices are uniform over each table's rows.

Candidates, each pooling all 26 tables of B samples (sum):
  triton      one ``EmbeddingPool`` launch into ``[B, 26, 128]`` (the tile tuned once per dtype
              at the tuning batch, then fixed for every shape; ``triton2`` is the same launch
              timed again: the noise floor);
  eb_loop     ``torch.nn.functional.embedding_bag`` once per table (26 launches, 26 outputs);
  eb_concat   one ``embedding_bag`` over the 26 tables as one weight (they are views of one
              buffer) with indices shifted by each table's first row: PyTorch in one launch;
  fbgemm      ``SplitTableBatchedEmbeddingBagsCodegen`` where ``fbgemm_gpu`` imports (recorded
              with the reason where it does not).
Shapes: B = 2048 ... 65536 with MLPerf's pooling factors, and one shape with uneven bags
(lengths uniform in [0, 2p], empty bags included); single tables (pooling 1, 12, 100 at
B = 65536) to show the kernel without the one-launch advantage.

Protocol: inputs random (never zeros); every candidate's output poisoned with NaN, computed,
and compared with an fp32 reference (``embedding_bag`` per table on fp32 weights) by
||out - ref|| / ||ref|| (limits: fp32 1e-5, bf16 8e-3) before any timing; each candidate is
captured in a CUDA graph (eager where capture fails, recorded) so host launch cost is out of
every candidate; then ficco's timing (``ficco.execute.timing.time_rounds`` with its
``DeviceClock``): warm-up, rounds interleaved across candidates in rotated order, an L2 flush
before and CUDA events around each launch (the host waits for the GPU before each), the
median.
ratio = best baseline ms / triton ms (> 1: Triton faster); the headline is the geomean over the
26-table shapes.

Fused: W = 4 receive buffers (separate allocations, as peers' buffers are) on the one GPU;
every (destination, table) chunk's rows stored straight into its buffer, one flag per
destination; checked against the reference and every flag set, three launches.

Usage: python scripts/bench_embedding_pool.py [--quick] [--out FILE]; writes
``$OUT/embedding_pool.json`` when ``$OUT`` is set; prints a table last.
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import DeviceClock, time_rounds  # noqa: E402
from ficco.measure.fingerprint import fingerprint  # noqa: E402
from ficco.workloads_dlrm import EMBEDDING_MODELS  # noqa: E402

#: MLPerf DLRM-DCNv2's 26 tables and multi-hot sizes, from ficco's catalog (sources there)
DCNV2 = EMBEDDING_MODELS["dlrm-dcnv2"]
DCNV2_ROWS, DCNV2_POOLING = DCNV2.tables, DCNV2.bags
DIM = DCNV2.dim
BATCHES = (2048, 8192, 16384, 32768, 65536)
TUNE_BATCH = 16384
SINGLE_TABLES = ((0, 1), (19, 12), (20, 100))  # (table, pooling): 40M-row tables
LIMITS = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def fbgemm_status() -> tuple[object | None, str]:
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as err:  # noqa: BLE001 - any import failure means: not available
        return None, (
            f"fbgemm_gpu does not import here ({type(err).__name__}: {err}); the image lacks "
            "it and its wheel (fbgemm-gpu 1.9.0, 497.8 MB) is over the 64 MiB a device call "
            "carries"
        )
    return SplitTableBatchedEmbeddingBagsCodegen, "imported"


class Tables:
    """The 26 tables as views of one weight buffer ``[rows, D]`` (random normal)."""

    def __init__(self, dtype: torch.dtype, row_cap: int, seed: int, device: str = "cuda") -> None:
        self.rows = [min(r, row_cap) for r in DCNV2_ROWS]
        self.first = [sum(self.rows[:t]) for t in range(len(self.rows))]
        gen = torch.Generator(device=device).manual_seed(seed)
        self.weight = torch.randn(sum(self.rows), DIM, device=device, generator=gen).to(dtype)
        self.views = [self.weight[f : f + r] for f, r in zip(self.first, self.rows, strict=True)]


def make_bags(tables, picks, batch, pooling, uneven, gen):
    """Per picked table: (indices, offsets[B + 1]) on the GPU, int64."""
    out, device = [], tables.weight.device
    for t, p in zip(picks, pooling, strict=True):
        if uneven:
            lens = torch.randint(0, 2 * p + 1, (batch,), device=device, generator=gen)
        else:
            lens = torch.full((batch,), p, device=device)
        offsets = torch.zeros(batch + 1, dtype=torch.int64, device=device)
        offsets[1:] = lens.cumsum(0)
        nnz = int(offsets[-1])
        idx = torch.randint(0, tables.rows[t], (nnz,), device=device, generator=gen)
        out.append((idx, offsets))
    return out


def reference(tables, picks, bags) -> torch.Tensor:
    """fp32 pooling, ``[B, T, D]``."""
    cols = []
    for t, (idx, off) in zip(picks, bags, strict=True):
        w = tables.views[t].float()
        cols.append(
            torch.nn.functional.embedding_bag(idx, w, off, mode="sum", include_last_offset=True)
        )
        del w
    return torch.stack(cols, dim=1)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return math.inf  # NaN poison left: a row was never written
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def candidates(tables, picks, bags, configs, fbgemm):
    """name -> (launch fn, output [B, T, D] getter)."""
    from ficco.kernels.embedding import BagTable, EmbeddingPool, PoolSegmentViews

    batch = bags[0][1].numel() - 1
    bag_tables = [
        BagTable(tables.views[t], i, o, True) for t, (i, o) in zip(picks, bags, strict=True)
    ]
    device = tables.weight.device
    out_tri = torch.empty(batch, len(picks), DIM, dtype=tables.weight.dtype, device=device)
    found = {}
    for name, cfg in configs.items():
        segments = [PoolSegmentViews(k, 0, batch, out_tri[:, k]) for k in range(len(picks))]
        pool = EmbeddingPool(bag_tables, segments, mode="sum", config=cfg)
        found[name] = (pool, lambda: out_tri)
    eb_outs: list[torch.Tensor] = []

    def eb_loop():
        eb_outs.clear()
        for t, (i, o) in zip(picks, bags, strict=True):
            eb_outs.append(
                torch.nn.functional.embedding_bag(
                    i, tables.views[t], o, mode="sum", include_last_offset=True
                )
            )

    found["eb_loop"] = (eb_loop, lambda: torch.stack(eb_outs, dim=1))
    # one EmbeddingBag over the tables as one weight: indices shifted to each table's rows
    shifted = torch.cat([i + tables.first[t] for t, (i, _) in zip(picks, bags, strict=True)])
    lens = torch.stack([o[1:] - o[:-1] for _, o in bags])  # [T, B] table-major bags
    cat_off = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=device)
    cat_off[1:] = lens.reshape(-1).cumsum(0)
    cat_out: list[torch.Tensor] = []

    def eb_concat():
        cat_out[:] = [
            torch.nn.functional.embedding_bag(
                shifted, tables.weight, cat_off, mode="sum", include_last_offset=True
            )
        ]

    found["eb_concat"] = (
        eb_concat,
        lambda: cat_out[0].view(len(picks), batch, DIM).transpose(0, 1),
    )
    if fbgemm is not None:
        found.update(fbgemm_candidate(fbgemm, tables, picks, bags))
    return found


def fbgemm_candidate(codegen, tables, picks, bags):  # pragma: no cover - needs fbgemm_gpu
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    specs = [(tables.rows[t], DIM, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for t in picks]
    wtype = {torch.float32: SparseType.FP32, torch.bfloat16: SparseType.BF16}
    op = codegen(
        specs, weights_precision=wtype[tables.weight.dtype], output_dtype=wtype[tables.weight.dtype]
    )
    for k, t in enumerate(picks):
        op.split_embedding_weights()[k].copy_(tables.views[t])
    idx = torch.cat([i for i, _ in bags])
    lens = torch.stack([o[1:] - o[:-1] for _, o in bags])
    off = torch.zeros(lens.numel() + 1, dtype=torch.int64, device="cuda")
    off[1:] = lens.reshape(-1).cumsum(0)
    got: list[torch.Tensor] = []

    def run():
        got[:] = [op(idx, off)]

    batch = bags[0][1].numel() - 1
    return {"fbgemm": (run, lambda: got[0].view(batch, len(picks), DIM))}


def graphed(fn):
    """A CUDA graph of ``fn`` (its replay), or ``fn`` itself where capture fails."""
    try:
        fn()  # allocations outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "graph"
    except Exception as err:  # noqa: BLE001 - fall back and record why
        torch.cuda.synchronize()
        return fn, f"eager ({type(err).__name__}: {str(err)[:120]})"


def measure(found, ref, dtype, rounds, timed_names=None, twice="triton"):
    """Verify every candidate, then time the verified ones; one record per candidate."""
    rec: dict[str, dict] = {}
    runners = {}
    for name, (fn, get) in found.items():
        if timed_names is not None and name not in timed_names:
            continue
        fn()
        get().fill_(float("nan")) if name.startswith("triton") else None
        fn()
        torch.cuda.synchronize()
        err = rel_error(get(), ref)
        ok = err <= LIMITS[dtype]
        rec[name] = {"rel_error": err, "verified": ok}
        if ok:
            runner, how = graphed(fn)
            rec[name]["issue"] = how
            runners[name] = runner
    if twice in runners:
        runners[twice + "2"] = runners[twice]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or (64 << 20)
    flush = torch.empty(max(4 * l2, 256 << 20), dtype=torch.int8, device="cuda")
    options = TimingOptions(warmup=3, rounds=rounds)
    times = time_rounds(runners, options, DeviceClock(flush=flush), rotate=True)
    for name, samples in times.items():
        q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else [samples[0]] * 9
        rec.setdefault(name, {}).update(
            median_ms=statistics.median(samples), p10_ms=q[0], p90_ms=q[-1], rounds=len(samples)
        )
    return rec


def tile_space():
    from ficco.kernels.embedding import PoolConfig

    return {
        f"triton_b{b}_u{u}_w{w}": PoolConfig(b, u, w)
        for b in (4, 8, 16, 32, 64)
        for u in (1, 2, 4)
        for w in (1, 2, 4, 8)
    }


def geomean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def shape_record(tables, picks, batch, pooling, uneven, config, fbgemm, dtype, rounds, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bags = make_bags(tables, picks, batch, pooling, uneven, gen)
    ref = reference(tables, picks, bags)
    found = candidates(tables, picks, bags, {"triton": config}, fbgemm)
    rec = measure(found, ref, dtype, rounds)
    base = {
        n: r["median_ms"]
        for n, r in rec.items()
        if n in ("eb_loop", "eb_concat", "fbgemm") and "median_ms" in r
    }
    best = min(base, key=base.get) if base else None
    tri = rec.get("triton", {}).get("median_ms", math.nan)
    rows = sum(int(o[-1]) for _, o in bags)
    return {
        "batch": batch,
        "tables": len(picks),
        "pooling": "uneven [0, 2p]" if uneven else "MLPerf multi-hot",
        "rows_gathered": rows,
        "candidates": rec,
        "best_baseline": best,
        "ratio": (base[best] / tri) if best else math.nan,
        "noise_ratio": tri / rec.get("triton2", {}).get("median_ms", math.nan),
        "triton_gbps": rows * DIM * tables.weight.element_size() / (tri * 1e-3) / 1e9,
    }


def fused_check(tables, dtype, config, world, batch, seed) -> dict:
    """W receive buffers on one GPU, each its sample block of every table, one flag each."""
    from ficco.kernels.embedding import BagTable, EmbeddingPool, PoolSegmentViews

    picks, device = list(range(len(DCNV2_ROWS))), tables.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    bags = make_bags(tables, picks, batch, DCNV2_POOLING, True, gen)
    ref = reference(tables, picks, bags)
    bag_tables = [
        BagTable(tables.views[t], i, o, True) for t, (i, o) in zip(picks, bags, strict=True)
    ]
    block = batch // world
    recv = [torch.empty(block, len(picks), DIM, dtype=dtype, device=device) for _ in range(world)]
    flags = torch.zeros(world, 8, dtype=torch.int32, device=device)
    segments = [
        PoolSegmentViews(t, r * block, block, recv[r][:, t], flags[r, 0].view(1))
        for r in range(world)
        for t in range(len(picks))
    ]
    pool = EmbeddingPool(bag_tables, segments, mode="sum", config=config)
    errors, flag_ok = [], []
    for _ in range(3):
        for r in recv:
            r.fill_(float("nan"))
        flags.zero_()
        pool()
        if device.type == "cuda":
            torch.cuda.synchronize()
        errors.append(
            max(rel_error(recv[r], ref[r * block : (r + 1) * block]) for r in range(world))
        )
        flag_ok.append(bool((flags[:, 0] == 1).all()) and int(flags[:, 1:].abs().sum()) == 0)
    ok = all(e <= LIMITS[dtype] for e in errors) and all(flag_ok)
    return {
        "world": world,
        "batch": batch,
        "rel_error": max(errors),
        "flags_set": all(flag_ok),
        "verified": ok,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--row-cap", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tune-rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 batches, bf16, 3 tiles (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_embedding_pool: needs a CUDA GPU (found none)", file=sys.stderr)
        return 2
    from ficco.kernels.embedding import DEFAULT_CONFIG

    out_path = Path(args.out or Path(os.environ.get("OUT", ".")) / "embedding_pool.json")
    fbgemm, fb_status = fbgemm_status()
    result = {
        "fingerprint": fingerprint("cuda"),
        "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
        "fbgemm": fb_status,
        "row_cap": args.row_cap,
        "tables": {"rows": DCNV2_ROWS, "pooling": DCNV2_POOLING, "dim": DIM},
        "default_config": list(vars_of(DEFAULT_CONFIG)),
        "dtypes": {},
    }
    space = tile_space()
    if args.quick:
        args.dtypes, args.batches = args.dtypes[:1], args.batches[:2]
        space = dict(list(space.items())[:3])
    picks = list(range(len(DCNV2_ROWS)))
    t0 = time.time()
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        tables = Tables(dtype, args.row_cap, args.seed)
        gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        bags = make_bags(tables, picks, TUNE_BATCH, DCNV2_POOLING, False, gen)
        ref = reference(tables, picks, bags)
        tiles = dict(space)
        tiles["triton_default"] = DEFAULT_CONFIG
        found = candidates(tables, picks, bags, tiles, None)
        tune = measure(found, ref, dtype, args.tune_rounds, timed_names=set(tiles), twice="")
        timed = {n: r["median_ms"] for n, r in tune.items() if "median_ms" in r}
        best_name = min(timed, key=timed.get)
        best = tiles[best_name]
        del found, bags, ref
        print(
            f"[{time.time() - t0:6.1f}s] {dname} tuned: {best_name} {timed[best_name]:.3f} ms "
            f"(default {timed.get('triton_default', math.nan):.3f} ms)",
            flush=True,
        )
        shapes = []
        for batch in args.batches:
            shapes.append(
                shape_record(
                    tables,
                    picks,
                    batch,
                    DCNV2_POOLING,
                    False,
                    best,
                    fbgemm,
                    dtype,
                    args.rounds,
                    args.seed + batch,
                )
            )
            print(
                f"[{time.time() - t0:6.1f}s] {dname} B={batch}: ratio {shapes[-1]['ratio']:.3f}",
                flush=True,
            )
        shapes.append(
            shape_record(
                tables,
                picks,
                TUNE_BATCH,
                DCNV2_POOLING,
                True,
                best,
                fbgemm,
                dtype,
                args.rounds,
                args.seed + 7,
            )
        )
        singles = []
        for t, p in SINGLE_TABLES if not args.quick else SINGLE_TABLES[-1:]:
            singles.append(
                {
                    "table": t,
                    **shape_record(
                        tables,
                        [t],
                        max(args.batches),
                        (p,),
                        False,
                        best,
                        fbgemm,
                        dtype,
                        args.rounds,
                        args.seed + t,
                    ),
                }
            )
        fused = fused_check(tables, dtype, best, 4, 8192, args.seed + 3)
        result["dtypes"][dname] = {
            "tuning": {
                "batch": TUNE_BATCH,
                "best": best_name,
                "config": list(vars_of(best)),
                "ms": timed,
                "records": tune,
            },
            "shapes": shapes,
            "single_tables": singles,
            "fused_multi_destination": fused,
            "geomean_ratio": geomean([s["ratio"] for s in shapes]),
        }
        del tables
        torch.cuda.empty_cache()
        out_path.write_text(json.dumps(result, indent=1, default=str))  # each dtype as it ends
    print(f"\nwrote {out_path}")
    print(
        f"{'dtype':5} {'B':>6} {'pooling':17} {'triton ms':>9} {'best base':>10} {'base ms':>8} {'ratio':>6} {'noise':>6} {'GB/s':>6}"
    )
    for dname, d in result["dtypes"].items():
        for s in d["shapes"] + d["single_tables"]:
            c = s["candidates"]
            b = s["best_baseline"]
            label = s["pooling"] if s["tables"] > 1 else f"table {s['table']} only"
            print(
                f"{dname:5} {s['batch']:6} {label:17} {c['triton'].get('median_ms', math.nan):9.3f} "
                f"{b or '-':>10} {c.get(b, {}).get('median_ms', math.nan):8.3f} {s['ratio']:6.3f} "
                f"{s['noise_ratio']:6.3f} {s['triton_gbps']:6.0f}"
            )
        f = d["fused_multi_destination"]
        print(
            f"{dname}: geomean ratio over 26-table shapes {d['geomean_ratio']:.3f}; tile {d['tuning']['best']}; "
            f"fused W={f['world']}: verified={f['verified']} err={f['rel_error']:.2e} flags={f['flags_set']}"
        )
    print(f"fbgemm: {fb_status}")
    bad = [
        n
        for d in result["dtypes"].values()
        for s in d["shapes"] + d["single_tables"]
        for n, r in s["candidates"].items()
        if r.get("verified") is False
    ]
    if bad or not all(d["fused_multi_destination"]["verified"] for d in result["dtypes"].values()):
        print(f"NOT VERIFIED: {bad}")
        return 1
    return 0


def vars_of(config):
    return (config.block_bags, config.unroll, config.num_warps)


if __name__ == "__main__":
    sys.exit(main())
