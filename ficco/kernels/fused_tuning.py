"""Tuning the fused GEMM's tile for one shape: `tune_fused`.

The candidates are the persistent GEMM's space (`configs.fused_candidate_configs`, chunks
also grouped where they are few-row), each checked against `torch.matmul` before it is timed
(`trials.check_then_time`, the loop the persistent GEMM's tuner runs too;
`tuning.launch_timer`'s interleaved rounds, every flag ready), and the winner (`fused_pick`:
a grouped configuration must win by a margin) is cached in the persistent GEMM's tuning file
under a `FusedTuningKey`, where `fused_configs.fused_config` finds it; beside it, under the
key's ``arriving`` twin, the configuration for launches whose chunks land while they run
(`arrival_entry`: `fused_arrival.arrival_pick` over the same timings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from ficco.kernels.configs import GemmConfig, fused_candidate_configs
from ficco.kernels.fused import FusedChunkViews, FusedGemm
from ficco.kernels.fused_arrival import arrival_pick
from ficco.kernels.fused_configs import FusedTuningKey
from ficco.kernels.persistent import device_info
from ficco.kernels.trials import (
    Rejected,
    RoundsTimer,
    Timer,
    Trials,
    check_then_time,
    tflops,
    tuning_record,
)
from ficco.kernels.tuning import cached_config, launch_timer, store

#: A configuration that groups chunks (`GemmConfig.chunk_group`) is picked only where it beats
#: the fastest chunk-by-chunk one by this factor: tuning sets every flag, and where chunks
#: arrive a group's first tiles wait on all of its chunks.
GROUPED_MARGIN = 1.03


def fused_pick(trials: Trials) -> str:
    """The name of the configuration to keep of fused ``trials``: the fastest, unless it groups
    chunks and the fastest chunk-by-chunk one is within ``GROUPED_MARGIN`` of it."""
    best = trials.best()
    if trials.configs[best].chunk_group == 1:
        return best
    chunkwise = [name for name in trials.timings_ms if trials.configs[name].chunk_group == 1]
    if not chunkwise:
        return best
    alternative = min(chunkwise, key=trials.timings_ms.__getitem__)
    if trials.timings_ms[alternative] > GROUPED_MARGIN * trials.timings_ms[best]:
        return best
    return alternative


def tune_fused(
    m: int,
    n: int,
    k: int,
    chunks: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    sm_budget: int | None = None,
    device: torch.device | str = "cuda",
    *,
    configs: Sequence[GemmConfig] | None = None,
    timer: Timer | RoundsTimer | None = None,
    read_cache: bool = True,
    write_cache: bool = True,
) -> tuple[GemmConfig, dict]:
    """The fastest correct tile for the fused kernel (TMA path, every flag ready) over
    ``chunks`` equal row chunks of an ``[m, k] @ [k, n]`` GEMM, and the tuning record.

    Times ``configs`` (default: ``fused_candidate_configs`` for the chunk's rows) with
    ``timer`` (default: `launch_timer`), each checked against ``torch.matmul`` first, and
    stores the winner in the tuning cache under a ``FusedTuningKey`` (``write_cache``).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: tuning times GPU launches, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if min(m, n, k, chunks) < 1 or m < chunks:
        raise ValueError(
            f"m, n, k, chunks must be positive with m >= chunks, got {(m, n, k, chunks)}"
        )
    budget = device_info(device).sm_count if sm_budget is None else int(sm_budget)
    key = FusedTuningKey.for_problem(m, n, k, chunks, dtype, budget, device)
    if read_cache and (hit := cached_config(key)) is not None:
        return hit, {"cached": True, "name": hit.name}
    elem = torch.empty((), dtype=dtype).element_size()
    if configs is None:
        configs = fused_candidate_configs(
            -(-m // chunks),
            n,
            k,
            elem,
            elem,
            chunks=chunks,
            sm_budget=budget,
            shared_memory_bytes=device_info(device).shared_memory_bytes,
        )
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1_009 + k)
    a = torch.randn((m, k), device=device, generator=gen).to(dtype)
    b = torch.randn((k, n), device=device, generator=gen).to(dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    ref = torch.matmul(a, b)
    views = [
        FusedChunkViews(ai, oi)
        for ai, oi in zip(a.tensor_split(chunks), out.tensor_split(chunks), strict=True)
    ]

    def build(cfg: GemmConfig) -> FusedGemm:
        fused = FusedGemm(views, b, sm_budget=budget, timeout_s=10.0, config=cfg, path="tma")
        if fused.config != cfg:  # a smaller tile stood in: not this candidate's figure
            raise Rejected(f"ran as {fused.config.name} (out of resources)")
        return fused

    trials = check_then_time(
        configs, build, out, ref, timer or launch_timer(), lambda: torch.cuda.synchronize(device)
    )
    if not trials.timings_ms:
        raise RuntimeError(
            f"no fused GEMM configuration ran correctly for {key}: {trials.failures}"
        )
    pick = fused_pick(trials)
    best = trials.configs[pick]
    entry = tuning_record(trials, m, n, k, "tma", start, best=pick)
    late_entry = arrival_entry(entry, trials.configs, m, n, k, chunks, budget)
    entry["arrival"] = late_entry["name"]
    if write_cache:
        store(key, entry)
        store(replace(key, arriving=True), late_entry)
    return best, entry


def arrival_entry(
    entry: dict,
    configs: dict[str, GemmConfig],
    m: int,
    n: int,
    k: int,
    chunks: int,
    sm_budget: int,
) -> dict:
    """The tuning cache's entry for launches whose chunks land while they run, from a fused
    tuning ``entry`` (its flags-set ``timings_ms``; ``configs``: the timed configurations by
    name): `fused_arrival.arrival_pick`'s configuration, with every candidate's modelled
    times and regret."""
    name, modelled = arrival_pick(
        entry["timings_ms"], configs, -(-m // chunks), n, k, chunks, sm_budget
    )
    late = dict(entry)
    late.update(
        config=configs[name].to_dict(),
        name=name,
        ms=entry["timings_ms"][name],
        chosen_by="arrival model (ficco.kernels.fused_arrival): least worst regret",
        modelled={
            key: {case: round(value, 6) for case, value in cases.items()}
            for key, cases in modelled.items()
        },
    )
    late["tflops"] = tflops(m, n, k, late["ms"])
    late.pop("arrival", None)
    return late
