"""W = 8 ranks on one GPU: the covering set of every problem of ``scripts/gpu_shared.py`` at
W = 8 alone (the rerun after the signal-channel fix: ``profiles/h100/gpu_shared_w8.json``).

    OUT=DIR FICCO_GEMM_AUTOTUNE=0 python scripts/gpu_shared_w8.py   # writes DIR/gpu_shared_w8.json
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shared import expected_unavailable, matrix_schedules, problems

from ficco.execute import RunOptions, TimingOptions
from ficco.execute.pool import PoolFailure
from ficco.execute.run import backend_pool, measure_in
from ficco.measure.fingerprint import fingerprint
from ficco.verdict import Verdict

out = {"fingerprint": fingerprint("cuda"), "world": 8, "problems": []}
t_start = time.time()
with backend_pool("cuda_shared", 8, RunOptions(timeout_s=45)) as pool:
    for p in problems(8, "fp32"):
        t0 = time.time()
        got = measure_in(
            pool, p, matrix_schedules(p, False), TimingOptions(rounds=1, warmup=0, graphs="ce")
        )
        if isinstance(got, PoolFailure):
            row = {"problem": p.key, "failed": str(got)}
        else:
            v = {}
            for m in got:
                v[m.verdict] = v.get(m.verdict, 0) + 1
            row = {
                "problem": p.key,
                "verdicts": v,
                "unexpected": [
                    (m.name, m.verdict, m.detail[:200])
                    for m in got
                    if m.verdict != Verdict.OK
                    and not (
                        m.verdict == Verdict.UNAVAILABLE
                        and expected_unavailable("cuda_shared", m.name)
                    )
                ],
                "captured": sum(1 for m in got if m.extra.get("graph") == "graph"),
            }
        row["seconds"] = round(time.time() - t0, 1)
        out["problems"].append(row)
        print(json.dumps(row)[:400], flush=True)
out["seconds"] = round(time.time() - t_start, 1)
with open(os.path.join(os.environ["OUT"], "gpu_shared_w8.json"), "w") as f:
    json.dump(out, f, indent=1)
