"""A made-up cost model that writes profile frames for the selector's tests.

SYNTHETIC: these numbers are invented by a formula, not measured on any machine. They exist so
the dataset, selector, evaluation and export code can be tested on a CPU. They must never be
written under ``schedules/`` or ``profiles/`` nor presented as measurements.

The model: a GEMM chunk of ``rows`` rows costs ``2 rows n k / (peak * rows / (rows + 256))``
plus a launch floor; a copy-engine chunk a 13 us floor plus bytes at 150 GB/s; an NCCL chunk a
60 us floor (30 us when chunked) plus bytes at 100 GB/s (slower than the H200 roofs on purpose,
so that communication matters and the labels vary). Overlapped schedules pipeline the local
shard's chunks first, then each peer chunk when it arrives; concurrent NCCL kernels slow the
GEMM by 35%, copy engines by 5%. Times get a deterministic multiplicative noise of about 1%
and a spread of 2%. One schedule is marked ``incorrect`` on one problem and the Triton
schedules ``oom`` on the largest shapes, so failure handling is exercised too.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache

from ficco.problem import Problem
from ficco.space.transports import CostClass, traits

#: Made-up models: (hidden, ffn); names say they are synthetic.
SYNTHETIC_MODELS: dict[str, tuple[int, int]] = {
    "synth-a": (2048, 5632),
    "synth-b": (3072, 8192),
    "synth-c": (4096, 14336),
    "synth-d": (5120, 13824),
    "synth-e": (6144, 16384),
    "synth-f": (8192, 28672),
}
SYNTHETIC_MOE: dict[str, tuple[int, int, int]] = {"synth-moe": (4096, 2048, 8)}
TOKENS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)

SCHEDULES: tuple[str, ...] = (
    "serial/nccl/cublas",
    "serial/ce/cublas",
    "shard/ce/cublas",
    "shard/nccl/cublas",
    "finer-c2-m/ce/cublas",
    "finer-c4-m/ce/cublas",
    "finer-c8-m/ce/cublas",
    "finer-c2-m/ce/cublas+hi",
    "finer-c4-m/ce/triton",
    "shard/ce/triton",
)


def synthetic_problems(world: int = 2, dtype: str = "bf16") -> list[Problem]:
    """Layers of the synthetic models at every token count."""
    out = []
    for model, (hidden, ffn) in SYNTHETIC_MODELS.items():
        for tokens in TOKENS:
            for layer, pattern, n, k in (
                ("qkv", "ag_gemm", 3 * hidden // world, hidden),
                ("fc1", "ag_gemm", 2 * ffn // world, hidden),
                ("out", "gemm_rs", hidden, hidden // world),
                ("fc2", "gemm_rs", hidden, ffn // world),
            ):
                out.append(
                    Problem(
                        pattern=pattern,
                        m=tokens,
                        n=n,
                        k=k,
                        world=world,
                        dtype=dtype,
                        name=f"{model}.{layer}.t{tokens}",
                    )
                )
    for model, (hidden, ffn, experts) in SYNTHETIC_MOE.items():
        for tokens in TOKENS:
            for layer, pattern, n, k in (
                ("expert_up", "a2a_gemm", 2 * ffn, hidden),
                ("expert_down", "gemm_a2a", hidden, ffn),
            ):
                out.append(
                    Problem(
                        pattern=pattern,
                        m=2 * tokens,
                        n=n,
                        k=k,
                        world=world,
                        dtype=dtype,
                        experts=experts,
                        name=f"{model}.{layer}.t{tokens}",
                    )
                )
    return out


def _noise(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return math.exp(0.01 * (2 * u - 1) * 1.7)


def _gemm_ms(rows: float, n: int, k: int, triton: bool) -> float:
    eff = rows / (rows + 256) * (0.92 if triton else 1.0)
    return 2 * rows * n * k / (790e9 * eff) + 0.005


def synthetic_time_ms(problem: Problem, schedule: str) -> float:
    """The made-up time of ``schedule`` on ``problem`` (see the module docstring)."""
    from ficco.select.features import _sizes

    rows, _, comm_bytes, shard_bytes, _ = _sizes(problem)
    w = problem.world
    head, transport, gemm = schedule.split("+")[0].split("/")
    nccl = traits(transport).cost_class is CostClass.NCCL  # SM kernels, else copy-engine copies
    hi = schedule.endswith("+hi")
    triton = gemm == "triton"
    if head == "serial":
        comm = 0.06 + comm_bytes / 100e6 if nccl else (w - 1) * (0.013 + shard_bytes / 150e6)
        return _gemm_ms(rows, problem.n, problem.k, triton) + comm
    chunks = 1 if head == "shard" else int(head.split("-")[1][1:])
    slow = 1.35 if nccl else 1.05 + (0.02 if hi else 0.0)
    g = _gemm_ms(rows / (w * chunks), problem.n, problem.k, triton) * slow
    piece = shard_bytes / chunks
    copy = 0.03 + piece / 100e6 if nccl else (0.013 + piece / 150e6)
    copy *= 0.97 if hi else 1.0
    t = chunks * g  # the local shard first, needing no transfer
    for i in range((w - 1) * chunks):
        t = max(t, (i + 1) * copy) + g
    return t


@lru_cache(maxsize=4)
def _frame_records(world: int, dtype: str) -> tuple[dict, ...]:
    rows = []
    for problem in synthetic_problems(world, dtype):
        model = problem.name.split(".")[0]
        common = {
            "pattern": problem.pattern.value,
            "m": problem.m,
            "n": problem.n,
            "k": problem.k,
            "world": problem.world,
            "dtype": problem.dtype,
            "experts": problem.experts,
            "problem_key": problem.key,
            "problem_name": problem.name,
            "model": model,
            "samples": 15,
            "fingerprint_id": "synthetic-0",
        }
        t_gemm = _gemm_ms(problem.m, problem.n, problem.k, False)
        t_comm = synthetic_time_ms(problem, "serial/nccl/cublas") - t_gemm
        serial = t_gemm + t_comm
        for name, t in (
            ("gemm_alone", t_gemm),
            ("comm_alone", t_comm),
            ("async_tp", synthetic_time_ms(problem, "shard/nccl/cublas") + 0.05),
        ):
            rows.append(
                {
                    **common,
                    "name": name,
                    "kind": "baseline",
                    "verdict": "ok",
                    "median_ms": t,
                    "spread_ms": 0.02 * t,
                }
            )
        for name in SCHEDULES:
            t = synthetic_time_ms(problem, name) * _noise(problem.key, name)
            verdict = "ok"
            if name.endswith("/triton") and problem.m >= 16384 and problem.n >= 28672:
                verdict = "oom"
            if name == "finer-c4-m/ce/cublas" and problem.name == "synth-c.fc1.t8192":
                verdict = "incorrect"
            rows.append(
                {
                    **common,
                    "name": name,
                    "kind": "schedule",
                    "verdict": verdict,
                    "median_ms": t if verdict != "oom" else math.nan,
                    "spread_ms": 0.02 * t,
                    "t_gemm_ms": t_gemm,
                    "t_comm_ms": t_comm,
                    "serial_ms": serial,
                    "speedup": serial / t,
                }
            )
    return tuple(rows)


def synthetic_frame(world: int = 2, dtype: str = "bf16"):
    """A profile frame (one row per measurement) from the synthetic cost model."""
    import pandas as pd

    frame = pd.DataFrame(list(_frame_records(world, dtype)))
    frame["experts"] = frame["experts"].astype("Int64")
    return frame


def light_families(machine: str = "h200x2") -> dict:
    """The safe default and five model families with few trees, so tests stay fast."""
    from ficco.select.selector import ScheduleSelector

    return {
        "safe_default": ScheduleSelector(family="safe_default", machine=machine),
        "tree": ScheduleSelector(family="tree", machine=machine, max_depth=6, min_samples_leaf=2),
        "forest": ScheduleSelector(family="forest", machine=machine, n_estimators=30),
        "boosting": ScheduleSelector(
            family="boosting", machine=machine, n_estimators=20, max_depth=3
        ),
        "regressor": ScheduleSelector(
            family="regressor", machine=machine, n_estimators=30, min_samples_leaf=2
        ),
        "physical": ScheduleSelector(
            family="physical",
            machine=machine,
            feature_set="physical",
            n_estimators=20,
            min_samples_leaf=2,
            softness=0.03,
            safe_margin=0.05,
        ),
    }


def tiny_families(machine: str = "h200x2") -> dict:
    """The safe default and one shallow tree: the fewest families that still take the
    selection rule one step. For tests of the commands around the selector (train, evaluate,
    their output); each family's own fitting is tested with ``light_families``."""
    from ficco.select.selector import ScheduleSelector

    return {
        "safe_default": ScheduleSelector(family="safe_default", machine=machine),
        "tree": ScheduleSelector(family="tree", machine=machine, max_depth=6, min_samples_leaf=2),
    }


@lru_cache(maxsize=2)
def synthetic_table(machine: str = "h200x2", per_group: int = 300):
    """``(table, evaluation, selector, dataset)`` trained on the synthetic frame (cached),
    choosing among the safe default, the tree and the forest of ``light_families`` (the forest
    wins): the tests that read it need a trained table, not the comparison of every family
    (``tests/test_select.py`` makes that), which would take three times as long."""
    from ficco.export.build import train_table
    from ficco.select.dataset import build_dataset

    frame = synthetic_frame()
    light = light_families(machine)
    families = {name: light[name] for name in ("safe_default", "tree", "forest")}
    table, evaluation, selector = train_table(
        frame, machine=machine, families=families, per_group=per_group
    )
    return table, evaluation, selector, build_dataset(frame)
