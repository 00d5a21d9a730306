"""The calibrated parameters of the cost model, as one JSON file (``schedules/<machine>/model.json``).

Written by ``ficco.model.calibrate``, read by :func:`load_params` (pure Python). Every
bandwidth is stored as an *efficiency* of the machine's own figure (a link's or the HBM's), so
the same parameters predict a machine with other links; fixed costs are in milliseconds.

Sections (each a flat object of numbers; the reader refuses a missing, extra or non-finite one):

``gemm``        cuBLAS time ``launch + softmax_p(flops / (peak x waves), bytes / (hbm x eff))``
                with wave quantization on ``tile_m x tile_n`` tiles; ``triton_vs_cublas`` and
                ``sm_budget_exponent`` scale it to ficco's Triton GEMM at an SM budget
``transfer``    per op class ``<class>_fixed_ms`` and ``<class>_eff`` (of the link or HBM)
``contention``  ``<transport>_gemm`` / ``<transport>_comm``: the slowdown (rate divisor - 1)
                of a GEMM while a transfer of that transport runs, and of the transfer
``host``        eager issue costs per op (``gemm_copy_ms``: what a cuBLAS GEMM into a
                column chunk adds, a temporary and a copy), a CUDA graph's launch cost, ``span_ms``: what
                each task's isolated span (the costs' source) carries beyond its work, and
                ``lead_ms``: the backlog each timed iteration's L2 flush and barrier leave the
                GPU before the op (their GPU time less their issue time), and
                ``graph_issue_ms``: the host's time to launch a CUDA-graph candidate; the two
                replay a sweep's queued rounds (``ficco.model.rounds``)
``timed_scale`` ``[[log2 ms, scale], ...]``: a timed run's time over the simulated GPU time, by
                duration (task costs are fitted on isolated per-task spans; the timed runs of
                the store took up to 14% longer around 1-4 ms, 1% around 0.25-0.5 ms:
                inter-kernel gaps and the clocks of sustained load), linear in log2 ms
                between points, constant beyond them
``gemm_residuals`` a list of ``[log2 m, log2 n, log2 k, log residual]`` of measured GEMMs
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "ficco.model/4"

GEMM_KEYS = (
    "launch_ms",
    "peak_flops_per_ms",
    "hbm_eff",
    "softmax_p",
    "tile_m",
    "tile_n",
    "triton_vs_cublas",
    "sm_budget_exponent",
    "idw_neighbors",
    "idw_decay",
)
TRANSFER_CLASSES = (
    "ce",  # one copy-engine peer copy pulled by its receiver (gathers)
    "ce_push",  # one copy-engine peer copy pushed by its sender into the peer (scatters)
    "local",  # a copy within a GPU
    "reduce",  # sum of W partial chunks (an SM kernel), eff of HBM
    "p2p",  # one NCCL send+recv batch
    "p2p_strided",  # the packing copies of a strided NCCL chunk, eff of HBM
    "all_gather",  # one ring step of NCCL's all-gather
    "reduce_scatter",  # one ring step of NCCL's reduce-scatter
)
TRANSFER_KEYS = tuple(f"{c}_{s}" for c in TRANSFER_CLASSES for s in ("fixed_ms", "eff"))
CONTENTION_KEYS = ("ce_gemm", "ce_comm", "nccl_gemm", "nccl_comm")
#: the eager host's issue cost classes, as ``CostModel.lower`` adds them up per task
ISSUE_KEYS = (
    "fixed_ms",
    "gemm_ms",
    "gemm_copy_ms",
    "p2p_ms",
    "strided_ms",
    "reduce_ms",
    "copy_ms",
)
HOST_KEYS = (
    *ISSUE_KEYS,
    "graph_ms",
    "span_ms",
    "lead_ms",
    "graph_issue_ms",
)


@dataclass(frozen=True)
class ModelParams:
    machine: str
    """The machine description the parameters were calibrated on."""
    gemm: dict[str, float]
    transfer: dict[str, float]
    contention: dict[str, float]
    host: dict[str, float]
    gemm_residuals: tuple[tuple[float, float, float, float], ...]
    timed_scale: tuple[tuple[float, float], ...]
    calibration: dict
    """Where the figures came from (store, record counts, fit errors): provenance only."""

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "machine": self.machine,
            "gemm": self.gemm,
            "transfer": self.transfer,
            "contention": self.contention,
            "host": self.host,
            "gemm_residuals": [list(r) for r in self.gemm_residuals],
            "timed_scale": [list(r) for r in self.timed_scale],
            "calibration": self.calibration,
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")


def _section(data: dict, name: str, keys: tuple[str, ...], where: str) -> dict[str, float]:
    section = data.get(name)
    if not isinstance(section, dict):
        raise ValueError(f"{where}: section {name!r} must be an object of numbers")
    missing = [k for k in keys if k not in section]
    extra = [k for k in section if k not in keys]
    if missing or extra:
        raise ValueError(f"{where}: section {name!r}: missing {missing}, unknown {extra}")
    out = {}
    for key in keys:
        value = section[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {name}.{key} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {name}.{key} must be finite and >= 0, got {value!r}")
        out[key] = float(value)
    return out


def params_from_dict(data: object, where: str = "model") -> ModelParams:
    """Parameters from their JSON form; raises ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    if not isinstance(data.get("machine"), str):
        raise ValueError(f"{where}: machine must be a machine description's name")
    gemm = _section(data, "gemm", GEMM_KEYS, where)
    for key in ("peak_flops_per_ms", "hbm_eff", "softmax_p", "tile_m", "tile_n"):
        if gemm[key] <= 0:
            raise ValueError(f"{where}: gemm.{key} must be > 0, got {gemm[key]}")
    transfer = _section(data, "transfer", TRANSFER_KEYS, where)
    for cls in TRANSFER_CLASSES:
        if transfer[f"{cls}_eff"] <= 0:
            raise ValueError(f"{where}: transfer.{cls}_eff must be > 0")
    residuals = data.get("gemm_residuals")
    if not isinstance(residuals, list) or not all(
        isinstance(r, list)
        and len(r) == 4
        and all(isinstance(x, (int, float)) and math.isfinite(x) for x in r)
        for r in residuals
    ):
        raise ValueError(f"{where}: gemm_residuals must be a list of [log2 m, log2 n, log2 k, r]")
    scale = data.get("timed_scale")
    if (
        not isinstance(scale, list)
        or not scale
        or not all(
            isinstance(r, list)
            and len(r) == 2
            and all(isinstance(x, (int, float)) and math.isfinite(x) for x in r)
            and r[1] > 0
            for r in scale
        )
        or [r[0] for r in scale] != sorted({r[0] for r in scale})
    ):
        raise ValueError(
            f"{where}: timed_scale must be a non-empty list of [log2 ms, scale > 0] with "
            "strictly increasing log2 ms"
        )
    return ModelParams(
        machine=data["machine"],
        gemm=gemm,
        transfer=transfer,
        contention=_section(data, "contention", CONTENTION_KEYS, where),
        host=_section(data, "host", HOST_KEYS, where),
        gemm_residuals=tuple(tuple(float(x) for x in r) for r in residuals),
        timed_scale=tuple((float(a), float(b)) for a, b in scale),
        calibration=dict(data.get("calibration") or {}),
    )


def load_params(path: str | Path) -> ModelParams:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"model {path}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"model {path}: not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"model {path}: not a JSON text file (byte {err.start} is not UTF-8)"
        ) from None
    return params_from_dict(data, where=f"model {path}")


def timed_scale_at(points: tuple[tuple[float, float], ...], gpu_ms: float) -> float:
    """The timed-run scale at a simulated GPU time (linear in log2 ms, flat beyond the ends)."""
    if not points:
        return 1.0
    x = math.log2(max(gpu_ms, 1e-6))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]
