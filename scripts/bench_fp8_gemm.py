#!/usr/bin/env python3
"""ficco's Triton FP8 GEMMs (`ficco.kernels.scaled`, and the fused kernel with FP8 operands)
against `torch._scaled_mm` (cuBLASLt) on one GPU.

Shapes: `scripts/bench_gemm.py`'s full and chunk shapes (imported), fp8 e4m3, ordered so a run
cut by its time budget still covers both sets across their sizes (the two sets alternate; each
is visited in a spread order of its sizes).

Protocol, per shape:
  1. operands as a runtime quantizes them (`scaled.random_operands`: seeded normals, per-row
     scales for A, per-column for B, B column-major as `_scaled_mm` takes it); the reference
     is the fp32 product of the dequantized fp8 bits;
  2. every candidate of the FP8 space (`scaled_candidate_configs`) is run on a NaN-poisoned
     output and checked against the reference (relative Frobenius error <= CHECK_LIMIT); the
     correct ones are ranked in interleaved rounds (`kernels.trials.check_then_time` with
     `ficco.execute.timing.LaunchTimer`: L2 flushed, host launch cost kept out of the events);
  3. the best TOP configs, `_scaled_mm` and the fused kernel (two row chunks, flags preset, the
     fastest config whose rows fit a chunk; as ficco launches it, `fused_device_descs` with
     A/C descriptors made in the kernel, `fused_chunkwise` with no chunk group) are each
     verified again, then timed interleaved round by round, order
     rotated, an L2 flush before every launch, CUDA events (`LaunchTimer` again); median over
     rounds;
  4. on every other shape also per-tensor scales (both sides), on the rest fast accumulation
     (Triton's, its candidates ranked again in that mode, and `_scaled_mm(use_fast_accum=
     True)`), each beside `_scaled_mm` with the same scales or accumulation.
  ratio = `_scaled_mm` ms / Triton ms (> 1: Triton faster). `persistent` is the tuner's pick
  (rank 1 in step 2) among configs promoting to fp32 after every K step (cuBLASLt's default
  accumulation); `persistent_best` the fastest of those TOP configs in step 3;
  `persistent_any` also counts the fastest config that promotes every 2-4 K steps
  (`GemmConfig.promote_every`, its error recorded), timed in the same rounds.

Before the shapes, the candidates are compiled in parallel processes (Triton's disk cache),
so the timed loop only loads them. JSON (`fp8_gemm.json` in --out) is rewritten after every
shape, with the fingerprint, the protocol and a summary; the tuned configs also go to
`fp8_gemm_tuning.json` (the tuning cache's format; shipped as `schedules/<card>/`'s copy, where
`scaled_config_for` takes an entry the user's cache lacks). A summary table is printed at the
end.

    python scripts/bench_fp8_gemm.py --out DIR --budget-s 195 [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gemm import _finite, _geomean, _rel_error, shape_sets  # noqa: E402

from ficco.execute.timing import warm_then_rounds  # noqa: E402
from ficco.kernels.configs import CHUNK_GROUP_MAX_ROWS, GemmConfig  # noqa: E402
from ficco.kernels.scaled_configs import FP8_GPU_CONFIGS, scaled_candidate_configs  # noqa: E402

CHECK_LIMIT = 1e-2
TOP = 3
#: the most K steps per fp32 promotion a candidate may take (timed apart from the headline)
PROMOTE_EVERY_MAX = 4
DTYPE = "float8_e4m3fn"


#: the fused launches timed per shape (bench_shape): ficco's, in-kernel descriptors, chunkwise
FUSED_VARIANTS = ("fused", "fused_device_descs", "fused_chunkwise")


def shape_order(shapes: dict) -> list[tuple[int, int, int]]:
    """Full and chunk shapes alternating, each set in a spread order of its sizes (its
    smallest, largest, middle, quarters, ...), so a cut run covers both sets' range."""

    def spread(items: list) -> list:
        n = len(items)
        order, seen = [], set()
        for denom in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            for num in range(denom + 1):
                i = min(n - 1, round(num * (n - 1) / denom))
                if i not in seen:
                    seen.add(i)
                    order.append(items[i])
        return order + [x for j, x in enumerate(items) if j not in seen]

    def flops(s):
        return s[0] * s[1] * s[2]

    full = sorted((s for s in shapes if "full" in shapes[s]["sets"]), key=flops)
    chunk = sorted((s for s in shapes if "full" not in shapes[s]["sets"]), key=flops)
    a, b = spread(full), spread(chunk)
    out = []
    for i in range(max(len(a), len(b))):
        out += ([a[i]] if i < len(a) else []) + ([b[i]] if i < len(b) else [])
    return out


#: The accumulation probe (`accumulation_probe`): a long K, fp32 output, so the error of the
#: sums' precision shows beside the inputs' rounding. Each Triton variant is named by the
#: products its tensor cores sum before an fp32 promotion.
PROBE_SHAPE = (512, 512, 16384)
PROBE_CONFIGS: tuple[tuple[str, GemmConfig, bool], ...] = (
    ("triton_promote_32", GemmConfig(128, 128, 32, 8, 4, 8), False),
    ("triton_promote_64", GemmConfig(128, 128, 64, 8, 4, 8), False),
    ("triton_promote_128", GemmConfig(128, 128, 128, 8, 4, 8), False),
    ("triton_promote_128_lagged", GemmConfig(128, 128, 128, 8, 2, 8, lagged_promotion=True), False),
    ("triton_promote_256", GemmConfig(128, 128, 128, 8, 4, 8, promote_every=2), False),
    ("triton_promote_512", GemmConfig(128, 128, 128, 8, 4, 8, promote_every=4), False),
    ("triton_never", GemmConfig(128, 128, 128, 8, 4, 8), True),
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Compiling ahead (a process pool fills Triton's disk cache)


def compile_tasks() -> list[tuple[str, dict, bool, bool]]:
    """(kernel, config, per-row/column scales, fast accumulation) per compile."""
    out = []
    for cfg in FP8_GPU_CONFIGS:
        out.append(("scaled", cfg.to_dict(), True, False))
        out.append(("fused", cfg.to_dict(), True, False))
    for _, cfg, fast in PROBE_CONFIGS:
        out.append(("probe", cfg.to_dict(), True, fast))
    for cfg in FP8_GPU_CONFIGS:
        out.append(("scaled", cfg.to_dict(), False, False))
        out.append(("scaled", cfg.to_dict(), True, True))
    return out


def _compile(task) -> dict:
    kind, fields, vector, fast = task
    t0 = time.perf_counter()
    try:
        from ficco.kernels import scaled
        from ficco.kernels.fused import FusedChunkViews, FusedGemm

        cfg = GemmConfig.from_dict(fields)
        m, n, k = cfg.block_m * 4, cfg.block_n * 4, cfg.block_k * 8
        a, b, sa, sb, ref = scaled.random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=1)
        if not vector:
            sa, sb = sa.amax().reshape(1, 1), sb.amax().reshape(1, 1)
        out_dtype = torch.float32 if kind == "probe" else torch.bfloat16
        out = torch.empty((m, n), device="cuda", dtype=out_dtype)
        if kind in ("scaled", "probe"):
            ops = scaled.prepare_operands(a, b, sa, sb, out_dtype, out)
            scaled.launch_scaled(ops, sm_budget=132, config=cfg, fast_accum=fast)
        else:
            from ficco.kernels.scaled_fused import unlagged

            cfg = unlagged(cfg)
            views = [
                FusedChunkViews(a[lo : lo + m // 2], out[lo : lo + m // 2], a_scale=sa[lo : lo + m // 2])
                for lo in (0, m // 2)
            ]  # fmt: skip
            FusedGemm(views, b, sm_budget=132, timeout_s=10.0, config=cfg, path="tma", b_scale=sb)()
        torch.cuda.synchronize()
        return {
            "task": [kind, cfg.name, vector, fast],
            "ok": True,
            "s": round(time.perf_counter() - t0, 2),
        }
    except Exception as exc:  # reported, never fatal: the timed loop compiles it again
        return {
            "task": [kind, fields, vector, fast],
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:300],
            "s": round(time.perf_counter() - t0, 2),
        }


def prewarm(workers: int, budget_s: float) -> dict:
    t0 = time.perf_counter()
    todo = compile_tasks()
    results = []
    with mp.get_context("spawn").Pool(workers) as pool:
        pending = pool.imap_unordered(_compile, todo)
        for _ in todo:
            try:
                results.append(
                    pending.next(timeout=max(1.0, budget_s - (time.perf_counter() - t0)))
                )
            except mp.TimeoutError:
                break
        pool.terminate()
    bad = [r for r in results if not r["ok"]]
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "workers": workers,
        "tasks": len(todo),
        "done": len(results),
        "failed": bad[:20],
    }


# ---------------------------------------------------------------------------------------------
# One shape


def accumulation_probe(
    device: str, sm_budget: int, shape: tuple[int, int, int] = PROBE_SHAPE
) -> dict:
    """What each side's accumulation computes: the relative error (Frobenius) of an fp32
    output against the float64 product of the same fp8 bits and scales, for `_scaled_mm` at
    its default and with fast accumulation, and for ficco's kernel promoting to fp32 every
    32 ... 512 products or never (`PROBE_CONFIGS`); `scaled_mm_matches` names the Triton
    variant whose error is nearest `_scaled_mm`'s default (log scale)."""
    from ficco.kernels import scaled

    m, n, k = shape
    a, b, sa, sb, _ = scaled.random_operands(m, n, k, getattr(torch, DTYPE), device, seed=11)
    ref = (a.float().double() * sa.double()) @ (b.float().double() * sb.double())
    found: dict = {"shape": [m, n, k], "out_dtype": "float32", "errors": {}, "failures": {}}

    def error(out: torch.Tensor) -> float:
        return float((out.double() - ref).norm() / ref.norm())

    for fast in (False, True):
        name = "scaled_mm_fast" if fast else "scaled_mm"
        try:
            out = torch._scaled_mm(
                a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32, use_fast_accum=fast
            )
            found["errors"][name] = error(out)
        except RuntimeError as exc:  # recorded: the Triton rows still say what they compute
            found["failures"][name] = f"{type(exc).__name__}: {exc}"[:300]
    out = torch.empty((m, n), dtype=torch.float32, device=device)
    for name, cfg, fast in PROBE_CONFIGS:
        try:
            ops = scaled.prepare_operands(a, b, sa, sb, torch.float32, out)
            out.fill_(float("nan"))
            scaled.launch_scaled(ops, sm_budget=sm_budget, config=cfg, fast_accum=fast)
            found["errors"][name] = error(out)
        except Exception as exc:  # recorded, never fatal
            found["failures"][name] = f"{type(exc).__name__}: {exc}"[:300]
    want = found["errors"].get("scaled_mm")
    tritons = {k: v for k, v in found["errors"].items() if k.startswith("triton_") and v > 0}
    if want and tritons:
        found["scaled_mm_matches"] = min(
            tritons, key=lambda name: abs(math.log(tritons[name] / want))
        )
    return found


class Ops:
    """One shape's operands and every timed variant, each verified before it is timed."""

    def __init__(self, m, n, k, sm_budget: int, seed: int, device: str) -> None:
        from ficco.kernels import scaled

        self.scaled, self.device = scaled, device
        self.m, self.n, self.k, self.sm_budget = m, n, k, sm_budget
        dtype = getattr(torch, DTYPE)
        a, b, sa, sb, self.ref = scaled.random_operands(m, n, k, dtype, device, seed=seed)
        self.a, self.b, self.sa, self.sb = a, b, sa, sb
        self.out = torch.empty((m, n), device=device, dtype=torch.bfloat16)
        self.out_c = torch.empty((m, n), device=device, dtype=torch.bfloat16)
        # per-tensor scales (both sides), and their reference from the same bits
        self.sa1, self.sb1 = sa.amax().reshape(1, 1), sb.amax().reshape(1, 1)
        self.ref1 = None

    def ref_tensor(self) -> torch.Tensor:
        if self.ref1 is None:
            self.ref1 = (self.a.float() * self.sa1) @ (self.b.float() * self.sb1)
        return self.ref1

    def triton(self, cfg: GemmConfig, *, vector=True, fast=False):
        sa, sb = (self.sa, self.sb) if vector else (self.sa1, self.sb1)
        ops = self.scaled.prepare_operands(self.a, self.b, sa, sb, torch.bfloat16, self.out)
        return lambda: self.scaled.launch_scaled(
            ops, sm_budget=self.sm_budget, config=cfg, fast_accum=fast
        )

    def scaled_mm(self, *, vector=True, fast=False):
        sa, sb = (self.sa, self.sb) if vector else (self.sa1.reshape(()), self.sb1.reshape(()))
        return lambda: torch._scaled_mm(
            self.a, self.b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=self.out_c,
            use_fast_accum=fast,
        )  # fmt: skip

    def fused(self, cfg: GemmConfig, host_descriptors: bool | None = None):
        from ficco.kernels.fused import FusedChunkViews, FusedGemm

        half = self.m // 2
        self.flags = torch.ones(
            2, dtype=torch.int32, device=self.device
        )  # preset: every chunk ready
        views = [
            FusedChunkViews(
                self.a[lo:hi], self.out[lo:hi], wait=self.flags[i : i + 1], a_scale=self.sa[lo:hi]
            )
            for i, (lo, hi) in enumerate(((0, half), (half, self.m)))
        ]
        gemm = FusedGemm(
            views, self.b, sm_budget=self.sm_budget, timeout_s=10.0, config=cfg, path="tma",
            b_scale=self.sb, host_descriptors=host_descriptors,
        )  # fmt: skip
        return gemm

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def check(self, fn, out: torch.Tensor, ref: torch.Tensor) -> float:
        out.fill_(float("nan"))
        fn()
        self.sync()
        return _rel_error(out, ref)


def bench_shape(m, n, k, timer, sm_budget: int, extra: str, device: str = "cuda") -> dict:
    from ficco.kernels.scaled_fused import unlagged
    from ficco.kernels.trials import check_then_time
    from ficco.kernels.tuning import wall_clock_timer

    ops = Ops(m, n, k, sm_budget, seed=m * 7919 + n * 31 + k, device=device)
    t0 = time.perf_counter()
    configs = scaled_candidate_configs(
        m, n, k, interpreter=device != "cuda", promote_every=PROMOTE_EVERY_MAX
    )

    rank_timer = timer if device == "cuda" else (lambda fn: wall_clock_timer(fn, repeats=1))
    trials = check_then_time(
        configs, lambda cfg: ops.triton(cfg), ops.out, ops.ref, rank_timer, ops.sync
    )
    tune_s = time.perf_counter() - t0
    order = sorted(trials.timings_ms, key=trials.timings_ms.__getitem__)
    # the headline takes cuBLASLt's accumulation (promotion every K step); the fastest config
    # promoting less often is timed beside, as its own figure
    every_step = [name for name in order if trials.configs[name].promote_every == 1]
    ranked = every_step[:TOP]
    fewer = [name for name in order if trials.configs[name].promote_every > 1][:1]
    ranked += (
        [name for name in fewer if order.index(name) < order.index(ranked[0])] if ranked else []
    )
    if not ranked:
        return {
            "M": m,
            "N": n,
            "K": k,
            "error": "no candidate ran correctly",
            "failures": trials.failures,
        }
    cfgs = {name: trials.configs[name] for name in ranked}
    errors = {
        f"triton:{name}": ops.check(ops.triton(cfg), ops.out, ops.ref) for name, cfg in cfgs.items()
    }
    errors["scaled_mm"] = ops.check(ops.scaled_mm(), ops.out_c, ops.ref)
    fns = {f"triton:{name}": ops.triton(cfg) for name, cfg in cfgs.items()}
    fns["scaled_mm"] = ops.scaled_mm()
    fused_error = None
    # the fused kernel's tiles never straddle its two row chunks: the fastest tile that fits one
    fits = [name for name in order if trials.configs[name].block_m <= m // 2] or order
    fused_config = unlagged(trials.configs[fits[0]])
    # FUSED_VARIANTS: the launch as ficco makes it (host-built A/C descriptors; both chunks
    # in one group where they are few-row: scaled_fused.fused_scaled_config), the same with
    # descriptors made in the kernel, and chunk by chunk
    if m // 2 <= CHUNK_GROUP_MAX_ROWS:
        fused_config = replace(fused_config, chunk_group=2)
    for name, cfg, host in (
        ("fused", fused_config, None),
        ("fused_device_descs", fused_config, False),
        ("fused_chunkwise", replace(fused_config, chunk_group=1), None),
    ):
        try:
            fused = ops.fused(cfg, host_descriptors=host)
            error = ops.check(fused, ops.out, ops.ref)
            if error <= CHECK_LIMIT:
                fns[name] = fused
        except Exception as exc:  # recorded, never fatal
            error = f"{type(exc).__name__}: {exc}"[:300]
        if name == "fused":
            fused_error = error
        else:
            errors[name] = error
    if extra == "tensor":
        best = cfgs[ranked[0]]
        errors["triton_tensor"] = ops.check(
            ops.triton(best, vector=False), ops.out, ops.ref_tensor()
        )
        errors["scaled_mm_tensor"] = ops.check(
            ops.scaled_mm(vector=False), ops.out_c, ops.ref_tensor()
        )
        fns["triton_tensor"] = ops.triton(best, vector=False)
        fns["scaled_mm_tensor"] = ops.scaled_mm(vector=False)
    elif extra == "fast":  # ranked again with fast accumulation: its own fastest tile
        fast_trials = check_then_time(
            configs, lambda cfg: ops.triton(cfg, fast=True), ops.out, ops.ref, rank_timer, ops.sync
        )
        fast_name = fast_trials.best() if fast_trials.timings_ms else ranked[0]
        best = fast_trials.configs.get(fast_name, cfgs[ranked[0]])
        fast_config = best.name
        errors["triton_fast"] = ops.check(ops.triton(best, fast=True), ops.out, ops.ref)
        errors["scaled_mm_fast"] = ops.check(ops.scaled_mm(fast=True), ops.out_c, ops.ref)
        fns["triton_fast"] = ops.triton(best, fast=True)
        fns["scaled_mm_fast"] = ops.scaled_mm(fast=True)
    bad = {name: e for name, e in errors.items() if not e <= CHECK_LIMIT}
    fns = {name: fn for name, fn in fns.items() if name not in bad}
    times, rounds = warm_then_rounds(
        fns,
        timer.interleaved,
        lambda ms: int(min(40, max(10, 60.0 / max(ms, 1e-3)))) if device == "cuda" else 2,
        "scaled_mm",
    )
    ms = {name: statistics.median(t) for name, t in times.items()}
    c_ms = ms.get("scaled_mm", math.nan)
    pick = f"triton:{ranked[0]}"
    timed = [name for name in ms if name.startswith("triton:")]
    same = [name for name in timed if cfgs[name.removeprefix("triton:")].promote_every == 1]
    best_name = min(same, key=ms.__getitem__) if same else pick
    any_name = min(timed, key=ms.__getitem__) if timed else pick
    row = {
        "M": m,
        "N": n,
        "K": k,
        "dtype": DTYPE,
        "scales": "row/column",
        "sm_budget": sm_budget,
        "config": ranked[0],
        "config_fields": cfgs[ranked[0]].to_dict(),
        "best_config": best_name.removeprefix("triton:"),
        "best_config_fields": cfgs[best_name.removeprefix("triton:")].to_dict(),
        "fused_config": fused_config.name,
        "scaled_mm_ms": c_ms,
        "persistent_ms": ms.get(pick, math.nan),
        "persistent_best_ms": ms.get(best_name, math.nan),
        "fused_ms": ms.get("fused", math.nan),
        "ratio_persistent": c_ms / ms.get(pick, math.nan),
        "ratio_persistent_best": c_ms / ms.get(best_name, math.nan),
        "any_config": any_name.removeprefix("triton:"),
        "ratio_persistent_any": c_ms / ms.get(any_name, math.nan),
        "any_rel_error": errors.get(any_name),
        "ratio_fused": c_ms / ms.get("fused", math.nan),
        "ratio_fused_device_descs": c_ms / ms.get("fused_device_descs", math.nan),
        "ratio_fused_chunkwise": c_ms / ms.get("fused_chunkwise", math.nan),
        "tflops_persistent": 2.0 * m * n * k / (ms.get(pick, math.nan) * 1e-3) / 1e12,
        "tflops_scaled_mm": 2.0 * m * n * k / (c_ms * 1e-3) / 1e12,
        "ms": ms,
        "rel_errors": errors,
        "fused_rel_error": fused_error,
        "rejected": bad,
        "rounds": rounds,
        "spread": {
            name: (statistics.quantiles(t, n=4)[2] - statistics.quantiles(t, n=4)[0]) / ms[name]
            for name, t in times.items()
            if len(t) >= 4
        },
        "tune_s": round(tune_s, 2),
        "tune_timings_ms": trials.timings_ms,
        "tune_failures": trials.failures,
    }
    if "triton_tensor" in ms and "scaled_mm_tensor" in ms:
        row["ratio_tensor"] = ms["scaled_mm_tensor"] / ms["triton_tensor"]
    if "triton_fast" in ms and "scaled_mm_fast" in ms:
        row["fast_config"] = fast_config
        row["ratio_fast"] = ms["scaled_mm_fast"] / ms["triton_fast"]
        row["ratio_fast_vs_scaled_mm_precise"] = c_ms / ms["triton_fast"]
        row["scaled_mm_fast_vs_precise"] = c_ms / ms["scaled_mm_fast"]
    return row


# ---------------------------------------------------------------------------------------------
# Main


def summarize(rows: list[dict], shapes: dict) -> dict:
    ok = [r for r in rows if "error" not in r]
    summary: dict = {}
    for set_name in ("full", "chunk"):
        sub = [r for r in ok if set_name in shapes[(r["M"], r["N"], r["K"])]["sets"]]
        for key in ("persistent", "persistent_best", "persistent_any", *FUSED_VARIANTS):
            got = [r[f"ratio_{key}"] for r in sub if r.get(f"ratio_{key}") is not None]
            got = [x for x in got if math.isfinite(x)]
            summary[f"{key}_{set_name}_geomean"] = _geomean(got)
            summary[f"{key}_{set_name}_min"] = min(got, default=math.nan)
            summary[f"{key}_{set_name}_shapes"] = len(got)
    for key in ("tensor", "fast"):
        got = [r[f"ratio_{key}"] for r in ok if f"ratio_{key}" in r]
        summary[f"{key}_geomean"] = _geomean(got)
        summary[f"{key}_shapes"] = len(got)
    errs = [e for r in ok for e in r["rel_errors"].values() if isinstance(e, float)]
    summary["max_rel_error"] = max(errs, default=math.nan)
    summary["rejected"] = sum(len(r["rejected"]) for r in ok)
    summary["shapes_failed"] = [[r["M"], r["N"], r["K"]] for r in rows if "error" in r]
    return summary


def tuning_entries(rows: list[dict], device: str, triton_version: str) -> dict:
    """The tuning cache's entries (``ficco.kernels.tuning`` format) for the timed shapes: the
    faster of the timed configs, by the interleaved rounds."""
    entries = {}
    for r in rows:
        if "error" in r:
            continue
        name, fields = r["best_config"], GemmConfig.from_dict(r["best_config_fields"]).to_dict()
        key = f"{device}|triton={triton_version}|{DTYPE}|m={r['M']},n={r['N']},k={r['K']}|sm={r['sm_budget']}"
        entries[key] = {
            "config": fields,
            "name": name,
            "ms": r["persistent_best_ms"],
            "path": "tma",
            "chosen_by": "bench_fp8_gemm.py interleaved rounds among the top-ranked configs",
            "timings_ms": r["tune_timings_ms"],
            "failures": r["tune_failures"],
        }
    return entries


#: The CPU check's shapes (``--interpret``, under TRITON_INTERPRET=1): odd, ragged, small.
INTERPRET_SHAPES = ((64, 80, 64), (64, 48, 32))


class HostTimer:
    """``--interpret``: host ``perf_counter`` rounds through ``ficco.execute.timing`` (the
    interpreter runs each launch synchronously); only checks the loop, times nothing real."""

    class _Clock:
        def prepare(self, issue: str) -> None:
            return None

        def time(self, fn) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        def collect(self, pending: dict) -> dict:
            return pending

        def synchronize(self) -> None:
            return None

    def interleaved(self, fns: dict, rounds: int) -> dict:
        from ficco.execute.options import TimingOptions
        from ficco.execute.timing import time_rounds

        return time_rounds(fns, TimingOptions(warmup=0, rounds=rounds), self._Clock(), rotate=True)


def dry_run(order, shapes) -> int:
    for m, n, k in order:
        cfgs = scaled_candidate_configs(m, n, k)
        sets = "+".join(sorted(shapes[(m, n, k)]["sets"]))
        print(
            f"{m:>6} {n:>6} {k:>6} {sets:<10} {len(cfgs)} configs: {' '.join(c.name for c in cfgs)}"
        )
    full = sum("full" in shapes[s]["sets"] for s in order)
    print(
        f"{len(order)} shapes ({full} full, {len(order) - full} chunk only); {len(compile_tasks())} compiles ahead"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON")
    parser.add_argument(
        "--budget-s", type=float, default=195.0, help="stop starting shapes after this"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list shapes and configs, run nothing"
    )
    parser.add_argument("--quick", action="store_true", help="bench_gemm.py's quick shapes")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--no-prewarm", action="store_true")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="check the loop on CPU under TRITON_INTERPRET=1 (two tiny shapes, nothing timed)",
    )
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    shapes, _, _ = shape_sets(args.quick)
    order = shape_order(shapes)
    if args.dry_run:
        return dry_run(order, shapes)
    if args.interpret:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--interpret needs TRITON_INTERPRET=1 in the environment")
        shapes = {s: {"sets": {"full", "chunk"}, "layers": {"tiny"}} for s in INTERPRET_SHAPES}
        order = list(INTERPRET_SHAPES)
    elif not torch.cuda.is_available():
        print("bench_fp8_gemm.py needs a CUDA GPU (--dry-run lists the shapes)", file=sys.stderr)
        return 2
    import triton

    from ficco.execute.timing import LaunchTimer
    from ficco.measure.fingerprint import fingerprint

    args.out.mkdir(parents=True, exist_ok=True)
    on_gpu = not args.interpret
    sm_budget = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 3
    device = torch.cuda.get_device_name(0) if on_gpu else "cpu-interpreter"
    result = {
        "benchmark": "fp8 gemm: ficco.kernels.scaled (persistent) and the fused kernel vs torch._scaled_mm",
        "protocol": __doc__.split("Protocol, per shape:")[1].split("Before the shapes")[0].strip(),
        "environment": {
            **fingerprint("cuda" if on_gpu else "cpu"),
            "commit_env": os.environ.get("COMMIT"),
        },
        "budget_s": args.budget_s,
        "rows": [],
        "skipped": [],
    }
    out_json, out_tuning = args.out / "fp8_gemm.json", args.out / "fp8_gemm_tuning.json"

    def save() -> None:
        result["summary"] = summarize(result["rows"], shapes)
        result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        tmp = out_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(_finite(result), indent=1, allow_nan=False))
        tmp.replace(out_json)
        try:  # the measurements above are written whatever happens here
            entries = tuning_entries(result["rows"], device, triton.__version__)
            tuning = json.dumps({"format": 1, "entries": entries}, indent=1, sort_keys=True)
            out_tuning.write_text(tuning)
        except Exception as exc:
            print(f"tuning entries not written: {type(exc).__name__}: {exc}", flush=True)

    if on_gpu and not args.no_prewarm:
        result["prewarm"] = prewarm(args.workers, min(60.0, args.budget_s / 3))
        print(f"[{time.perf_counter() - t_start:6.1f}s] prewarm {result['prewarm']}", flush=True)
        save()
    if on_gpu:
        try:
            result["accumulation"] = accumulation_probe("cuda", sm_budget)
        except Exception as exc:  # recorded, never fatal: the shapes still run
            result["accumulation"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(f"[{time.perf_counter() - t_start:6.1f}s] accumulation {result['accumulation']}")
        save()
    timer = LaunchTimer() if on_gpu else HostTimer()
    for i, (m, n, k) in enumerate(order):
        if time.perf_counter() - t_start > args.budget_s:
            result["skipped"].append([m, n, k])
            continue
        extra = ("fast", "tensor")[i % 2]
        try:
            row = bench_shape(m, n, k, timer, sm_budget, extra, "cuda" if on_gpu else "cpu")
        except Exception as exc:  # one shape's failure is recorded, the run goes on
            row = {"M": m, "N": n, "K": k, "error": f"{type(exc).__name__}: {exc}"[:500]}
        row["sets"] = sorted(shapes[(m, n, k)]["sets"])
        row["layers"] = sorted(shapes[(m, n, k)]["layers"])
        result["rows"].append(row)
        print(
            f"[{time.perf_counter() - t_start:6.1f}s] {i + 1}/{len(order)} {m}x{n}x{k} "
            + (
                f"ERROR {row['error']}"
                if "error" in row
                else f"persistent {row['ratio_persistent']:.3f} fused {row['ratio_fused']:.3f} ({row['config']})"
            ),
            flush=True,
        )
        save()
    save()
    print_table(result)
    return 0


def print_table(result: dict) -> None:
    probe = result.get("accumulation") or {}
    if probe.get("errors"):
        errors = " ".join(f"{k} {v:.2e}" for k, v in probe["errors"].items())
        print(
            f"accumulation {probe['shape']} fp32 out, relative error: {errors}; "
            f"_scaled_mm's default nearest: {probe.get('scaled_mm_matches')}; "
            f"failures {probe.get('failures')}"
        )
    print(
        f"\n{'M':>6} {'N':>6} {'K':>6} {'set':<10} {'config':<26} {'tri ms':>8} {'smm ms':>8} {'pers':>6} {'fused':>6} {'extra':>6}"
    )
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['M']:>6} {r['N']:>6} {r['K']:>6} error {r['error'][:100]}")
            continue
        extra = r.get("ratio_tensor", r.get("ratio_fast", math.nan))
        print(
            f"{r['M']:>6} {r['N']:>6} {r['K']:>6} {'+'.join(r['sets']):<10} {r['config']:<26} "
            f"{r['persistent_ms']:8.4f} {r['scaled_mm_ms']:8.4f} {r['ratio_persistent']:6.3f} "
            f"{r['ratio_fused']:6.3f} {extra:6.3f}"
        )
    s = result["summary"]
    print(
        "persistent vs _scaled_mm: full {:.4f} (min {:.3f}, {} shapes), chunk {:.4f} (min {:.3f}, {} shapes)".format(
            s["persistent_full_geomean"],
            s["persistent_full_min"],
            s["persistent_full_shapes"],
            s["persistent_chunk_geomean"],
            s["persistent_chunk_min"],
            s["persistent_chunk_shapes"],
        )  # fmt: skip
    )
    print(
        "promoting every 2-4 K steps too: full {:.4f}, chunk {:.4f}".format(
            s["persistent_any_full_geomean"], s["persistent_any_chunk_geomean"]
        )
    )
    print(
        "fused with descriptors made in the kernel: full {:.4f}, chunk {:.4f}; chunk by chunk: "
        "full {:.4f}, chunk {:.4f}".format(
            s["fused_device_descs_full_geomean"],
            s["fused_device_descs_chunk_geomean"],
            s["fused_chunkwise_full_geomean"],
            s["fused_chunkwise_chunk_geomean"],
        )  # fmt: skip
    )
    print(
        "fused vs _scaled_mm: full {:.4f} (min {:.3f}), chunk {:.4f} (min {:.3f}); tensor scales {:.4f} "
        "({} shapes); fast accum {:.4f} ({} shapes); max rel error {:.2e}; skipped {}; {} s".format(
            s["fused_full_geomean"],
            s["fused_full_min"],
            s["fused_chunk_geomean"],
            s["fused_chunk_min"],
            s["tensor_geomean"],
            s["tensor_shapes"],
            s["fast_geomean"],
            s["fast_shapes"],
            s["max_rel_error"],
            len(result["skipped"]),
            result["elapsed_s"],
        )  # fmt: skip
    )


if __name__ == "__main__":
    sys.exit(main())
