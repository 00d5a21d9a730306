"""Features that keep their physical meaning as shapes grow (pure Python, ``math`` only).

The selector's ``physical`` feature set describes a (problem, schedule) pair by quantities a
performance engineer would reason with, each a ratio or an efficiency rather than a size, so a
tree split learned at M = 4096 still means the same thing at M = 32768:

``comm_compute_ratio``   predicted communication time / predicted GEMM time, from the roofs
                         (copy-engine rates for ``ce`` schedules, NCCL rates otherwise);
``chunk_vs_floor``       bytes of one transfer chunk / the bytes the link moves during one
                         copy's fixed cost (``floor_us * gbps``): below 1 a chunk is mostly
                         fixed cost (~13 us per copy-engine copy, FACTS.md);
``piece_efficiency``     predicted GEMM efficiency of one piece, from the measured GEMM curve
                         (``GEMM_EFFICIENCY``) on its rows, columns and depth;
``gemm_decomp_loss``     predicted: pieces x piece time / whole GEMM time - 1;
``comm_decomp_loss``     predicted: transfers x chunk time / whole collective time - 1;
``overlap_gain``         predicted time of the schedule (a two-stage pipeline: the longer side
                         plus one piece of the shorter) / predicted serial time;
``sm_left_to_comm``      share of the SMs the GEMM leaves free (``sm_reserve / sm_count``);
``comm_on_sms``          1 when the transport's communication runs on SMs (NCCL kernels, or
                         sm's relay hops) and so competes with the GEMM, 0 on copy engines;
``log2_chunks``          transfers per peer shard the geometry cuts;

then the schedule itself, every axis of it (``ficco.select.schedules``: a column per enum
member, the integer fields as they are), so no transport or option reads as zeros.

Piece sizes come from ``ficco.space.geometry.geometry`` (the one chunk geometry), so k-split
and all-to-all schedules are described by the pieces they really cut.

The GEMM efficiency curve: cuBLAS bf16 TFLOP/s for ``[M, 8192] @ [8192, 8192]`` on one H200
(FACTS.md, 2026-11-22: M = 256, 512, 1024, 2048, 8192 -> 581, 659, 660, 685, 792 TFLOP/s),
divided by the 8192^3 rate. Efficiency is interpolated linearly in log2 of the extent and
clamped at 1 above 8192. Below 256 rows the GEMM reads its weights in the same time whatever the
rows, so its rate falls in proportion to the rows: ``0.734 * extent / 256``. The same curve is
applied to a piece's rows, columns and depth and the three multiplied (an assumption: the
measured table varies rows only).
"""

from __future__ import annotations

import math
from functools import lru_cache

from ficco.problem import Problem
from ficco.select.features import PATTERN_FEATURES, Roofs, raw_features
from ficco.select.schedules import SCHEDULE_FEATURES, schedule_vector
from ficco.space import Schedule
from ficco.space.geometry import geometry
from ficco.space.schedule import Granularity
from ficco.space.transports import CostClass

#: (extent, efficiency) from the FACTS.md cuBLAS bf16 table (TFLOP/s / 792 at 8192^3).
GEMM_EFFICIENCY: tuple[tuple[int, float], ...] = (
    (256, 581 / 792),
    (512, 659 / 792),
    (1024, 660 / 792),
    (2048, 685 / 792),
    (8192, 1.0),
)

#: the pattern one-hots (the selector's patterns, ``PATTERN_FEATURES``), then the physics
PHYSICAL_PROBLEM_FEATURES: tuple[str, ...] = PATTERN_FEATURES + (
    "world",
    "log2_comm_compute_ratio",
    "ce_floor_share",
    "gemm_efficiency",
    "top_k",
    "log2_tokens_per_expert",
    "rank_imbalance",
    "expert_imbalance",
)
PHYSICAL_PAIR_FEATURES: tuple[str, ...] = (
    "log2_transport_comm_compute_ratio",
    "log2_chunk_vs_floor",
    "piece_efficiency",
    "log2_gemm_decomp_loss",
    "log2_comm_decomp_loss",
    "log2_overlap_gain",
    "sm_left_to_comm",
    "comm_on_sms",
    "log2_chunks",
    *SCHEDULE_FEATURES,
)


def gemm_efficiency(extent: int) -> float:
    """Efficiency of a GEMM along one extent (rows, columns or depth), from the measured curve."""
    lo_extent, lo_eff = GEMM_EFFICIENCY[0]
    if extent <= lo_extent:
        return lo_eff * max(extent, 1) / lo_extent
    for (x0, e0), (x1, e1) in zip(GEMM_EFFICIENCY, GEMM_EFFICIENCY[1:], strict=False):
        if extent <= x1:
            t = (math.log2(extent) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return e0 + t * (e1 - e0)
    return GEMM_EFFICIENCY[-1][1]


def piece_efficiency(rows: int, cols: int, depth: int) -> float:
    """Predicted efficiency of one ``[rows, depth] @ [depth, cols]`` GEMM."""
    return gemm_efficiency(rows) * gemm_efficiency(cols) * gemm_efficiency(depth)


def _gemm_ms(rows: int, cols: int, depth: int, tflops: float, roofs: Roofs) -> float:
    flops = 2 * rows * cols * depth
    return flops / (tflops * 1e9 * piece_efficiency(rows, cols, depth)) + roofs.gemm_floor_us / 1e3


def _copy_ms(nbytes: int, on_ce: bool, roofs: Roofs) -> float:
    floor, gbps = (
        (roofs.ce_floor_us, roofs.ce_gbps) if on_ce else (roofs.nccl_floor_us, roofs.nccl_gbps)
    )
    return floor / 1e3 + nbytes / (gbps * 1e6)


def _log2(value: float) -> float:
    return math.log2(max(value, 1e-6))


def problem_physics(problem: Problem, roofs: Roofs) -> list[float]:
    """The problem's physical features, in ``PHYSICAL_PROBLEM_FEATURES`` order."""
    raw = raw_features(problem, roofs)
    t_ce = raw["t_comm_ce_pred_ms"]
    rows = int(raw["rows"])
    return [
        *(raw[name] for name in PATTERN_FEATURES),
        raw["world"],
        _log2(raw["comm_compute_ratio"]),
        (problem.world - 1) * roofs.ce_floor_us / 1e3 / t_ce,
        piece_efficiency(rows, problem.n, problem.k),
        raw["top_k"],
        math.log2(max(raw["tokens_per_expert"], 1.0)),  # 0 without experts
        raw["rank_imbalance"],
        raw["expert_imbalance"],
    ]


def _roof_key(roofs: Roofs) -> tuple:
    return (
        tuple(sorted(roofs.gemm_tflops.items())),
        roofs.gemm_floor_us,
        roofs.ce_gbps,
        roofs.ce_floor_us,
        roofs.nccl_gbps,
        roofs.nccl_floor_us,
        roofs.sm_count,
    )


def pair_physics(problem: Problem, name: str, roofs: Roofs) -> tuple[float, ...]:
    """What schedule ``name`` makes of ``problem``, in ``PHYSICAL_PAIR_FEATURES`` order."""
    key = _roof_key(roofs)
    _ROOFS.setdefault(key, roofs)
    return _pair_physics(problem, name, key)


_ROOFS: dict[tuple, Roofs] = {}  # roofs by their numbers (Roofs holds dicts: not hashable)


@lru_cache(maxsize=65536)
def _pair_physics(problem: Problem, name: str, key: tuple) -> tuple[float, ...]:
    roofs = _ROOFS[key]
    s = Schedule.parse(name)
    g = geometry(problem, s)
    tflops = roofs.gemm_tflops[problem.dtype]
    on_ce = s.transport.traits.cost_class is CostClass.CE  # else priced as NCCL's
    raw = raw_features(problem, roofs)
    whole_rows = int(raw["rows"])
    t_gemm = _gemm_ms(whole_rows, problem.n, problem.k, tflops, roofs)
    comm_bytes = int(raw["comm_bytes"])
    t_comm = _copy_ms(comm_bytes, on_ce, roofs) + (
        (problem.world - 2) * roofs.ce_floor_us / 1e3 if on_ce else 0.0
    )
    t_piece = _gemm_ms(g.gemm_rows, g.gemm_cols, g.gemm_k, tflops, roofs)
    t_chunk = _copy_ms(g.transfer_bytes, on_ce, roofs)
    t_gemm_s = g.gemm_launches * t_piece
    t_comm_s = max(g.transfers, 1) * t_chunk
    serial_pred = t_gemm + _copy_ms(comm_bytes, False, roofs)
    if s.granularity is Granularity.SERIAL:
        t_pred = t_gemm_s + t_comm_s
    else:
        # the longer side, plus one piece of the shorter that cannot hide behind it
        t_pred = max(t_gemm_s, t_comm_s) + min(t_piece, t_chunk)
    floor_bytes = (
        roofs.ce_floor_us * roofs.ce_gbps if on_ce else roofs.nccl_floor_us * roofs.nccl_gbps
    ) * 1e3  # us * GB/s = 1e3 bytes
    return (
        _log2(t_comm / t_gemm),
        _log2(g.transfer_bytes / floor_bytes),
        piece_efficiency(g.gemm_rows, g.gemm_cols, g.gemm_k),
        _log2(t_gemm_s / t_gemm - 1 + 1e-3),
        _log2(t_comm_s / t_comm - 1 + 1e-3) if t_comm_s > t_comm else _log2(1e-3),
        _log2(t_pred / serial_pred),
        s.sm_reserve / roofs.sm_count,
        float(s.transport.traits.on_sms),  # nccl, and sm's relay hops
        math.log2(g.chunks),
        *schedule_vector(s),
    )
