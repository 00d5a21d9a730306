#!/usr/bin/env python3
"""Where the fused FP8 Gluon launch (`ficco.kernels.gluon_fused`) loses to the plain kernel of
the same tile on one GPU: per shape and tile, the plain launch, the fused launch over one chunk
(the whole product: the fused kernel's own cost; `nowait1` the same chunk without a flag, so
its wait's share shows), over two row chunks in one buffer, both
waiting (`fused2`), as an all-gather launches them (`ag2`: the local shard first, from its own
buffer, no wait; the peer's rows waiting) and `_scaled_mm`, each checked against the float64
product first, then timed in interleaved rounds (`LaunchTimer`). JSON to --out.

    python scripts/fused_gluon_ab.py --out FILE [--shapes MxNxK,...] [--configs NAME,...]
        [--copies N] [--shuffle SEED] [--rounds R]
    python scripts/fused_gluon_ab.py --summarize FILE
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

SHAPES = (
    "8192x28672x8192,16384x8192x14336,8192x8192x4096,4096x5120x8192,2048x28672x8192,2048x3072x4096"
)
CONFIGS = "ws_192x128x128_s4_coop3x4,ws_128x128x128_s6_coop2x4"


def fp8_configs_named(text: str, takes=None, what: str = "in the FP8 space") -> dict:
    """The FP8 space's configurations named in a comma list, by name in the order given;
    ValueError naming those that are not there (or that ``takes`` refuses: ``what`` says
    what they had to be)."""
    from ficco.kernels.gluon_configs import FP8_CONFIGS

    space = {c.name: c for c in FP8_CONFIGS}
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in space or (takes and not takes(space[c]))]
    if unknown or not names:
        raise ValueError(f"--configs: {unknown or 'none'} not {what} ({sorted(space)})")
    return {c: space[c] for c in names}


def library_case(m: int, n: int, k: int):
    """Seeded FP8 operands of an M x N x K product, their float64 product, and `_scaled_mm`'s
    launch: (a, b, a_scale, b_scale, reference, {"library": launch}, {"library": its output})."""
    from ficco.kernels.scaled import random_operands

    a, b, sa, sb, _ = random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=m + n + k)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    lib_out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)

    def library() -> None:
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=lib_out)

    return a, b, sa, sb, ref, {"library": library}, {"library": lib_out}


def row_chunk_views(a, sa, out, chunks: int, *, waits: bool = True, local: bool = False):
    """``a``'s rows as ``chunks`` equal row chunks in arrival order, the last rows first (as a
    rank whose shard is the last), each storing to the same rows of ``out``, its flag preset
    (every chunk landed; ``waits`` False: no flags). ``local``: the first chunk is the local
    shard, its rows and scales copied into buffers of their own and read without a wait, as
    `ficco.plan.fused.plan_ag_gemm_fused` launches it. (``FusedChunkViews``, first first.)"""
    from ficco.kernels.fused_views import FusedChunkViews

    part = a.shape[0] // chunks
    flags = torch.ones(chunks, dtype=torch.int32, device=a.device)
    views = [
        FusedChunkViews(
            a[lo : lo + part], out[lo : lo + part], wait=flags[i : i + 1] if waits else None,
            a_scale=sa[lo : lo + part],
        )
        for i, lo in enumerate(reversed(range(0, chunks * part, part)))
    ]  # fmt: skip
    if local:
        first = views[0]
        views[0] = FusedChunkViews(first.a.clone(), first.out, a_scale=first.a_scale.clone())
    return views


def check_then_time(fns: dict, outs: dict, ref, timer, rounds: int, shuffle=None) -> dict:
    """Each launch once on a NaN-poisoned output, checked against ``ref`` (relative Frobenius
    error within `trials.CHECK_TOLERANCE` of the output's dtype); the correct ones timed in ``rounds`` interleaved rounds: the row's
    ms (medians), errors, the variants left out (bad) and ratios (`_scaled_mm` ms / ms)."""
    from ficco.kernels.trials import CHECK_TOLERANCE, relative_error

    errors = {}
    for key, fn in fns.items():
        outs[key].fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        errors[key] = relative_error(outs[key], ref)
    bad = [key for key, e in errors.items() if not e <= CHECK_TOLERANCE[outs[key].dtype]]
    timed = {key: fn for key, fn in fns.items() if key not in bad}
    times = timer.interleaved(timed, rounds, shuffle=shuffle)
    ms = {key: statistics.median(t) for key, t in times.items()}
    ratio = {key: ms["library"] / t for key, t in ms.items()}
    return {"ms": ms, "errors": errors, "bad": bad, "ratio": ratio}


def summarize(doc: dict) -> dict:
    """Per variant (its name less the tile), the geomean over rows and tiles of the plain
    launch's ms of the same tile (as shipped) / its ms: above 1 it ran faster."""
    logs: dict[str, list[float]] = {}
    for row in doc["rows"]:
        for key, ms in row["ms"].items():
            if key == "library":
                continue
            variant, tile = key.split(" ", 1)
            plain = row["ms"].get(f"plain {tile}")
            if plain:
                logs.setdefault(variant, []).append(math.log(plain / ms))
    return {v: round(math.exp(sum(x) / len(x)), 4) for v, x in sorted(logs.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument(
        "--copies", type=int, default=0,
        help="this many more plain launches of each tile, each its own output (plain#i): "
        "how far identical launches differ",
    )  # fmt: skip
    ap.add_argument("--shuffle", type=int, default=None, help="each round in a random order (seed)")
    ap.add_argument("--summarize", type=Path, help="print a run's geomeans and exit")
    args = ap.parse_args(argv)
    if args.summarize:
        print(json.dumps(summarize(json.loads(args.summarize.read_text())), indent=1))
        return 0
    if args.out is None:
        ap.error("--out FILE: where the run's JSON goes (or --summarize FILE)")
    from bench_gemm import fingerprint, parse_dims

    try:  # bad input refused before any GPU work
        shapes = sorted(parse_dims("--shapes", args.shapes, 3), reverse=True)
        if any(m % 2 for m, _, _ in shapes):
            raise ValueError("--shapes: M must be even (two row chunks)")
        configs = fp8_configs_named(args.configs)
        if args.rounds < 1 or args.copies < 0:
            raise ValueError(
                f"--rounds at least 1 (got {args.rounds}), --copies at least 0 (got {args.copies})"
            )
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        sys.exit("fused_gluon_ab: no CUDA device")

    from ficco.execute.timing import launch_timer
    from ficco.kernels import gluon_gemm as gg
    from ficco.kernels.fused import FusedGemm

    timer = launch_timer()
    rows = []
    for m, n, k in shapes:
        text = f"{m}x{n}x{k}"
        a, b, sa, sb, ref, fns, outs = library_case(m, n, k)
        for name, cfg in configs.items():
            out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
            fns[f"plain {name}"] = gg.ws_gemm_launcher(a, b, out, cfg, a_scale=sa, b_scale=sb)
            outs[f"plain {name}"] = out
            # one chunk with and without its flag, two waiting in one buffer, and two as an
            # all-gather launches them (the first the local shard: own buffer, no wait)
            for key, chunks, waits, local in (
                ("nowait1", 1, False, False),
                ("fused1", 1, True, False),
                ("fused2", 2, True, False),
                ("ag2", 2, True, True),
            ):
                out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
                views = row_chunk_views(a, sa, out, chunks, waits=waits, local=local)
                # the Gluon tile given: FusedGemm refuses it, naming why, where it cannot run
                gemm = FusedGemm(views, b, sm_budget=132, timeout_s=10.0, b_scale=sb, config=cfg)
                fns[f"{key} {name}"] = gemm
                outs[f"{key} {name}"] = out
        # identical launches, each its own output: the spread of the same kernel's medians
        for i in range(args.copies):
            for name, cfg in configs.items():
                out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
                fns[f"plain#{i} {name}"] = gg.ws_gemm_launcher(
                    a, b, out, cfg, a_scale=sa, b_scale=sb
                )
                outs[f"plain#{i} {name}"] = out
        timed = check_then_time(fns, outs, ref, timer, args.rounds, args.shuffle)
        row = {"M": m, "N": n, "K": k, **timed}
        rows.append(row)
        print(
            text,
            {key: round(r, 3) for key, r in row["ratio"].items()},
            "bad",
            row["bad"],
            flush=True,
        )
    doc = {
        "environment": fingerprint(None),
        "rows": rows,
    }
    doc["summary"] = summarize(doc)
    print(json.dumps(doc["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
