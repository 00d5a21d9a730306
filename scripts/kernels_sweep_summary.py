#!/usr/bin/env python3
"""The summary of a kernels sweep (scripts/kernels_sweep_gpu.sh): geomeans against cuBLAS,
computed from the rows each benchmark's JSON holds (so a phase cut by its cap still counts
what it measured), beside the issue's targets. Plain Python: runs anywhere.

    python scripts/kernels_sweep_summary.py DIR [--json]
    python scripts/kernels_sweep_summary.py profiles/h200/fused_single_gpu_callT.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

SMALL_MS = 0.3  # the fused targets' band edge: cuBLAS time


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def gemm(d: dict) -> dict:
    rows = [r for r in d.get("rows", []) if "ratio" in r]
    out = {"shapes": len(rows)}
    for s in ("full", "chunk"):
        ratios = [r["ratio"] for r in rows if s in r.get("sets", [])]
        out[s] = {"n": len(ratios), "geomean": geomean(ratios), "min": min(ratios, default=None)}
    out["below_0.95"] = sorted(
        (f"{r['M']}x{r['N']}x{r['K']}", round(r["ratio"], 3)) for r in rows if r["ratio"] < 0.95
    )
    return out


def decode(d: dict) -> dict:
    rows = [r for r in d.get("rows", []) if "space" in r.get("ratio", {})]
    space = [r["ratio"]["space"] for r in rows]
    best = [max(1.0, r["ratio"]["space"]) for r in rows]  # the space may pick cuBLAS
    by_m: dict[int, list[float]] = {}
    for r in rows:
        by_m.setdefault(r["M"], []).append(r["ratio"]["space"])
    return {
        "shapes": len(rows),
        "space_geomean": geomean(space),
        "space_min": min(space, default=None),
        "below_0.90": sum(x < 0.9 for x in space),
        "best_of_space_and_cublas_geomean": geomean(best),
        "by_m": {m: round(geomean(v), 3) for m, v in sorted(by_m.items())},
    }


SIDE_SMS = 4  # tune_fused_gpu.SIDE_SMS: the SMs its overlapped launches leave to the copies


def several_tiles(shape_row: dict, sms: int | None, launch: str = "fused_tma") -> bool | None:
    """Whether the default's rule (``FusedGemm.runs_by_default``) takes ready runs for the
    flags-set launch (``fused_tma``) or the schedule's launch where chunks arrive
    (``launch``): recorded since 762e560; for earlier JSON, its tiles (the config name's
    block, W x chunks equal row chunks) against one program per SM (less SIDE_SMS for the
    arriving launch, which takes the arriving tile). None: unknown."""
    rule = shape_row.get("ready_runs")
    if isinstance(rule, dict):
        return rule.get(launch) == "default"
    if launch == "fused_tma":
        name, programs = shape_row.get("configs", {}).get("fused_tma", ""), sms
    else:
        name = shape_row.get("arrival", {}).get("config", "")
        programs = sms - SIDE_SMS if sms else None
    block = re.match(r"(\d+)x(\d+)x", name or "")
    shape = shape_row.get("shape")
    if not (block and shape and programs):
        return None
    chunks = shape["world"] * shape["chunks"]
    rows = math.ceil(shape["m"] / chunks / int(block[1]))
    return chunks * rows * math.ceil(shape["n"] / int(block[2])) > programs


def fused(d: dict) -> dict:
    bands: dict[str, dict] = {}
    sms = d.get("fingerprint", {}).get("sm_count")
    for s in d.get("shapes", []):
        t = s.get("timing", {})
        cub = t.get("cublas", {}).get("median_ms")
        if not cub:
            continue
        band = "small" if cub < SMALL_MS else "large"
        b = bands.setdefault(
            band,
            {
                "fused_tma": [],
                "triton": [],
                "fused_tma_chunk_descs": [],
                "fused_tma_nowait": [],
                "fused_tma_chunkwise": [],
                "overlap_wins": 0,
                "arrival_wins": 0,
                "arrival_differs": 0,
                "arrival_vs_overlap": [],
                "early_wins": 0,
                "early_n": 0,
                "early_arrival_vs_overlap": [],
                "grouped": 0,
                "overlap_grouped_vs_chunkwise": [],
                "launch_vs_per_chunk": [],
                "flags_set_tile_vs_per_chunk": [],
                "early_launch_vs_per_chunk": [],
                "runs_vs_claims": [],
                "arrival_runs_vs_claims": [],
                "early_runs_vs_claims": [],
                "runs_vs_claims_several": [],
                "runs_vs_claims_one": [],
                "fused_tma_by_rule": [],
                "launch_by_rule": [],
                "early_launch_by_rule": [],
            },
        )
        b["n"] = b.get("n", 0) + 1
        for name in ("fused_tma", "triton", "fused_tma_chunk_descs", "fused_tma_nowait"):
            if name in t:
                b[name].append(t[name]["median_ms"] / cub)
        # the fused kernel as it runs chunk by chunk: the grouped config's same tile where
        # the tuner grouped chunks (fused_tma_chunkwise), else fused_tma itself
        chunkwise = t.get("fused_tma_chunkwise") or t.get("fused_tma")
        if chunkwise:
            b["fused_tma_chunkwise"].append(chunkwise["median_ms"] / cub)
        over, per = t.get("fused_overlap"), t.get("per_chunk")
        if over and per and over["median_ms"] < per["median_ms"]:
            b["overlap_wins"] += 1
        # the launch a schedule makes where chunks wait: the arriving tile where it differs
        arrival = t.get("fused_overlap_arrival") or over
        if arrival and per and arrival["median_ms"] < per["median_ms"]:
            b["arrival_wins"] += 1
        if arrival and per:
            b["launch_vs_per_chunk"].append(arrival["median_ms"] / per["median_ms"])
        if over and per:
            b["flags_set_tile_vs_per_chunk"].append(over["median_ms"] / per["median_ms"])
        if over and "fused_overlap_arrival" in t:
            b["arrival_differs"] += 1
            b["arrival_vs_overlap"].append(arrival["median_ms"] / over["median_ms"])
        # early arrivals (no gap before the copies): the same launches and per_chunk
        early = t.get("fused_overlap_arrival_early") or t.get("fused_overlap_early")
        early_per = t.get("per_chunk_early")
        if early and early_per:
            b["early_launch_vs_per_chunk"].append(early["median_ms"] / early_per["median_ms"])
            b["early_n"] += 1
            b["early_wins"] += early["median_ms"] < early_per["median_ms"]
        if "fused_overlap_arrival_early" in t and "fused_overlap_early" in t:
            b["early_arrival_vs_overlap"].append(
                early["median_ms"] / t["fused_overlap_early"]["median_ms"]
            )
        # ready runs against the same launch with its tiles claimed one by one. Three
        # namings: *_runs and *_claims both beside the default (its rule: runs where the
        # tiles outnumber the programs); at cf4dd4e *_runs beside the default (claims); at
        # eaaae54 runs were the default and the claimed twins were the *_claims variants
        has_runs = "fused_tma_runs" in t or "fused_overlap_runs" in t
        has_claims = "fused_tma_claims" in t or "fused_overlap_claims" in t
        if has_runs and has_claims:
            pairs = (
                ("runs_vs_claims", t.get("fused_tma_runs"), t.get("fused_tma_claims")),
                ("arrival_runs_vs_claims", t.get("fused_overlap_runs"),
                 t.get("fused_overlap_claims")),
                ("early_runs_vs_claims", t.get("fused_overlap_runs_early"),
                 t.get("fused_overlap_claims_early")),
            )  # fmt: skip
        elif has_claims:  # eaaae54's JSON
            pairs = (
                ("runs_vs_claims", t.get("fused_tma"), t.get("fused_tma_claims")),
                ("arrival_runs_vs_claims", arrival, t.get("fused_overlap_claims")),
                ("early_runs_vs_claims", early, t.get("fused_overlap_claims_early")),
            )
        else:
            pairs = (
                ("runs_vs_claims", t.get("fused_tma_runs"), t.get("fused_tma")),
                ("arrival_runs_vs_claims", t.get("fused_overlap_runs"), arrival),
                ("early_runs_vs_claims", t.get("fused_overlap_runs_early"), early),
            )
        for key, runs, claimed in pairs:
            if runs and claimed:
                b[key].append(runs["median_ms"] / claimed["median_ms"])
        # flags set, split by the default's rule, and the launch the rule takes / cuBLAS
        runs, claimed = pairs[0][1:]
        several = several_tiles(s, sms)
        if runs and claimed and several is not None:
            b["runs_vs_claims_several" if several else "runs_vs_claims_one"].append(
                runs["median_ms"] / claimed["median_ms"]
            )
        by_rule = t.get("fused_tma")  # the rule's launch itself where the JSON records it
        if runs and claimed and not isinstance(s.get("ready_runs"), dict):
            by_rule = runs if several else claimed
        if by_rule and several is not None:
            b["fused_tma_by_rule"].append(by_rule["median_ms"] / cub)
        # the schedule's launch as the rule takes it, against per_chunk (late, early): the
        # launch itself where the JSON records the rule, else its runs or claimed twin
        several = several_tiles(s, sms, "launch")
        for key, launch, (_, runs, claimed), ref in (
            ("launch_by_rule", arrival, pairs[1], per),
            ("early_launch_by_rule", early, pairs[2], early_per),
        ):
            if runs and claimed and not isinstance(s.get("ready_runs"), dict):
                launch = runs if several else claimed
            if launch and ref and several is not None:
                b[key].append(launch["median_ms"] / ref["median_ms"])
        over_cw = t.get("fused_overlap_chunkwise")
        if "fused_tma_chunkwise" in t:
            b["grouped"] += 1
        if over and over_cw:  # what grouping costs (or gains) where the chunks arrive
            b["overlap_grouped_vs_chunkwise"].append(over["median_ms"] / over_cw["median_ms"])
    return {
        band: {
            "shapes": b["n"],
            "fused_tma_time_vs_cublas": geomean(b["fused_tma"]),
            "triton_time_vs_cublas": geomean(b["triton"]),
            "fused_tma_chunk_descs_time_vs_cublas": geomean(b["fused_tma_chunk_descs"]),
            "fused_tma_nowait_time_vs_cublas": geomean(b["fused_tma_nowait"]),
            "fused_overlap_beats_per_chunk": f"{b['overlap_wins']} of {b['n']}",
            "arriving_tile_beats_per_chunk": f"{b['arrival_wins']} of {b['n']}",
            "arriving_tile_differs": f"{b['arrival_differs']} of {b['n']}",
            "arriving_tile_vs_fused_overlap": geomean(b["arrival_vs_overlap"]),
            "launch_vs_per_chunk": geomean(b["launch_vs_per_chunk"]),
            "flags_set_tile_launch_vs_per_chunk": geomean(b["flags_set_tile_vs_per_chunk"]),
            "early_arrivals_launch_vs_per_chunk": geomean(b["early_launch_vs_per_chunk"]),
            "early_arrivals_arriving_tile_beats_per_chunk": f"{b['early_wins']} of {b['early_n']}",
            "early_arrivals_arriving_tile_vs_fused_overlap": geomean(b["early_arrival_vs_overlap"]),
            "fused_tma_chunk_by_chunk_time_vs_cublas": geomean(b["fused_tma_chunkwise"]),
            "chunks_grouped": f"{b['grouped']} of {b['n']}",
            "fused_overlap_grouped_vs_chunk_by_chunk": geomean(b["overlap_grouped_vs_chunkwise"]),
            "ready_runs_vs_claims": geomean(b["runs_vs_claims"]),
            "ready_runs_vs_claims_shapes": len(b["runs_vs_claims"]),
            "arrival_ready_runs_vs_claims": geomean(b["arrival_runs_vs_claims"]),
            "early_arrival_ready_runs_vs_claims": geomean(b["early_runs_vs_claims"]),
            # flags set, split by the default's rule: several tiles a program (runs) or one;
            # and the launch the rule takes (fused_tma itself since 762e560) / cuBLAS
            "fused_tma_by_rule_time_vs_cublas": geomean(b["fused_tma_by_rule"]),
            "launch_by_rule_vs_per_chunk": geomean(b["launch_by_rule"]),
            "early_arrivals_launch_by_rule_vs_per_chunk": geomean(b["early_launch_by_rule"]),
            "ready_runs_vs_claims_several_tiles": geomean(b["runs_vs_claims_several"]),
            "ready_runs_vs_claims_several_tiles_shapes": len(b["runs_vs_claims_several"]),
            "ready_runs_vs_claims_one_tile": geomean(b["runs_vs_claims_one"]),
            "ready_runs_vs_claims_one_tile_shapes": len(b["runs_vs_claims_one"]),
        }
        for band, b in sorted(bands.items())
    }


#: What each benchmark JSON of a sweep is summarized with, by its name in the sweep's folder;
#: a committed copy keeps the name's stem before a suffix (fused_single_gpu_callT.json)
KINDS = (
    ("bench_gemm.json", gemm),
    ("bench_decode_gemm.json", decode),
    ("fused_single_gpu.json", fused),
)


def kind_of(path: Path) -> tuple[str, object] | None:
    """(the sweep's name, its summary function) of a benchmark JSON ``path``, by its name:
    ``bench_gemm*``, ``bench_decode_gemm*`` or ``fused_single_gpu*``; None for another."""
    for name, fn in sorted(KINDS, key=lambda kind: -len(kind[0])):  # decode before gemm
        if path.name.startswith(name.removesuffix(".json")):
            return name, fn
    return None


def summarize(folder: Path) -> dict:
    """Every benchmark JSON of a sweep's ``folder``, or the one JSON file ``folder`` names."""
    found: dict = {}
    if folder.is_file():
        kind = kind_of(folder)
        if kind is None:
            return {folder.name: {"error": "not a bench_gemm, bench_decode_gemm or "
                                  "fused_single_gpu JSON (by its name)"}}  # fmt: skip
        pairs = [(folder.name, folder, kind[1])]
    else:
        pairs = [(name, folder / name, fn) for name, fn in KINDS]
    for name, path, fn in pairs:
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError as exc:
                found[name] = {"error": f"unreadable: {exc}"}
                continue
            found[name] = {"gpu": (data.get("fingerprint") or {}).get("gpu"), **fn(data)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a sweep's output folder, or one of its JSON files (by name)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON, not lines")
    args = parser.parse_args()
    found = summarize(args.folder)
    if args.json:
        print(json.dumps(found, indent=1))
        return
    for name, part in found.items():
        print(f"{name}: {json.dumps(part, default=str)}")
    print(
        "targets: bf16 full and chunk geomean >= 1.00, none below 0.95; fused time <= 1.02x "
        "cuBLAS above 0.3 ms, <= 1.08x below, fused_overlap beating per_chunk; decode >= 1.00, "
        "none below 0.90"
    )


if __name__ == "__main__":
    main()
