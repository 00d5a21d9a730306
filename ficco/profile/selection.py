"""Which records a selector may learn from: the policy ``ficco train`` and ``ficco evaluate``
(CLI and API) apply before they touch a frame.

- One fingerprint: a store or frame whose records come from several machines or software
  stacks is refused unless the caller picks one (:class:`MixedFingerprints`, naming each with
  its device and record count).
- GPU timings for training: CPU records time the harness (host wall clock, verification
  included, the Triton interpreter), never a GPU, so a table trained on them would recommend
  schedules for no machine (:class:`CpuTimings`, saying which store to use instead).
  Evaluating on them is allowed, as a check of the pipeline, with a :class:`CpuTimingsWarning`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ficco.backends import unprofiled
from ficco.profile.frame import MixedFingerprints, load_frame, pick_fingerprint
from ficco.profile.store import Store

if TYPE_CHECKING:
    import pandas as pd

#: the measured store shipped with ficco: what to train on instead of CPU records
SHIPPED_GPU_STORE = "profiles/h200x2/store"

__all__ = [
    "SHIPPED_GPU_STORE",
    "CpuTimings",
    "CpuTimingsWarning",
    "MixedFingerprints",
    "selection_frame",
]


class CpuTimings(ValueError):
    """Training asked on records measured by the cpu backend (harness timings)."""


class CpuTimingsWarning(UserWarning):
    """Evaluating on cpu-backend records: the figures check the pipeline, not a machine."""


def selection_frame(
    source: str | Path | Store | pd.DataFrame,
    *,
    fingerprint: str | None = None,
    purpose: Literal["train", "evaluate"] = "train",
) -> pd.DataFrame:
    """The frame a selector trains or is evaluated on, from a store (directory, database URL,
    :class:`Store`) or a frame already loaded.

    Raises MixedFingerprints when the records carry several fingerprints and ``fingerprint``
    picks none; ValueError when ``fingerprint`` is not among them; CpuTimings when
    ``purpose`` is ``"train"`` and the records come from the cpu backend."""
    import pandas as pd

    if purpose not in ("train", "evaluate"):
        raise ValueError(f"purpose: must be 'train' or 'evaluate', got {purpose!r}")
    if isinstance(source, pd.DataFrame):
        frame = pick_fingerprint(source, fingerprint, source="the frame")
        where = "the frame"
    else:
        frame = load_frame(source, fingerprint)
        from ficco.profile.urls import masked

        where = f"store {masked(source)}"
    backends = set(frame["backend"].dropna().astype(str)) if "backend" in frame.columns else set()
    harness = unprofiled(backends)  # backends whose timings may not be profiles
    if harness:
        if purpose == "train":
            raise CpuTimings(
                f"{where}: its records come from the {', '.join(harness)} backend, whose "
                "timings measure the harness, not a GPU's schedules; a table trained "
                "on them would recommend schedules for no machine. Train on a GPU store: the "
                f"shipped {SHIPPED_GPU_STORE} (ficco train --store {SHIPPED_GPU_STORE} --out "
                "DIR), or one a GPU sweep wrote (ficco sweep --backend cuda --store DIR)"
            )
        warnings.warn(
            f"{where}: {', '.join(harness)}-backend records; these metrics check the pipeline, not any "
            f"machine's schedules (a GPU store, e.g. {SHIPPED_GPU_STORE}, measures those)",
            CpuTimingsWarning,
            stacklevel=2,
        )
    return frame
