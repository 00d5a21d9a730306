"""Embedding-bag pooling's gather bandwidth: fitted on one H100, derived for other machines.

A pooling launch (``PoolOp``) reads every row its bags gather and writes every pooled row once:
its time is ``fixed + (rows gathered + rows written) x D x element bytes / bandwidth``. The
fit is least squares of that line over the 26-table DLRM-DCNv2 shapes of
``profiles/h100/embedding_pool.json`` (bf16: the dtype the model covers; batches 2048 to
65536, even and uneven bags), once for ficco's Triton kernel and once for torch's
EmbeddingBag (the measured baseline, ``eb_concat``). A bandwidth over the H100's HBM figure
is a gather *efficiency*; a machine description's ``gather`` entry is its own ``hbm_gbs``
times that efficiency, marked ``derived`` (``python -m ficco.model.gather`` prints the
entries; ``tests/test_model_pool.py`` checks the shipped ones against the profile).

The small tables of a DLRM batch stay in L2, so a gather reads less from HBM than it counts:
the efficiency may reach 1. The torch figure prices the executor's torch pooling (torch's
EmbeddingBag, one call per segment: ``ficco.patterns.emb_a2a.embedding_bag``), measured as
one EmbeddingBag call over the stacked tables.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

#: the H100 80GB HBM3 (SXM) the profile was measured on: 3.35 TB/s (NVIDIA H100 datasheet)
H100_HBM_GBS = 3350.0
#: the measured profile, in the repository (not shipped with the package)
PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "h100" / "embedding_pool.json"
#: the candidates of the profile that price each pooling: ficco's kernel, torch's
CANDIDATES = {"triton_eff": "triton", "torch_eff": "eb_concat"}


@dataclass(frozen=True, slots=True)
class GatherFit:
    """Efficiencies (bandwidth over the H100's HBM figure) and the fixed cost of a launch."""

    triton_eff: float
    torch_eff: float
    fixed_us: float
    """The Triton kernel's fixed cost (torch's, fitted alike, is not used: its launch sequence
    differs with the executor's path)."""
    points: int


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def fit_gather(profile: dict, dtype: str = "bf16") -> GatherFit:
    """The fit of ``profile`` (``embedding_pool.json``'s form) for ``dtype``."""
    record = profile["dtypes"][dtype]
    dim = profile["tables"]["dim"]
    width = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    shapes = record["shapes"]
    mbytes = [(s["rows_gathered"] + s["batch"] * s["tables"]) * dim * width / 1e6 for s in shapes]
    effs, fixed = {}, 0.0
    for field, name in CANDIDATES.items():
        ms = [s["candidates"][name]["median_ms"] for s in shapes]
        intercept, ms_per_mb = _line(mbytes, ms)
        effs[field] = 1 / ms_per_mb / H100_HBM_GBS  # MB per ms is GB/s
        if name == "triton":
            fixed = max(intercept, 0.0) * 1e3
    return GatherFit(effs["triton_eff"], effs["torch_eff"], fixed, len(shapes))


def derived_entry(hbm_gbs: float, fit: GatherFit) -> dict:
    """A machine description's ``gather`` entry for a machine of ``hbm_gbs``."""
    return {
        "triton_gbs": round(hbm_gbs * fit.triton_eff),
        "torch_gbs": round(hbm_gbs * fit.torch_eff),
        "fixed_us": round(fit.fixed_us, 1),
        "derived": True,
        "source": (
            f"derived, not measured: hbm_gbs x the gather efficiencies fitted on one H100 80GB "
            f"HBM3 ({H100_HBM_GBS:.0f} GB/s) over {fit.points} bf16 DLRM-DCNv2 shapes of "
            f"profiles/h100/embedding_pool.json (Triton {fit.triton_eff:.3f}, torch "
            f"EmbeddingBag {fit.torch_eff:.3f}; ficco.model.gather)"
        ),
    }


def main() -> None:
    from ficco.model.machine import MACHINES_DIR

    fit = fit_gather(json.loads(PROFILE.read_text()))
    print(fit)
    for path in sorted(MACHINES_DIR.glob("*.json")):
        hbm = json.loads(path.read_text())["hbm_gbs"]
        print(path.stem, json.dumps(derived_entry(hbm, fit)), file=sys.stdout)


if __name__ == "__main__":
    main()
