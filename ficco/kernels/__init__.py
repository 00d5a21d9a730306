"""Triton GEMM kernels for overlap schedules: a persistent matmul with an SM budget (and a
split-K decode kernel where a tuning-cache entry names it), and the fused GEMM of ``+fused``
schedules (tiles that wait on, or set, per-chunk flags).

This package imports Triton at module level; nothing else in ficco imports it, so
`import ficco` works where Triton is missing. Under the CPU interpreter, set
`TRITON_INTERPRET=1` before importing this package.
"""

from ficco.kernels.configs import (
    FALLBACK_CONFIG,
    GPU_CONFIGS,
    INTERPRETER_CONFIGS,
    GemmConfig,
    candidate_configs,
    heuristic_config,
)
from ficco.kernels.fused import (
    FlagTimeout,
    FlagWait,
    FusedChunkViews,
    FusedCopyViews,
    FusedGemm,
)
from ficco.kernels.matmul import matmul
from ficco.kernels.persistent import default_sm_budget, select_path, tma_available
from ficco.kernels.tuning import TuningKey, cache_path, cached_config, tune

__all__ = [
    "FALLBACK_CONFIG",
    "FlagTimeout",
    "FlagWait",
    "FusedChunkViews",
    "FusedCopyViews",
    "FusedGemm",
    "GPU_CONFIGS",
    "INTERPRETER_CONFIGS",
    "GemmConfig",
    "TuningKey",
    "cache_path",
    "cached_config",
    "candidate_configs",
    "default_sm_budget",
    "heuristic_config",
    "matmul",
    "select_path",
    "tma_available",
    "tune",
]
