"""Input checks that need more than one value's type: a run's memory against the machine's,
chunk counts against the shapes they cut, a profile frame file's columns.

Each refusal is an :class:`InputError` naming the option, the value and the rule, raised
before any rank starts: a run that cannot fit would otherwise be recorded as an ``error``
verdict with exit status 0, and a chunk count no shape admits would leave a sweep without
the finer schedules it was asked for, silently.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ficco.backends import BackendSpec
from ficco.problem import DTYPE_BYTES, Problem
from ficco.space import Granularity, SpaceOptions, Split, enumerate_schedules
from ficco.space.geometry import quantum, split_extent
from ficco.validate import InputError

GB = 2**30


# --- memory ------------------------------------------------------------------------------------


def rank_bytes(problem: Problem, rank: int, device: str) -> int:
    """At least what one rank of ``problem`` holds at once: the serial plan's buffers (its
    inputs, workspaces and output, in the working dtype; overlapped plans add workspaces) and
    the reference of its output, exact (float64 on cpu, fp32 on cuda) and plain (working
    dtype). On cpu the reference regenerates every rank's inputs
    (``ficco.execute.reference.reference_output``), held at once in the working dtype (fp8:
    their bits and their float64 dequantized values). Scaled (fp8) buffers are counted at
    the input width, a lower bound (their outputs and partials are bf16)."""
    from ficco.plan import build_plan
    from ficco.space import Schedule

    size = DTYPE_BYTES[problem.dtype]
    own = build_plan(problem, Schedule(), rank)
    # a buffer of its own dtype (gemm_ar's FP8 norm output and its scale) at that width
    total = sum(_elements(b.shape) * DTYPE_BYTES[b.dtype or problem.dtype] for b in own.buffers)
    output = sum(_elements(b.shape) for b in own.buffers if b.name in own.outputs)
    total += output * ((8 if device == "cpu" else 4) + problem.output_bytes)
    if device == "cpu":
        total += (size + (8 if problem.scaled else 0)) * sum(
            _elements(b.shape)
            for r in range(problem.world)
            for b in build_plan(problem, Schedule(), r).buffers
            if b.is_input
        )
    return total


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def available_memory_bytes() -> int | None:
    """Memory the host can give now (``MemAvailable``: free plus reclaimable cache), or None
    where the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's total memory from ``nvidia-smi`` (no CUDA context is created in
    this process), or None where it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        sizes = [int(line.strip()) * 2**20 for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None


def check_memory(problems: Sequence[Problem], backend: BackendSpec | str, field: str = "m") -> None:
    """Refuse, before any rank starts, a problem whose ranks cannot fit: on a cpu backend
    all W ranks against the host's available memory (their processes' own memory is the
    backend's ``check_world``); on a cuda backend the ranks one GPU hosts (W over the GPUs
    the backend uses for W) against that GPU's memory, where ``nvidia-smi`` reports it. The
    estimate (:func:`rank_bytes`) counts tensors that must exist together, a lower bound:
    what it refuses cannot run."""
    from ficco.backends import backend_spec

    spec = backend_spec(backend)
    if not problems:
        return
    if spec.device == "cpu":
        limit, where = available_memory_bytes(), "this host has available"
    else:
        limit, where = gpu_memory_bytes(), "a GPU here has"
    if limit is None:
        return
    for p in problems:
        if spec.device == "cpu":
            need = sum(rank_bytes(p, r, "cpu") for r in range(p.world))
            what = f"its {p.world} cpu ranks need at least"
        else:
            per_gpu = -(-p.world // max(1, spec.gpus(p.world)))
            need = per_gpu * max(rank_bytes(p, r, "cuda") for r in range(p.world))
            what = f"the {per_gpu} rank(s) on one GPU need at least"
        if need > limit:
            name = f"{p.name} " if p.name else ""
            raise InputError(
                field,
                p.m,
                f"{name}{p.pattern} m={p.m} n={p.n} k={p.k} world={p.world} {p.dtype}: {what} "
                f"{need / GB:.1f} GB for its tensors (inputs, outputs, the reference) and "
                f"{where} {limit / GB:.1f} GB; use a smaller m (--tokens), n or k",
            )


# --- chunk counts --------------------------------------------------------------------------------


def _chunk_bound(problem: Problem) -> int:
    """Most chunks any split of ``problem`` can cut (``chunks_fit_extent``'s arithmetic)."""
    return max(split_extent(problem, split) // quantum(split) for split in Split)


def _admits(problem: Problem, space: SpaceOptions, chunks: int) -> bool:
    """Whether some finer schedule of ``problem`` with ``chunks`` chunks is legal in ``space``."""
    if chunks > _chunk_bound(problem):
        return False  # every split's extent is too short: no enumeration needed
    narrowed = dataclasses.replace(space, chunk_counts=(chunks,))
    return any(s.granularity is Granularity.FINER for s in enumerate_schedules(problem, narrowed))


def largest_chunks(problems: Sequence[Problem], space: SpaceOptions) -> tuple[int, Problem] | None:
    """The largest chunk count some problem admits, and that problem (None: none admits 2)."""
    best: tuple[int, Problem] | None = None
    for p in sorted(problems, key=_chunk_bound, reverse=True):
        bound = _chunk_bound(p)
        if best is not None and bound <= best[0]:
            break
        for chunks in range(bound, max(1, best[0] if best else 1), -1):
            if _admits(p, space, chunks):
                best = (chunks, p)
                break
    return best


def check_chunk_counts(problems: Sequence[Problem], space: SpaceOptions) -> None:
    """Refuse a chunk count that no problem of ``problems`` can be cut into (a sweep would run
    no finer schedule for it), naming the largest one the shapes allow."""
    for chunks in space.chunk_counts:
        if any(_admits(p, space, chunks) for p in problems):
            continue
        found = largest_chunks(problems, space)
        if found is None:
            rule = "no shape of this sweep can be cut into finer chunks"
        else:
            largest, p = found
            shape = f"{p.name or p.pattern} m={p.m} n={p.n} k={p.k} world={p.world}"
            rule = f"no shape of this sweep admits it; the largest legal chunk count is {largest} ({shape})"
        raise InputError("chunks", chunks, rule)


# --- profile frame files -------------------------------------------------------------------------


def read_frame_file(field: str, path: Path):
    """The profile frame in a ``.parquet`` or ``.csv`` file (``load_frame(store)`` written out),
    refused naming ``field`` and the file when it cannot be read or lacks a column the
    selector reads (``ficco.select.dataset.REQUIRED_COLUMNS``) or ``fingerprint_id`` (which
    machine measured each row)."""
    import pandas as pd

    from ficco.select.dataset import REQUIRED_COLUMNS
    from ficco.tabular import csv_rows

    required = (*REQUIRED_COLUMNS, "fingerprint_id")
    if path.suffix == ".csv":
        csv_rows(field, path, expect=",".join(required))  # text, a header, whole rows
        frame = pd.read_csv(path)
    else:
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # pyarrow raises its own types for a file that is not parquet
            raise InputError(
                field, str(path), f"cannot be read as parquet ({type(err).__name__}: {err})"
            ) from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(
            field,
            str(path),
            f"lacks the column(s) {missing}; a profile frame (load_frame(store) written to "
            f".parquet or .csv) has one row per measurement with at least {list(required)}",
        )
    return frame
