#!/usr/bin/env python3
"""A shippable GEMM tuning cache from one lease's benchmarks: per benchmarked shape, the config
that was fastest in the benchmark's interleaved, L2-flushed rounds, not the tuner's do_bench
pick (which mis-ranks kernels of a few microseconds).

    python scripts/tuning_cache_from_benches.py RAW_CACHE OUT [--gemm bench_gemm.json]
        [--decode bench_decode_gemm.json] [--fused] [--arrival] [--merge SHIPPED_CACHE]

The shipped caches are ``schedules/<card>/gemm_tuning.json`` (inside the package, where
``ficco.kernels.tuning.shipped_entries`` reads them): OUT and SHIPPED_CACHE are that file to
update one, e.g. ``schedules/h200/gemm_tuning.json ... --merge schedules/h200/gemm_tuning.json``.

RAW_CACHE is the run's $FICCO_CACHE_DIR/gemm_tuning.json (its keys name the device, Triton
version, dtype, shape and SM budget). For a ``bench_gemm.py`` row the choice is between the
tuner's pick and the other pick it timed beside it (``--compare-before``: the space before
widening; ``--compare-do-bench``: do_bench's); for a ``bench_decode_gemm.py`` row between the
tuner's pick and the fastest config of each kernel (persistent, swap-AB, split-K); with
``--fused``, the fused kernel's own tuning entries (``tune_fused``'s pick, ranked in the
same interleaved rounds) as they are; with ``--arrival``, beside every fused entry its
``|arriving`` twin (``ficco.kernels.fused_arrival``'s pick over the entry's own timings),
recomputed where it has one (the model's answer follows the kernel's launch: since 762e560 it
models ready runs). The entry
keeps the tuner's record and says what chose it (``chosen_by``). Shapes that no benchmark
timed are left out, or, with ``--merge``, keep the shipped cache's entry (a run cut by its
time cap re-measures only some shapes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ficco.kernels.configs import GemmConfig, candidate_configs, decode_candidate_configs  # noqa: E402


def _key_of(raw: dict, m: int, n: int, k: int, sm: int) -> str:
    tail = f"|m={m},n={n},k={k}|sm={sm}"
    hits = [key for key in raw if key.endswith(tail) and "|fused|" not in key]
    if len(hits) != 1:
        raise ValueError(f"expected one cache key ending {tail!r}, found {hits}")
    return hits[0]


def _config_named(name: str, m: int, n: int, k: int, sm: int, entry: dict) -> GemmConfig:
    if entry.get("name") == name:  # the tuner's own pick: its record holds the config
        return GemmConfig.from_dict(entry["config"])
    offered = candidate_configs(m, n, k, 2, 2, sm_budget=sm)
    offered += decode_candidate_configs(m, n, k, 2, 2, sm_budget=sm)
    for cfg in offered:
        if cfg.name == name:
            return cfg
    raise ValueError(f"{name!r} is not a config the space offers for {m}x{n}x{k}")


def _pick(options: dict[str, float], m: int, n: int, k: int, sm: int, entry: dict):
    """The fastest of ``options`` (config name -> ms) that today's space still has: a config
    the run timed that has since left the space (its fields refused, or no longer offered) is
    passed over, and said so."""
    for name in sorted(options, key=options.__getitem__):
        try:
            return name, _config_named(name, m, n, k, sm, entry)
        except ValueError as exc:
            print(f"{m}x{n}x{k}: {name} passed over ({exc})", file=sys.stderr)
    raise ValueError(f"{m}x{n}x{k}: none of {sorted(options)} is in today's space")


def choose(raw: dict, key: str, winner: GemmConfig, chosen_by: str, ms: float) -> dict:
    entry = dict(raw[key])
    entry.update(config=winner.to_dict(), name=winner.name, chosen_by=chosen_by)
    entry["interleaved_ms"] = ms
    entry["path"] = "decode" if winner.decode else "tma"
    return entry


def from_gemm(raw: dict, bench: dict) -> dict:
    out = {}
    for row in bench["rows"]:
        m, n, k, sm = row["M"], row["N"], row["K"], row["sm_budget"]
        key = _key_of(raw, m, n, k, sm)
        options = {row["config"]: row["triton_ms"]}
        other = row.get("before_widening") or row.get("do_bench_pick")
        if other and other.get("ms") is not None:
            options.setdefault(other["config"], other["ms"])
        name, cfg = _pick(options, m, n, k, sm, raw[key])
        why = "bench_gemm.py interleaved rounds: the tuner's pick vs the other pick timed"
        out[key] = choose(raw, key, cfg, why, options[name])
    return out


def from_decode(raw: dict, bench: dict) -> dict:
    out = {}
    for row in bench["rows"]:
        m, n, k, sm = row["M"], row["N"], row["K"], row["sm_budget"]
        key = _key_of(raw, m, n, k, sm)
        options = {
            row["configs"][name]: row["ms"][name]
            for name in ("space", "persistent", "swap", "decode")
            if name in row["ms"] and name in row["configs"]
        }
        name, cfg = _pick(options, m, n, k, sm, raw[key])
        why = "bench_decode_gemm.py interleaved rounds: the tuner's pick vs each kernel's fastest"
        out[key] = choose(raw, key, cfg, why, options[name])
    return out


_FUSED_KEY = re.compile(r"\|(\w+)\|m=(\d+),n=(\d+),k=(\d+)\|sm=(\d+)\|fused\|chunks=(\d+)$")


def arrival_entries(entries: dict) -> dict:
    """The ``|arriving`` twin of every fused entry: `fused_arrival`'s pick over the entry's
    own flags-set timings (the candidates named by today's fused space)."""
    from ficco.kernels.configs import fused_candidate_configs
    from ficco.kernels.fused_tuning import arrival_entry

    out = {}
    for key, entry in entries.items():
        found = _FUSED_KEY.search(key)
        if not found or not entry.get("timings_ms"):
            continue
        dtype, m, n, k, sm, chunks = found.group(1), *map(int, found.groups()[1:])
        elem = 4 if dtype == "float32" else 2
        offered = fused_candidate_configs(
            -(-m // chunks), n, k, elem, elem, chunks=chunks, sm_budget=sm
        )
        configs = {cfg.name: cfg for cfg in offered}
        configs[entry["name"]] = GemmConfig.from_dict(entry["config"])
        out[f"{key}|arriving"] = arrival_entry(entry, configs, m, n, k, chunks, sm)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--gemm", type=Path)
    parser.add_argument("--decode", type=Path)
    parser.add_argument("--fused", action="store_true", help="the raw cache's fused entries too")
    parser.add_argument(
        "--arrival",
        action="store_true",
        help="the arriving twin (ficco.kernels.fused_arrival) of every fused entry, recomputed",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        help="a shipped cache (schedules/<card>/gemm_tuning.json) whose other entries stay",
    )
    args = parser.parse_args()
    raw = json.loads(args.raw.read_text())["entries"]
    entries = json.loads(args.merge.read_text())["entries"] if args.merge else {}
    kept = len(entries)
    if args.gemm:
        entries.update(from_gemm(raw, json.loads(args.gemm.read_text())))
    if args.decode:
        entries.update(from_decode(raw, json.loads(args.decode.read_text())))
    if args.fused:
        entries.update({key: e for key, e in raw.items() if "|fused|" in key})
    if args.arrival:
        entries.update(arrival_entries(entries))
    args.out.write_text(json.dumps({"format": 1, "entries": entries}, indent=1, sort_keys=True))
    picks = [e["name"] for e in entries.values()]
    print(
        f"{len(entries)} entries ({sum('_splitk' in p for p in picks)} on the split-K kernel, "
        f"{sum('_swap' in p for p in picks)} swap-AB, "
        f"{sum('|fused|' in key for key in entries)} fused; {kept} read from --merge) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
