"""Features of a problem, computed from the problem alone.

Nothing here reads a measurement of the problem being asked: sizes, W, dtype bytes, FLOPs,
bytes moved, arithmetic intensity, and times predicted from a machine's roofs (a small
per-machine table of measured peak rates and per-operation floors). Pure Python (``math``
only), so ``recommend`` can compute them with no numpy, torch or scikit-learn.

Two views of the same numbers:

``raw_features``       positive quantities in natural units (rows, bytes, FLOPs, ms). Exported
                       tables split on these, so a runtime recomputes them with a few integer
                       products and one division (the stdlib twin is
                       ``ficco.export.lookup_features.table_features``; a test checks the two
                       agree bit for bit).
``selector_features``  the same, log2-scaled where a quantity spans decades, plus a one-hot
                       pattern: what the selector's models see. Tree models are invariant to
                       monotone per-feature transforms, so a tree split on ``log2_x <= t`` is
                       the split ``x <= 2**t`` on the raw feature.

The all-to-alls' routing (``Problem.routing``, ``Problem.top_k``) enters twice: through the
sizes of the busiest rank (``rows``, ``comm_bytes``, ``shard_bytes``), and as the
``ROUTING_FEATURES`` (top-k, experts per rank, tokens per expert, and the rank and expert
imbalance, max over mean), counts and ratios that keep their meaning as the token count grows.
The selector sees them only when it is trained on an all-to-all (``ficco.select.selector``).

The roof constants for ``h200x2`` were measured on 2xH200 (NVLink, 2026-11-22): cuBLAS
bf16 ~790 TFLOP/s at 8192^3, copy-engine pulls ~390 GB/s with a ~13 us floor per copy, NCCL
all-gather ~240 GB/s bus bandwidth with a ~60 us floor. Predicted times are a roofline, not a
model of overlap: they say which side is larger, and by how much, before any measurement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ficco.defaults import SM_COUNT
from ficco.patterns import Sizes, patterns_where, spec_of
from ficco.problem import Pattern, Problem
from ficco.routing import imbalance


@dataclass(frozen=True, kw_only=True, slots=True)
class Roofs:
    """Measured peak rates and floors of one machine kind, used for predicted times."""

    machine: str
    """Machine kind, e.g. ``h200x2`` (the directory name under ``schedules/``)."""
    gpus: int
    """GPUs per host."""
    gemm_tflops: dict[str, float]
    """Dense GEMM peak by dtype name, TFLOP/s (cuBLAS on large square shapes)."""
    gemm_floor_us: float
    """Fixed cost of one GEMM launch, microseconds."""
    ce_gbps: float
    """Copy-engine peer copy bandwidth at large sizes, GB/s (1e9 bytes/s)."""
    ce_floor_us: float
    """Fixed cost of one copy-engine copy, microseconds."""
    nccl_gbps: float
    """NCCL collective bus bandwidth at large sizes, GB/s."""
    nccl_floor_us: float
    """Fixed cost of one NCCL collective, microseconds."""
    sm_count: int = SM_COUNT
    """SMs per GPU (H200: 132)."""
    source: str = ""
    """Where the numbers come from."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes (not used in any formula)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Roofs:
        return cls(**data)


#: Roof constants per machine kind. Add a machine here before training a table for it.
MACHINES: dict[str, Roofs] = {
    "h200x2": Roofs(
        machine="h200x2",
        gpus=2,
        gemm_tflops={"bf16": 790.0, "fp16": 790.0, "fp32": 50.0},
        gemm_floor_us=5.0,
        ce_gbps=390.0,
        ce_floor_us=13.0,
        nccl_gbps=240.0,
        nccl_floor_us=60.0,
        source=(
            "measured on 2xH200, NVLink, 2026-11-22: cuBLAS bf16 792 TFLOP/s at 8192^3; copy_ pull 394 GB/s "
            "at 1 GiB, ~13 us floor; NCCL all_gather 244 GB/s bus bw at 256 MiB/rank, ~60 us "
            "floor. fp32 (no TF32) and the 5 us launch floor are estimates, not measurements."
        ),
    ),
}
# 4 and 8 H200s of one host (NVSwitch): the per-GPU rates of h200x2 until measured there. The
# features only rank sizes against each other, and W enters them through the problem.
for _gpus in (4, 8):
    MACHINES[f"h200x{_gpus}"] = replace(
        MACHINES["h200x2"],
        machine=f"h200x{_gpus}",
        gpus=_gpus,
        source="not measured on this machine: the per-GPU figures of h200x2 (2xH200), to be "
        "replaced by the 4/8-GPU measurements",
    )


def roofs_for(machine: str) -> Roofs:
    """The roofs of a machine kind; ValueError naming the known kinds otherwise."""
    try:
        return MACHINES[machine]
    except KeyError:
        known = ", ".join(sorted(MACHINES))
        raise ValueError(
            f"machine: no roof constants for {machine!r} (known: {known}); add an entry to "
            "ficco.select.features.MACHINES"
        ) from None


#: Raw features in the order tables store them. Integers first, then real-valued ones.
INTEGER_FEATURES: tuple[str, ...] = (
    "world",
    "dtype_bytes",
    "experts",
    "m",
    "n",
    "k",
    "m_shard",
    "rows",
    "flops",
    "comm_bytes",
    "shard_bytes",
)
REAL_FEATURES: tuple[str, ...] = (
    "intensity",
    "t_gemm_pred_ms",
    "t_comm_ce_pred_ms",
    "t_comm_nccl_pred_ms",
    "comm_compute_ratio",
)
#: Patterns the features (and the tables, ``ficco.export.lookup``) know: those measured on GPUs
#: (their spec's ``in_selector``), in the enum's order. gemm_ar joins once its profiles exist;
#: until then a table cannot answer it.
FEATURE_PATTERNS: tuple[Pattern, ...] = patterns_where(lambda spec: spec.in_selector)
PATTERN_FEATURES: tuple[str, ...] = tuple(f"is_{p.value}" for p in FEATURE_PATTERNS)
#: The routing of the all-to-alls, as counts and ratios that keep their meaning as the token
#: count grows (0 / 0 / 0.0 / 1.0 / 1.0 for ag_gemm and gemm_rs). Last, so tables written
#: before them keep their feature indices.
ROUTING_FEATURES: tuple[str, ...] = (
    "top_k",
    "experts_per_rank",
    "tokens_per_expert",
    "rank_imbalance",
    "expert_imbalance",
)
RAW_FEATURES: tuple[str, ...] = (
    PATTERN_FEATURES + INTEGER_FEATURES + REAL_FEATURES + ROUTING_FEATURES
)

#: What each raw feature means (also written into exported tables).
FEATURE_DOC: dict[str, str] = {
    **{f"is_{p.value}": f"1 if the pattern is {p.value}, else 0" for p in FEATURE_PATTERNS},
    "world": "ranks W",
    "dtype_bytes": "bytes per element",
    "experts": "total experts (all-to-all patterns), else 0",
    "m": "global rows (tokens)",
    "n": "GEMM output columns",
    "k": "GEMM reduction dimension",
    "m_shard": "rows per rank, m // world",
    "rows": "GEMM rows one rank computes: m for ag_gemm/gemm_rs; the most tokens any rank "
    "receives for the all-to-alls (uniform routing unless given)",
    "flops": "2 * rows * n * k, one rank's GEMM",
    "comm_bytes": "bytes the busiest rank receives",
    "shard_bytes": "bytes of one peer's shard (ag_gemm: m_shard*k, gemm_rs: m_shard*n, "
    "all-to-alls: the largest rank-to-rank block) times dtype_bytes",
    "intensity": "flops / bytes one rank's GEMM touches (A + B + C)",
    "t_gemm_pred_ms": "flops / (gemm_tflops * 1e9) + gemm_floor_us / 1000",
    "t_comm_ce_pred_ms": "(world - 1) * ce_floor_us / 1000 + comm_bytes / (ce_gbps * 1e6)",
    "t_comm_nccl_pred_ms": "nccl_floor_us / 1000 + comm_bytes / (nccl_gbps * 1e6)",
    "comm_compute_ratio": "t_comm_ce_pred_ms / t_gemm_pred_ms",
    "top_k": "experts each token is routed to (all-to-all patterns; 1 when not stated), else 0",
    "experts_per_rank": "experts // world (all-to-all patterns), else 0",
    "tokens_per_expert": "m / experts, routed rows per expert on average (all-to-all "
    "patterns), else 0",
    "rank_imbalance": "most tokens any rank's experts receive over the mean per rank (1 = even; "
    "1 for ag_gemm/gemm_rs)",
    "expert_imbalance": "most tokens any expert receives over the mean per expert (1 = even; "
    "1 for ag_gemm/gemm_rs)",
}

#: Raw features the selector sees log2-scaled (the rest: one-hots, world, dtype bytes).
LOG_FEATURES: frozenset[str] = frozenset(INTEGER_FEATURES[3:] + REAL_FEATURES) | frozenset(
    {"experts", "tokens_per_expert"}
)
#: Log-scaled features that are 0 for the patterns without experts: log2(max(value, 1)).
_LOG_OR_ZERO = frozenset({"experts", "tokens_per_expert"})


def _sizes(problem: Problem) -> Sizes:
    """``(rows, weights, comm_bytes, shard_bytes, experts)`` of one rank: the pattern's spec's
    ``sizes`` (whose stdlib twin ``ficco.export.lookup_features`` computes alike)."""
    if problem.pattern not in FEATURE_PATTERNS:
        raise ValueError(
            f"pattern: the selector's features cover {', '.join(map(str, FEATURE_PATTERNS))}; "
            f"{problem.pattern} has no measured profiles to train on yet (sweep it on GPUs first)"
        )
    if problem.scaled:
        # the stdlib lookup's sizes twins move rows of one width per dtype; fp8 moves fp8 rows
        # or bf16 ones by pattern, so its features wait for its first measured store
        raise ValueError(
            f"dtype: the selector's features cover plain dtypes; {problem.dtype} has no "
            "measured profiles to train on yet (sweep it on GPUs first)"
        )
    return spec_of(problem.pattern).sizes(problem)


def raw_features(problem: Problem, roofs: Roofs) -> dict[str, float]:
    """The raw features of ``problem`` on a machine (see ``FEATURE_DOC``), in table order.

    The arithmetic is written in the same order as ``ficco.export.lookup_features.table_features`` so the
    two agree bit for bit, uniform or routed."""
    b = problem.dtype_bytes
    w = problem.world
    rows, weights, comm_bytes, shard_bytes, experts = _sizes(problem)
    if problem.pattern.is_all_to_all:
        rank_imbalance, expert_imbalance = imbalance(problem)
        routed = (
            problem.top_k or 1,
            experts // w,
            problem.m / experts,
            rank_imbalance,
            expert_imbalance,
        )
    else:
        routed = (0, 0, 0.0, 1.0, 1.0)
    flops = 2 * rows * problem.n * problem.k
    touched = (rows * problem.k + weights + rows * problem.n) * b
    tflops = roofs.gemm_tflops[problem.dtype]
    t_gemm = flops / (tflops * 1e9) + roofs.gemm_floor_us / 1000.0
    t_ce = (w - 1) * roofs.ce_floor_us / 1000.0 + comm_bytes / (roofs.ce_gbps * 1e6)
    t_nccl = roofs.nccl_floor_us / 1000.0 + comm_bytes / (roofs.nccl_gbps * 1e6)
    out: dict[str, float] = {f"is_{p.value}": float(problem.pattern is p) for p in FEATURE_PATTERNS}
    out.update(
        world=float(w),
        dtype_bytes=float(b),
        experts=float(experts),
        m=float(problem.m),
        n=float(problem.n),
        k=float(problem.k),
        m_shard=float(problem.m // w),
        rows=float(rows),
        flops=float(flops),
        comm_bytes=float(comm_bytes),
        shard_bytes=float(shard_bytes),
        intensity=flops / touched,
        t_gemm_pred_ms=t_gemm,
        t_comm_ce_pred_ms=t_ce,
        t_comm_nccl_pred_ms=t_nccl,
        comm_compute_ratio=t_ce / t_gemm,
    )
    out.update(zip(ROUTING_FEATURES, map(float, routed), strict=True))
    return out


def selector_feature_names() -> list[str]:
    """Names of the selector's features, in column order."""
    return [f"log2_{name}" if name in LOG_FEATURES else name for name in RAW_FEATURES]


def selector_features(problem: Problem, roofs: Roofs) -> list[float]:
    """The selector's feature vector: raw features, log2-scaled where they span decades."""
    raw = raw_features(problem, roofs)
    out = []
    for name in RAW_FEATURES:
        value = raw[name]
        if name in _LOG_OR_ZERO:
            value = math.log2(max(value, 1.0))  # 0 for the patterns without experts
        elif name in LOG_FEATURES:
            value = math.log2(value)
        out.append(value)
    return out
