"""Project the catalog to W = 8 ... 64 with ficco's cost model (calibrated on 2xH200).

    python scripts/model_project.py [--tokens 8192 32768] [--out profiles/projection]

For each W, the tensor-parallel layers (ag_gemm, gemm_rs) of every catalog model at the given
token counts, predicted on the machine of that size: ``h200x8`` (one HGX H200 node) for W = 8,
``h200x8n2/4/8`` (2, 4, 8 such nodes, one 400 Gb/s NIC per GPU) for W = 16, 32, 64. None of
these machines was measured: their descriptions carry vendor figures and say so. Writes
``projection.json`` (every problem: the predicted best, its time, serial, ideal) and
``projection.md`` (a table per W, with the assumptions beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ficco.model import SHIPPED_PARAMS, predictor  # noqa: E402
from ficco.problem import Pattern  # noqa: E402
from ficco.workloads import ParallelSetup, catalog_problems, unique_problems  # noqa: E402

MACHINES = {8: "h200x8", 16: "h200x8n2", 32: "h200x8n4", 64: "h200x8n8"}

ASSUMPTIONS = """\
Assumptions (a projection, not a measurement):
- Costs are the 2xH200 calibration (`schedules/h200x2/model.json`): per-chunk cuBLAS GEMM times,
  copy-engine and NCCL fixed costs and efficiencies, contention and host issue costs measured
  at W = 2, applied unchanged at larger W.
- Links from vendor figures (`ficco/model/machines/*.json`, `measured: false`): NVLink 4 at 450
  GB/s per direction per GPU through NVSwitch inside a node; between nodes one 400 Gb/s NIC per
  GPU (50 GB/s per direction) with 2 us latency. Calibrated efficiencies are applied to the NIC
  as to NVLink: no measurement of ficco's transfers over InfiniBand exists.
- Copy-engine schedules to peers on other nodes are modelled as one-sided RDMA at the NIC's
  rate with the copy engine's fixed cost; ficco's executor has no inter-node copy-engine path
  today, so their rows are what such a transport would give, not what ficco runs now.
- NCCL collectives are rings over the slowest link crossed (the NIC beyond one node); NVLS
  (multicast) and tree algorithms are not modelled (multicast is off on the measured hosts).
- Serial and ideal use the undecomposed cuBLAS GEMM and the NCCL collective, as the design
  defines them, so a copy-engine schedule can come under "ideal" where NCCL is the slower
  transport.
- Comm priority (`+hi`) has no term in the model: its rows equal their twins'.
- Eager schedules (overlapped NCCL: no CUDA graph) are timed as each alone under queued
  issue: the host starts issuing ahead of the GPU by the lead one timed iteration's flush and
  barrier give it (`lead_ms`, fitted on the W = 2 store's rounds replayed as timed:
  `ficco.model.rounds`), and its issue time (per-op costs of ficco's Python executor, measured
  at W = 2) shows only beyond that lead. A runtime issuing from a different host path, or with
  another lead, moves these rows; the CUDA-graph rows do not depend on it.
- Beyond one node most of the projected gain is transport, not overlap: serial's flat NCCL
  ring moves (W-1)/W of the data through the NIC at NCCL's calibrated efficiency, while the
  copy-engine/RDMA schedules move only the other nodes' shards through it, at the copy
  engine's efficiency. Read W >= 16 gains as "an NVLink-aware transport plus overlap".
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--out", type=Path, default=ROOT / "profiles" / "projection")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, skipped_all, began = [], [], time.time()
    for world, machine in MACHINES.items():
        pr = predictor(machine)
        setup = ParallelSetup(world=world, tokens=tuple(args.tokens), dtype="bf16")
        problems, skipped = catalog_problems(
            None, setup, patterns=(Pattern.AG_GEMM, Pattern.GEMM_RS)
        )
        skipped_all += [f"W={world} {s.name}@{s.tokens}: {s.reason}" for s in skipped]
        unique, _ = unique_problems(problems)
        for p in unique:
            prediction = pr.predict(p)
            best = prediction.best
            rows.append(
                {
                    "world": world,
                    "machine": machine,
                    "problem": p.name,
                    "pattern": p.pattern.value,
                    "m": p.m,
                    "n": p.n,
                    "k": p.k,
                    "best": best.schedule,
                    "best_ms": best.ms,
                    "serial_ms": prediction.serial_ms,
                    "ideal_ms": prediction.ideal_ms,
                    "gain_over_serial": prediction.serial_ms / best.ms,
                }
            )
        print(f"W={world}: {len(unique)} problems ({time.time() - began:.0f} s)", flush=True)
    summary = {}
    for world in MACHINES:
        for pattern in ("ag_gemm", "gemm_rs"):
            sel = [r for r in rows if r["world"] == world and r["pattern"] == pattern]
            if not sel:
                continue
            gains = [r["gain_over_serial"] for r in sel]
            summary[f"W={world} {pattern}"] = {
                "problems": len(sel),
                "gain_geomean": math.exp(statistics.fmean(math.log(g) for g in gains)),
                "gain_min": min(gains),
                "gain_max": max(gains),
                "best_schedules": dict(Counter(r["best"] for r in sel).most_common(4)),
            }
    payload = {
        "params": str(SHIPPED_PARAMS.relative_to(ROOT)),
        "tokens": args.tokens,
        "machines": MACHINES,
        "assumptions": ASSUMPTIONS,
        "skipped": skipped_all,
        "summary": summary,
        "rows": rows,
    }
    (args.out / "projection.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [
        "# Projection: the catalog at W = 8 ... 64 (cost model, not measured)",
        "",
        f"`python scripts/model_project.py --tokens {' '.join(map(str, args.tokens))}`; every "
        "row in `projection.json`.",
        "",
        ASSUMPTIONS,
        "| W | machine | pattern | problems | gain over serial (geomean, min-max) | "
        "most often best |",
        "|---|---|---|---|---|---|",
    ]
    for key, s in summary.items():
        world, pattern = key.split()
        top = ", ".join(f"`{k}` {v}" for k, v in s["best_schedules"].items())
        lines.append(
            f"| {world[2:]} | {MACHINES[int(world[2:])]} | {pattern} | {s['problems']} | "
            f"{s['gain_geomean']:.2f} ({s['gain_min']:.2f}-{s['gain_max']:.2f}) | {top} |"
        )
    lines += ["", "| W | problem | M | N | K | predicted best | best ms | serial ms | gain |"]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['world']} | {r['problem']} | {r['m']} | {r['n']} | {r['k']} | `{r['best']}` | "
            f"{r['best_ms']:.3f} | {r['serial_ms']:.3f} | {r['gain_over_serial']:.2f} |"
        )
    if skipped_all:
        lines += ["", "Layers that do not divide at that W (left out):", ""]
        lines += [f"- {s}" for s in skipped_all]
    (args.out / "projection.md").write_text("\n".join(lines) + "\n")
    for key, s in summary.items():
        print(
            f"{key}: {s['problems']} problems, gain over serial geomean "
            f"{s['gain_geomean']:.2f} ({s['gain_min']:.2f}-{s['gain_max']:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
