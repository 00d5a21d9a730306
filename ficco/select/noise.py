"""The noise ceiling of a profile store: how well a perfect picker could do on these timings.

Each record keeps its per-round times (``extra.times_ms``). Split every record's rounds in two
halves (the first half and the second, ``ficco.measure.repeat``), build one dataset from each, pick the fastest schedule
of each problem by the first half, and score that pick against the second half. Even a picker
that knew the first half's answer exactly reaches only this share within 3%: a figure above it
is not a measurement of the selector but of the noise.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from ficco.measure.repeat import record_rounds, split_rounds
from ficco.select.dataset import Dataset, build_dataset


def half_medians(records: list[dict[str, Any]], half: int) -> list[dict[str, Any]]:
    """The records with each median taken over one half (0: first, 1: second) of its rounds,
    cut in time order (``ficco.measure.repeat.split_rounds``)."""
    out = []
    for record in records:
        samples = record_rounds(record)
        if len(samples) >= 2:
            part = split_rounds(samples, "halves")[half]
            record = {**record, "median_ms": statistics.median(part), "samples": len(part)}
        out.append(record)
    return out


def half_datasets(records: list[dict[str, Any]]) -> tuple[Dataset, Dataset]:
    """The datasets of the first and of the second half of every record's rounds."""
    from ficco.profile.frame import frame_from_records

    first, second = (build_dataset(frame_from_records(half_medians(records, h))) for h in (0, 1))
    return first, second


def store_halves(
    store: str | Path, fingerprint: str | None = None
) -> tuple[Dataset, Dataset] | None:
    """``half_datasets`` of a store (a directory or a database URL), of the records of
    ``fingerprint`` where one is picked; None for a frame file (it has no rounds)."""
    from ficco.profile import is_store_url, open_store

    if not is_store_url(store) and not Path(store).is_dir():
        return None
    with open_store(store) as opened:
        records = opened.records()
    if fingerprint is not None:
        records = [r for r in records if r.get("fingerprint_id") == fingerprint]
    return half_datasets(records)


def ceiling_picks(first: Dataset) -> pd.Series:
    """The fastest schedule of each problem by the first half of the rounds."""
    return pd.Series(first.times.idxmin(axis=1), index=first.keys, dtype=object)
