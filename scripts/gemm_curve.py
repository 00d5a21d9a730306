"""The GEMM and copy curves of one GPU, for the cost model (``ficco.model``).

Measures, on GPU 0, in one run:

- ``gemm``: cuBLAS (``torch.matmul``) bf16 time over M (16 ... 32768 rows, non-powers of two
  included) x the (N, K) of the catalog's tensor-parallel layers at W = 2;
- ``sm_budget``: ficco's persistent Triton GEMM at SM budgets 132 ... 33 on a subset, each
  budget with the same (heuristic) tile configuration, so the ratio t(budget) / t(132) is the
  budget's effect alone;
- ``copy``: device-to-device copies on a side stream (torch's ``copy_``, a ``cudaMemcpyAsync``),
  4 KiB ... 256 MiB, for the copy engine's fixed cost and rate on this GPU's own memory (peer
  copies over NVLink come from the profile store's signatures).

Protocol: every GEMM is first checked against an fp32 reference (relative Frobenius error
<= 1e-2, else the row is recorded as failed and not timed); then timed in rounds, the
candidates of one shape interleaved, an L2 flush (a 2 x L2 write) before every launch, CUDA
events around each launch, median and p10/p90 over rounds. Writes ``$OUT/gemm_curve.json``
(or ``--out``) with the environment fingerprint.

Usage: python scripts/gemm_curve.py [--quick] [--rounds 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import DeviceClock, time_rounds  # noqa: E402

#: (N, K) of the catalog's AG+GEMM / GEMM+RS layers at W = 2 (Llama-3 8B/70B/405B, GPT-3,
#: DeepSeek-V3, Mistral-Large-2, Qwen3): columns per rank x full depth, or full columns x
#: depth per rank.
NK = (
    (3072, 4096),
    (14336, 4096),
    (4096, 2048),
    (4096, 7168),
    (5120, 8192),
    (28672, 8192),
    (8192, 4096),
    (8192, 14336),
    (2112, 7168),
    (7168, 1024),
    (18432, 12288),
    (12288, 24576),
)
M_VALUES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
M_VALUES_LONG = (12288, 16384, 24576, 32768)
BUDGETS = (132, 124, 116, 100, 66, 33)
BUDGET_SHAPES = ((256, 8192, 4096), (1024, 14336, 4096), (4096, 8192, 8192), (8192, 28672, 8192))
COPY_BYTES = tuple(4096 << i for i in range(17))  # 4 KiB ... 256 MiB
REL_ERROR_LIMIT = 1e-2


class Timer:
    """Per-launch CUDA-event timing with an L2 flush before every launch."""

    def __init__(self) -> None:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(max(2 * l2, 128 << 20), dtype=torch.int8, device="cuda")

    def rounds(self, fns: dict, rounds: int, stream=None) -> dict[str, dict]:
        """One untimed call each, then ``rounds`` rotated rounds (``ficco.execute.timing``:
        `time_rounds` on a `DeviceClock` flushing L2, each launch on an idle GPU)."""
        samples = time_rounds(
            fns,
            TimingOptions(warmup=1, rounds=rounds),
            DeviceClock(flush=self.flush, stream=stream),
            rotate=True,
        )
        return {n: _stats(v) for n, v in samples.items()}


def _stats(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(values), "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def gemm_rows(timer: Timer, m_values, nk, rounds: int) -> list[dict]:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in nk:
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        for m in m_values:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            row = {"M": m, "N": n, "K": k, "dtype": "bf16", "gemm": "cublas"}
            try:
                err = rel_error(a @ b, a.float() @ b.float())
                row["rel_error"] = err
                if err > REL_ERROR_LIMIT:
                    row["failure"] = f"relative error {err:.3g} > {REL_ERROR_LIMIT}"
                else:
                    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    launch = lambda a=a, b=b, out=out: torch.matmul(a, b, out=out)  # noqa: E731
                    row.update(timer.rounds({"c": launch}, rounds)["c"])
                    row["tflops"] = 2 * m * n * k / row["median_ms"] / 1e9
            except Exception as err:  # recorded; the sweep goes on
                row["failure"] = f"{type(err).__name__}: {err}"[:300]
            rows.append(row)
        print(f"gemm N={n} K={k}: {len(m_values)} rows", flush=True)
    return rows


def budget_rows(timer: Timer, shapes, budgets, rounds: int) -> list[dict]:
    from ficco.kernels import heuristic_config, matmul

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = a.float() @ b.float()
        config = heuristic_config(m, n, k)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fns, failures = {}, {}
        for budget in budgets:
            try:
                matmul(a, b, out, sm_budget=budget, config=config)
                err = rel_error(out, ref)
                if err > REL_ERROR_LIMIT:
                    failures[budget] = f"relative error {err:.3g} > {REL_ERROR_LIMIT}"
                else:
                    fns[str(budget)] = lambda budget=budget, a=a, b=b, out=out, config=config: (
                        matmul(a, b, out, sm_budget=budget, config=config)
                    )
            except Exception as err:
                failures[budget] = f"{type(err).__name__}: {err}"[:300]
        timed = timer.rounds(fns, rounds) if fns else {}
        full = timed.get(str(budgets[0]), {}).get("median_ms")
        for budget in budgets:
            row = {"M": m, "N": n, "K": k, "dtype": "bf16", "gemm": "triton", "sm_budget": budget}
            row["config"] = str(config)
            if budget in failures:
                row["failure"] = failures[budget]
            else:
                row.update(timed[str(budget)])
                if full:
                    row["time_vs_full_budget"] = row["median_ms"] / full
            rows.append(row)
        print(f"budgets {m}x{n}x{k} done", flush=True)
    return rows


def copy_rows(timer: Timer, sizes, rounds: int) -> list[dict]:
    rows = []
    side = torch.cuda.Stream()
    for nbytes in sizes:
        src = torch.randint(0, 127, (nbytes,), dtype=torch.int8, device="cuda")
        dst = torch.empty_like(src)
        row = {"bytes": nbytes, "copy": "device_to_device", "stream": "side"}
        try:
            dst.copy_(src)
            torch.cuda.synchronize()
            if not torch.equal(dst, src):
                row["failure"] = "copied bytes differ"
            else:
                copy = lambda dst=dst, src=src: dst.copy_(src)  # noqa: E731
                row.update(timer.rounds({"c": copy}, rounds, stream=side)["c"])
                row["gbps"] = nbytes / row["median_ms"] / 1e6
        except Exception as err:
            row["failure"] = f"{type(err).__name__}: {err}"[:300]
        rows.append(row)
    print(f"copies: {len(sizes)} sizes", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few shapes per part")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemm_curve.py measures a GPU: none is visible")
    from ficco.measure.fingerprint import fingerprint

    started = time.time()
    timer = Timer()
    m_values = M_VALUES[::4] if args.quick else M_VALUES + M_VALUES_LONG
    nk = NK[:2] if args.quick else NK
    budget_shapes = BUDGET_SHAPES[:1] if args.quick else BUDGET_SHAPES
    report = {
        "benchmark": "GEMM (cuBLAS over M x catalog N, K; Triton over SM budgets) and copy curves",
        "protocol": __doc__.split("\n\n")[2].strip(),
        "fingerprint": fingerprint("cuda"),
        "rounds": args.rounds,
        "gemm": gemm_rows(timer, m_values, nk, args.rounds),
        "sm_budget": budget_rows(timer, budget_shapes, BUDGETS, args.rounds),
        "copy": copy_rows(timer, COPY_BYTES[::4] if args.quick else COPY_BYTES, args.rounds),
    }
    report["failures"] = sum(
        1 for part in ("gemm", "sm_budget", "copy") for row in report[part] if "failure" in row
    )
    report["wall_s"] = time.time() - started
    out = args.out or os.path.join(os.environ.get("OUT", "."), "gemm_curve.json")
    Path(out).write_text(json.dumps(report, indent=1))
    print(f"wrote {out}: {report['failures']} failures, {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
