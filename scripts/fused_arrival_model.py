#!/usr/bin/env python3
"""How well `ficco.kernels.fused_arrival` models the fused GEMM where a chunk arrives late.

    python scripts/fused_arrival_model.py profiles/h200/fused_single_gpu_callK.json [...]
    python scripts/fused_arrival_model.py --claims profiles/h200/fused_single_gpu_callT.json

For each shape of a ``tune_fused_gpu.py`` JSON: the model of the side-stream arrival case
(`fused_overlap`: the flags-set tile, its own chunks ready at once, the peer's when the
side stream's copies end, ``copies_alone``; the programs the overlap launch has), from
that run's flags-set time of the same tile (``fused_tma``), beside the measured time. Then
how many shapes the model came within 10% of, and where the arriving tile
(`arrival_pick` over the tuner's timings) differs from the tuner's flags-set pick.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.kernels.configs import fused_candidate_configs  # noqa: E402
from ficco.kernels.fused_arrival import arrival_ms, arrival_pick  # noqa: E402

SIDE_SMS = 4  # tune_fused_gpu.py's: the overlap launch leaves these to the side stream
SMS = 132  # an H100 SXM's and an H200's (the JSON names the card, not its SM count)


def report(path: Path, placement: bool | None = None) -> None:
    d = json.loads(path.read_text())
    sms = SMS
    close, ratios, differ, total = 0, [], 0, 0
    for r in d["shapes"]:
        s, t = r["shape"], r.get("timing", {})
        m, n, k, chunks = s["m"], s["n"], s["k"], s["world"] * s["chunks"]

        def ms(name, t=t):
            return t.get(name, {}).get("median_ms")

        tuning = r.get("tuning") or {}
        offered = fused_candidate_configs(-(-m // chunks), n, k, 2, 2, chunks=chunks, sm_budget=sms)
        configs = {c.name: c for c in offered}
        name = r.get("configs", {}).get("fused_tma")
        if (
            None in (ms("fused_tma"), ms("fused_overlap"), ms("copies_alone"))
            or name not in configs
        ):
            continue
        ready = [0.0] * s["chunks"] + [ms("copies_alone")] * (chunks - s["chunks"])
        # the launch timed: ready runs by the default's rule where the JSON records the rule
        # (762e560 on), else every tile claimed (or as --runs / --claims say)
        runs = isinstance(r.get("ready_runs"), dict) if placement is None else placement
        model = arrival_ms(
            configs[name], ms("fused_tma"), m // chunks, n, k, ready, sms - SIDE_SMS,
            ready_runs=runs,
        )  # fmt: skip
        ratio = model / ms("fused_overlap")
        total += 1
        close += abs(ratio - 1) <= 0.10
        ratios.append(ratio)
        line = f"{m}x{n}x{k}: overlap {ms('fused_overlap'):.4f} ms, model {model:.4f} ({ratio:.3f})"
        timings = tuning.get("timings_ms")
        if timings and tuning.get("best") in timings:
            pick, _ = arrival_pick(
                timings, configs, -(-m // chunks), n, k, chunks, sms, ready_runs=runs
            )
            if pick != tuning["best"]:
                differ += 1
                line += f"; arriving tile {pick} (flags set: {tuning['best']})"
        print(line)
    print(
        f"{path}: model within 10% of the measured arrival case at {close} of {total} shapes "
        f"(model / measured {min(ratios):.3f}-{max(ratios):.3f}); the arriving tile differs at "
        f"{differ}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    # --runs / --claims: model every launch so, whatever its JSON records (to compare the two)
    placement = True if "--runs" in args else False if "--claims" in args else None
    paths = [a for a in args if a not in ("--runs", "--claims")]
    for arg in paths or ["profiles/h200/fused_single_gpu_callK.json"]:
        report(Path(arg), placement)
