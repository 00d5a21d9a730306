"""The fused GEMM's tile where chunks arrive during the launch: `arrival_pick`.

`fused_tuning.tune_fused` times every candidate with every flag set, the best case. In a
schedule the peers' chunks land while the launch runs, and a tile whose chunk has not
landed holds its program: a tile that filled one wave with flags set leaves the late
chunk's tiles, started when it lands, a whole wave to themselves. What the launch then
takes is modelled here, per candidate, from its flags-set time:

- the tiles run in the kernel's claim order (`tile_chunks`, `_tile_place`'s arithmetic:
  chunk by chunk, or ``chunk_group`` chunks interleaved in grouped order), each program
  taking the next unit when it is free and starting it once the unit's chunk has landed
  (a list schedule over ``sm_budget * programs_per_sm`` programs); where the launch runs
  ready runs (`FusedGemm.runs_by_default`: more tiles than programs, no split tail) tile i
  is program i mod P's instead, taken in order once its chunk group has landed;
- a whole tile costs the flags-set time over the launch's waves (a split tail's K range
  its share of one);
- chunk ``i`` of ``C`` lands at ``i / C`` of the fastest candidate's flags-set time
  (`just_in_time`): the arrivals of a schedule whose communication keeps pace with its
  GEMM, the case overlap is for.

Chunks landing just in time is the latest a schedule that overlaps well sees them; its
transfers may as well end long before their GEMM (a wide N: the GEMM grows with N, the
transfer does not), and then the flags-set tile was right. On two H200s (the overlap suite,
`shard/ce/triton+fused`, `profiles/h200x2/NOTES_overlap.md`) the tile picked for
just-in-time arrivals alone ran 1.12x and 1.16x the flags-set tile's time at
1024x28672x8192 and 4096x5120x8192 (the unchanged `shard/ce/triton` 0.99x between the two
runs). So `arrival_pick` keeps the candidate whose worse regret over the two arrivals (all
ready; just in time) is least: a tile slower with every flag set must buy more where
chunks land late than it costs where they do not.

Against the measured side-stream arrival case of `scripts/tune_fused_gpu.py`
(`scripts/fused_arrival_model.py` in the tree at 97d577c) the model came within 10% at 59 of 67 shapes on one
H200 and 52 of 64 on one H100 (profiles/h200/NOTES_gemm.md, profiles/h100/NOTES_gemm.md), never more than 3% above the measurement,
up to 30% below it; the benchmark times the tile picked beside the others.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

from ficco.kernels.configs import GemmConfig, split_plan


def _grouped_row_block(t: int, num_pid_m: int, num_pid_n: int, group_m: int) -> int:
    # tiles._tile_coords's row block of tile t (grouped order), in Python
    in_group = group_m * num_pid_n
    first = (t // in_group) * group_m
    size = min(num_pid_m - first, group_m)
    return first + t % size


def tile_chunks(config: GemmConfig, rows: int, n: int, chunks: int) -> list[int]:
    """The chunk of each tile of ``chunks`` chunks of ``rows`` rows, in the order the fused
    kernel claims them (`fused_kernel._tile_place` where every chunk has as many tiles)."""
    blocks = -(-rows // config.block_m)
    num_pid_n = -(-n // config.block_n)
    per_chunk = blocks * num_pid_n
    group = max(1, min(config.chunk_group, chunks))
    order = []
    for tile in range(chunks * per_chunk):
        g = tile // (group * per_chunk)
        first = g * group
        members = min(group, chunks - first)
        row_block = _grouped_row_block(
            tile - g * group * per_chunk, members * blocks, num_pid_n, config.group_m
        )
        order.append(first + row_block // blocks)
    return order


def arrival_ms(
    config: GemmConfig,
    flags_set_ms: float,
    rows: int,
    n: int,
    k: int,
    ready_ms: Sequence[float],
    sm_budget: int,
    *,
    ready_runs: bool = True,
) -> float:
    """The modelled time of a launch of ``len(ready_ms)`` chunks of ``rows`` rows whose chunk
    ``i`` lands at ``ready_ms[i]``, for a configuration whose time with every flag set is
    ``flags_set_ms`` (module docstring). ``ready_runs``: the launch as `FusedGemm`'s default
    makes it, in ready runs where the tiles outnumber the programs and no split tail
    (`FusedGemm.runs_by_default`: a launch whose chunks only wait); False: every tile claimed
    (the default before 762e560)."""
    chunks = len(ready_ms)
    order = tile_chunks(config, rows, n, chunks)
    programs = sm_budget * config.programs_per_sm
    plan = split_plan(len(order), programs, -(-k // config.block_k)) if config.split_tail else None
    if plan is None:
        units = [(chunk, 1.0) for chunk in order]
        waves = float(math.ceil(len(order) / programs))
    else:
        units = [(chunk, 1.0) for chunk in order[: plan.dp_tiles]]
        units += [
            (chunk, 1.0 / plan.split) for chunk in order[plan.dp_tiles :] for _ in range(plan.split)
        ]
        waves = math.ceil(plan.dp_tiles / programs) + 1.0 / plan.split
    tile_ms = flags_set_ms / waves
    end = 0.0
    if ready_runs and plan is None and len(units) > programs:
        # ready runs: tile i is program i mod P's, run in order, each once its chunk group
        # has landed (the kernel's `_wait_group` waits for every chunk of the group)
        group = max(1, min(config.chunk_group, chunks))
        landed = [max(ready_ms[g : g + group]) for g in range(0, chunks, group)]
        free = [0.0] * programs
        for i, (chunk, share) in enumerate(units):
            start = max(free[i % programs], landed[chunk // group])
            free[i % programs] = start + share * tile_ms
            end = max(end, free[i % programs])
        return end
    free = [0.0] * min(programs, len(units))  # when each program next takes a unit
    for chunk, share in units:
        start = max(heapq.heappop(free), ready_ms[chunk])
        done = start + share * tile_ms
        end = max(end, done)
        heapq.heappush(free, done)
    return end


def just_in_time(reference_ms: float, chunks: int) -> list[float]:
    """Chunk ``i`` lands at ``i / chunks`` of ``reference_ms``: communication that keeps pace
    with a GEMM of that time."""
    return [reference_ms * i / chunks for i in range(chunks)]


def arrival_pick(
    timings_ms: Mapping[str, float],
    configs: Mapping[str, GemmConfig],
    rows: int,
    n: int,
    k: int,
    chunks: int,
    sm_budget: int,
    *,
    ready_runs: bool = True,
) -> tuple[str, dict[str, dict[str, float]]]:
    """The name of the configuration with the least worst regret over two arrivals (every
    chunk ready at once; chunks landing just in time), and per timed configuration its
    modelled times (ms) and that regret. ``timings_ms`` are the flags-set times
    (`tune_fused`'s), ``configs`` their configurations by name; a name without one is passed
    over. A regret is the modelled time over the best modelled time of the same arrival.
    ``ready_runs``: as `arrival_ms`'s."""
    timed = {name: ms for name, ms in timings_ms.items() if name in configs}
    if not timed:
        raise ValueError("arrival_pick: no timed configuration is among the configs")
    arrivals = {
        "ready_ms": [0.0] * chunks,
        "just_in_time_ms": just_in_time(min(timed.values()), chunks),
    }
    modelled = {
        name: {
            case: arrival_ms(configs[name], ms, rows, n, k, ready, sm_budget, ready_runs=ready_runs)
            for case, ready in arrivals.items()
        }
        for name, ms in timed.items()
    }
    best = {case: min(m[case] for m in modelled.values()) for case in arrivals}
    for m in modelled.values():
        m["regret"] = max(m[case] / best[case] for case in arrivals)
    # ties go to the faster flags-set time, then the name (a stable pick)
    pick = min(modelled, key=lambda name: (modelled[name]["regret"], timed[name], name))
    return pick, modelled
