"""A copy's fixed cost against its size and the number of copies, and batched transports.

On one GPU, device-to-device within its own memory: peer copies over NVLink need 2 GPUs and
are measured by ``scripts/bench_moe.py``. For segment sizes 4 KiB ... 64 MiB (x4 steps) and
1, 4, 16, 64 segments, one operation copies every segment (each its own source and
destination buffer), five ways:

- ``eager``: one ``copy_`` per segment (a ``cudaMemcpyAsync`` each), issued from Python;
- ``graph``: the same copies captured once in a CUDA graph, one ``replay()`` per operation;
- ``kernel``: ficco's segment-copy kernel (``ficco.kernels.segment_copy``): one Triton
  launch over a prepared table of (source, destination, length), built once;
- ``kernel_graph``: the same kernel (its own prepared table) captured once in a CUDA graph,
  one ``replay()`` per operation: the kernel as the ``seg`` transport issues it inside a
  captured schedule, without Triton's Python launch cost;
- ``batch``: ``cudaMemcpyBatchAsync`` through ``cuda.bindings.runtime`` where it is there
  (no new dependency; recorded as ``unavailable: why`` otherwise), the pointer lists built
  once, each operation one call.

Protocol: each method is first checked (destinations poisoned, then compared with their
sources byte for byte; a method that fails is recorded with the failure and not timed); then
timed with CUDA events around one whole operation, the host and GPU synchronized before each
(so the launch and issue cost counts, as for a transfer the GPU waits on), 5 warm-up and 30
timed repetitions, the methods interleaved round by round; median and p10/p90. Buffers are
reused across repetitions, so segments that fit in L2 (50 MiB on H200) are copied from L2:
that is the small-transfer case the fixed cost describes.

Fit: per method and count, ``t = a + bytes / rate`` by least squares on relative error (each
point weighted 1 / t^2), so the small sizes set the intercept; the fixed cost per copy is
``a / count``. Crossover: per count, the sizes at which each kernel method's median beats
eager (and the graph of copies).

Writes ``$OUT/copy_fixed_cost.json`` (or ``--out``) with the environment fingerprint and
prints the table last.

Usage: python scripts/copy_fixed_cost.py [--quick] [--reps 30] [--out FILE]
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

SIZES = tuple(4096 << (2 * i) for i in range(8))  # 4 KiB ... 64 MiB
COUNTS = (1, 4, 16, 64)
METHODS = ("eager", "graph", "kernel", "kernel_graph", "batch")
KERNEL_METHODS = ("kernel", "kernel_graph")
WARMUP = 5


def _stats(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "median_us": statistics.median(values) * 1e3,
        "p10_us": pick(0.1) * 1e3,
        "p90_us": pick(0.9) * 1e3,
        "reps": len(values),
    }


class Batch:
    """``cudaMemcpyBatchAsync`` over prepared pointer lists, or why it cannot run."""

    def __init__(self, pairs, stream: torch.cuda.Stream) -> None:
        from cuda.bindings import runtime as rt  # ImportError: the caller records why

        self.rt = rt
        self.dsts = [d.data_ptr() for _, d in pairs]
        self.srcs = [s.data_ptr() for s, _ in pairs]
        self.sizes = [s.numel() * s.element_size() for s, _ in pairs]
        attr = rt.cudaMemcpyAttributes()
        attr.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        self.attrs = [attr]
        self.stream = stream.cuda_stream
        self.call = self._pick_signature()

    def _pick_signature(self):
        """The bindings take (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream)
        and return (error, [failIdx]) (12.8: failIdx out; 13: none); the stream as an int
        handle or as a ``cudaStream_t``, by bindings version: try both."""
        rt, n = self.rt, len(self.sizes)
        errors = []
        for name, stream in (("int stream", self.stream), ("cudaStream_t", None)):
            try:
                if stream is None:
                    stream = rt.cudaStream_t(self.stream)

                def fn(stream=stream):
                    return rt.cudaMemcpyBatchAsync(
                        self.dsts, self.srcs, self.sizes, n, self.attrs, [0], 1, stream
                    )

                result = fn()
            except Exception as err:  # argument types this bindings version refuses
                errors.append(f"{name}: {type(err).__name__}: {err}"[:200])
                continue
            err = result[0] if isinstance(result, tuple) else result
            if int(err) != 0:
                errors.append(f"{name}: returned {err}")
                continue
            self.signature = name
            return fn
        raise RuntimeError("; ".join(errors))

    def __call__(self) -> None:
        result = self.call()
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise RuntimeError(f"cudaMemcpyBatchAsync returned {err}")


def _graph_of(fn, stream: torch.cuda.Stream):
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm on the capture stream first
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph.replay


class _GraphedKernel:
    """A prepared SegmentCopy captured in a CUDA graph: calling it replays the graph."""

    def __init__(self, kernel, stream: torch.cuda.Stream) -> None:
        # the graph reads the kernel's device table: keep the kernel (and so the table) alive
        self.kernel, self.grid = kernel, kernel.grid
        self.replay = _graph_of(kernel, stream)

    def __call__(self) -> None:
        self.replay()


def build_methods(pairs, stream) -> tuple[dict, dict]:
    """``(callables, unavailable)``: each method ready to run, or why it is not."""
    from ficco.kernels.segment_copy import SegmentCopy

    def eager():
        for src, dst in pairs:
            dst.copy_(src)

    methods, unavailable = {"eager": eager}, {}
    for name, make in (
        ("graph", lambda: _graph_of(eager, stream)),
        ("kernel", lambda: SegmentCopy(pairs)),
        ("kernel_graph", lambda: _GraphedKernel(SegmentCopy(pairs), stream)),
        ("batch", lambda: Batch(pairs, stream)),
    ):
        try:
            methods[name] = make()
        except Exception as err:
            unavailable[name] = f"unavailable: {type(err).__name__}: {err}"[:400]
    return methods, unavailable


def verify(fn, pairs, stream) -> str | None:
    """None when ``fn`` copies every segment exactly; else what went wrong."""
    for _, dst in pairs:
        dst.view(torch.uint8).fill_(0xA5)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    for i, (src, dst) in enumerate(pairs):
        if not torch.equal(src, dst):
            bad = int((src != dst).sum())
            return f"segment {i}: {bad} of {src.numel()} elements differ"
    return None


def time_methods(methods: dict, stream, reps: int) -> dict[str, dict]:
    """``WARMUP`` untimed calls each, then ``reps`` rotated rounds on ``stream``, each call
    on an idle GPU (``ficco.execute.timing``: `time_rounds` on a `DeviceClock`)."""
    samples = time_rounds(
        methods, TimingOptions(warmup=WARMUP, rounds=reps), DeviceClock(stream=stream), rotate=True
    )
    return {n: _stats(v) for n, v in samples.items()}


def fit_fixed_cost(points: list[tuple[int, float]]) -> dict:
    """``t_us = a + bytes / rate`` weighted by 1 / t^2: ``{fixed_us, gbps}``."""
    # minimize sum ((a + b x - t) / t)^2: normal equations with weights w = 1 / t^2
    sw = sx = sy = sxx = sxy = 0.0
    for x, t in points:
        w = 1.0 / (t * t)
        sw, sx, sy = sw + w, sx + w * x, sy + w * t
        sxx, sxy = sxx + w * x * x, sxy + w * x * t
    det = sw * sxx - sx * sx
    a = (sxx * sy - sx * sxy) / det
    b = (sw * sxy - sx * sy) / det
    return {"fixed_us": a, "gbps": (1e-3 / b) if b > 0 else None}


def run(sizes, counts, reps: int) -> list[dict]:
    stream = torch.cuda.Stream()
    rows = []
    for count in counts:
        for nbytes in sizes:
            gen = torch.Generator(device="cuda").manual_seed(count * 1000 + nbytes % 997)
            pairs = []
            for _ in range(count):
                src = torch.randint(
                    -(2**31),
                    2**31 - 1,
                    (nbytes // 4,),
                    dtype=torch.int32,
                    device="cuda",
                    generator=gen,
                )
                pairs.append((src, torch.empty_like(src)))
            row: dict = {"count": count, "segment_bytes": nbytes, "total_bytes": count * nbytes}
            methods, unavailable = build_methods(pairs, stream)
            for name, why in unavailable.items():
                row[name] = {"failure": why}
            for name in list(methods):
                wrong = verify(methods[name], pairs, stream)
                if wrong is not None:
                    row[name] = {"failure": f"incorrect: {wrong}"}
                    del methods[name]
            for name, stats in time_methods(methods, stream, reps).items():
                stats["gbps"] = count * nbytes / (stats["median_us"] * 1e-6) / 1e9
                row[name] = stats
            if "batch" in methods:
                row["batch"]["signature"] = methods["batch"].signature
            for name in KERNEL_METHODS:
                if name in methods:
                    row[name]["grid"] = list(methods[name].grid)
            rows.append(row)
            del pairs, methods
            torch.cuda.empty_cache()
        print(f"count {count}: {len(sizes)} sizes", flush=True)
    return rows


def summarize(rows: list[dict], counts) -> list[dict]:
    out = []
    for count in counts:
        mine = [r for r in rows if r["count"] == count]
        entry: dict = {"count": count, "fixed_us_per_copy": {}, "gbps_fit": {}}
        for method in METHODS:
            points = [
                (r["total_bytes"], r[method]["median_us"])
                for r in mine
                if "median_us" in r.get(method, {})
            ]
            if len(points) >= 2:
                fit = fit_fixed_cost(points)
                # the kernel and batch are one operation for all segments: per copy = a / count
                entry["fixed_us_per_copy"][method] = fit["fixed_us"] / count
                entry["gbps_fit"][method] = fit["gbps"]
        for kernel in KERNEL_METHODS:
            for rival in ("eager", "graph"):
                both = [
                    r
                    for r in mine
                    if "median_us" in r.get(kernel, {}) and "median_us" in r.get(rival, {})
                ]
                wins = [
                    r["segment_bytes"]
                    for r in both
                    if r[kernel]["median_us"] < r[rival]["median_us"]
                ]
                loses = [
                    r["segment_bytes"]
                    for r in both
                    if r[kernel]["median_us"] >= r[rival]["median_us"]
                ]
                # wins below the smallest size at which it loses (None: never loses)
                entry[f"{kernel}_beats_{rival}_below_bytes"] = min(loses) if loses else None
                entry[f"{kernel}_beats_{rival}_at"] = sorted(wins)
        out.append(entry)
    return out


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def print_table(rows: list[dict], summary: list[dict]) -> None:
    print("\nmedian us per operation (all segments)")
    print(f"{'count':>5} {'segment':>9} " + " ".join(f"{m:>12}" for m in METHODS))
    for r in rows:
        cells = []
        for m in METHODS:
            cell = r.get(m, {})
            cells.append(f"{cell['median_us']:12.1f}" if "median_us" in cell else f"{'-':>12}")
        print(f"{r['count']:>5} {_fmt_bytes(r['segment_bytes']):>9} " + " ".join(cells))
    print("\nper count: fitted fixed cost per copy (us), and the sizes at which the kernel wins")
    for s in summary:
        fixed = ", ".join(f"{m} {v:.2f}" for m, v in s["fixed_us_per_copy"].items())
        print(f"count {s['count']:>2}: {fixed}")
        for kernel in KERNEL_METHODS:
            wins = {
                rival: ", ".join(map(_fmt_bytes, s.get(f"{kernel}_beats_{rival}_at", []))) or "none"
                for rival in ("eager", "graph")
            }
            print(f"    {kernel} beats eager at [{wins['eager']}], graph at [{wins['graph']}]")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 sizes, counts 1 and 16")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.reps < 20:
        raise SystemExit(f"--reps: at least 20 for a median, got {args.reps}")
    if not torch.cuda.is_available():
        raise SystemExit("copy_fixed_cost.py measures a GPU: none is visible")
    from ficco.measure.fingerprint import fingerprint

    started = time.time()
    sizes = SIZES[::3] if args.quick else SIZES
    counts = (1, 16) if args.quick else COUNTS
    try:
        from cuda.bindings import runtime as rt

        batch_api = "present" if hasattr(rt, "cudaMemcpyBatchAsync") else "absent from bindings"
    except ImportError as err:
        batch_api = f"unavailable: cuda.bindings not importable ({err})"
    rows = run(sizes, counts, args.reps)
    summary = summarize(rows, counts)
    report = {
        "benchmark": "copy fixed cost vs size and count: eager copy_, CUDA graph, segment-copy "
        "kernel (eager and graphed), cudaMemcpyBatchAsync (one GPU, device to device)",
        "protocol": __doc__.split("\n\n")[2].strip() + " " + __doc__.split("\n\n")[3].strip(),
        "fingerprint": fingerprint("cuda"),
        "reps": args.reps,
        "warmup": WARMUP,
        "cudaMemcpyBatchAsync": batch_api,
        "rows": rows,
        "summary": summary,
        "failures": sum(1 for r in rows for m in METHODS if "failure" in r.get(m, {})),
    }
    report["wall_s"] = time.time() - started
    out = args.out or os.path.join(os.environ.get("OUT", "."), "copy_fixed_cost.json")
    Path(out).write_text(json.dumps(report, indent=1))
    print_table(rows, summary)
    print(f"wrote {out}: {report['failures']} failures, {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
