"""Patterns as registered specs: one module per pattern, found through one table.

Every pattern (:class:`Pattern`, re-exported by ``ficco.problem``) has a module
``ficco.patterns.<value>`` whose ``SPEC`` (a :class:`PatternSpec`, registered with
:func:`register`) holds all that ficco knows of it: its collective, the problem's rules (rows per rank, routing), the splits, fused and
seg schedules it admits, its sizes and chunk geometry, the fields its plans depend on, its
lowering and buffers (named by :class:`Ref`, in ``ficco.plan``), its exact and collective
references, the extra roundings verification allows, its CUDA baselines, its ideal
(:func:`ideal_ms`: the GEMM alone against the fastest of its ``comm_alone`` baselines), its
cost-model support, whether the selector knows it, and the name of its stdlib lookup twin.
The table is the enum itself: :data:`MODULES` maps each value to its module, imported on
first use, so reading the registry imports neither torch nor the planner (``ficco
recommend`` reads it). Every list of patterns elsewhere is derived from it.

How to add a pattern (as ``emb_a2a`` was added): four files, tests aside, also once the
selector knows it. A pattern whose problem takes fields of its own (emb_a2a's tables, pooling
and bags; gemm_ar's epilogue, ``ficco.patterns.epilogues``) declares them in its spec's
``problem_fields`` (:class:`ProblemField`), in its own module: ``Problem``, the CLI's problem
options, ``api.make_problem`` and (a field declared ``csv_column``) the shapes CSV read them
from :func:`problem_fields`. A pattern whose compute is not a GEMM needs a new op in
``ficco.plan.ops``, its primitive in ``ficco.execute`` and its price in ``ficco.model``.

1. ``ficco/patterns/__init__.py``: the enum value ``Pattern.EMB_A2A = "emb_a2a"`` (the
   value names the module of step 2).
2. ``ficco/patterns/emb_a2a.py``: ``SPEC = register(PatternSpec(...))`` with every part (the
   module docstring says what each rank holds and produces). A dense or routed pattern
   builds its spec with ``_dense.spec`` or ``_routed.spec`` instead, giving only the parts
   it does not share with its family (their ``DEFAULTS`` hold the rest), beside the other
   helpers of its family. Its references and CUDA baselines import torch inside their
   functions, so the registry stays importable without torch.
3. ``ficco/plan/emb_a2a.py``: its lowering and buffers (the spec names them by ``Ref``),
   built from ``ficco.plan.ops``'s vocabulary with ``ficco.plan.build``'s builder (a new op
   kind would also need its primitive in ``ficco.execute``).
4. ``ficco/export/lookup_features.py``: its stdlib sizes twin in ``SIZES`` (the parity test
   holds it to the spec's ``sizes``). Once measured profiles exist (``in_selector=True``),
   in the same file: its ``is_emb_a2a`` one-hot in ``TABLE_FEATURES`` (the C header's
   one-hots and feature indices follow it) and its sizes in C in ``C_SIZES`` (the header's
   branch for it; its test compiles the header against the Python lookup); the selector's
   one-hots (``FEATURE_PATTERNS``) follow the registry, and the tables are retrained (the
   column moves every later index).

Nothing else branches on a pattern's name: rules, geometry, plan keys, references,
verification, baselines, ideal, features, physics and the cost model read the spec. The
exceptions are implementations of one pattern's own path (``ficco.select.baselines``' async-TP
rule, the CUDA-only baselines that ``ficco.execute.cuda_shared`` records unavailable, gemm_ar's
``+rs_ag`` lowering reusing gemm_rs's).

``tests/test_patterns.py`` fails while a pattern lacks any part or its lookup twin disagrees,
and ``tests/test_plan_golden.py`` pins every pattern's plans.
"""

from __future__ import annotations

import enum
import importlib
import math
from collections.abc import Mapping
from dataclasses import fields

from ficco.patterns.spec import (
    BASELINE_COMM,
    BASELINE_GEMM,
    MAY_BE_EMPTY,
    SERIAL_PLAN_PARTS,
    Collective,
    ModelSupport,
    PatternSpec,
    ProblemField,
    Ref,
    Sizes,
    spec_parts,
)


class Pattern(enum.StrEnum):
    """The patterns (``ficco.problem`` re-exports it): each value names its spec's module."""

    AG_GEMM = "ag_gemm"
    GEMM_RS = "gemm_rs"
    A2A_GEMM = "a2a_gemm"
    GEMM_A2A = "gemm_a2a"
    GEMM_AR = "gemm_ar"
    EMB_A2A = "emb_a2a"

    @property
    def is_all_to_all(self) -> bool:
        """Tokens routed to experts (the problem takes experts, routing and top_k)."""
        return spec_of(self).routed

    @property
    def pools_tables(self) -> bool:
        """Embedding bags pooled from tables (the problem takes tables, pooling and bags)."""
        return self is Pattern.EMB_A2A


#: pattern -> the module that registers its spec (the module is named by the pattern's value)
MODULES: dict[Pattern, str] = {p: f"{__name__}.{p.value}" for p in Pattern}

_SPECS: dict[Pattern, PatternSpec] = {}


def missing_parts(spec: PatternSpec) -> list[str]:
    """The parts of ``spec`` left None or empty (``[]``: complete)."""
    missing = []
    for f in fields(spec):
        value = getattr(spec, f.name)
        if value is None or (
            isinstance(value, (tuple, str)) and not value and f.name not in MAY_BE_EMPTY
        ):
            missing.append(f.name)
    return missing


def register(spec: PatternSpec) -> PatternSpec:
    """Register ``spec`` for its pattern; refuses an incomplete spec (naming what it lacks)
    and a second spec of one pattern."""
    missing = missing_parts(spec)
    if missing:
        raise ValueError(f"pattern {spec.pattern}: spec lacks {', '.join(missing)}")
    if not isinstance(spec.pattern, Pattern):
        raise ValueError(f"pattern: {spec.pattern!r} is not a Pattern")
    if spec.pattern in _SPECS and _SPECS[spec.pattern] is not spec:
        raise ValueError(f"pattern {spec.pattern}: a spec is registered already")
    _SPECS[spec.pattern] = spec
    return spec


def spec_of(pattern: Pattern | str) -> PatternSpec:
    """The registered spec of ``pattern`` (its module imported on first use)."""
    spec = _SPECS.get(pattern)  # a StrEnum member and its value hash alike
    if spec is None:
        pattern = Pattern(pattern)
        importlib.import_module(MODULES[pattern])
        spec = _SPECS.get(pattern)
        if spec is None:
            raise LookupError(f"pattern {pattern}: {MODULES[pattern]} registers no spec")
    return spec


def specs() -> tuple[PatternSpec, ...]:
    """Every pattern's spec, in the enum's order."""
    return tuple(spec_of(p) for p in Pattern)


def problem_fields() -> dict[str, tuple[tuple[Pattern, ProblemField], ...]]:
    """Every pattern's own problem fields (:class:`ProblemField`) by name, each with the
    patterns that declare it and their declarations, in the enum's then declaration order:
    what ``Problem``, the CLI's problem options and ``api.make_problem`` take beyond the
    common fields."""
    found: dict[str, list[tuple[Pattern, ProblemField]]] = {}
    for spec in specs():
        for declared in spec.problem_fields:
            found.setdefault(declared.name, []).append((spec.pattern, declared))
    return {name: tuple(decls) for name, decls in found.items()}


def problem_field(pattern: Pattern | str, name: str) -> ProblemField | None:
    """``pattern``'s declaration of the field ``name``, else the first pattern's that
    declares it (what reads a value a problem of ``pattern`` then refuses), else None."""
    decls = problem_fields().get(name, ())
    return next((d for p, d in decls if p == pattern), decls[0][1] if decls else None)


def patterns_where(predicate) -> tuple[Pattern, ...]:
    """The patterns whose spec satisfies ``predicate``, in the enum's order."""
    return tuple(s.pattern for s in specs() if predicate(s))


def ideal_ms(pattern: Pattern | str, times: Mapping[str, float]) -> float:
    """The one definition of a problem's ideal: ``max(t_gemm, t_comm)`` with ``t_gemm`` the
    ``gemm_alone`` baseline and ``t_comm`` the fastest of the pattern's ``comm_alone``
    baselines measured (``times``: baseline name -> median ms; NaN or absent: not measured).
    NaN when either side is missing."""
    t_gemm = times.get(BASELINE_GEMM, math.nan)
    comm = [times[name] for name in spec_of(pattern).comm_alone if _measured(times.get(name))]
    if not comm or not _measured(t_gemm):
        return math.nan
    return max(t_gemm, min(comm))


def _measured(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


__all__ = [
    "BASELINE_COMM",
    "BASELINE_GEMM",
    "MODULES",
    "Pattern",
    "SERIAL_PLAN_PARTS",
    "Collective",
    "ModelSupport",
    "PatternSpec",
    "ProblemField",
    "Ref",
    "Sizes",
    "ideal_ms",
    "missing_parts",
    "patterns_where",
    "problem_field",
    "problem_fields",
    "register",
    "spec_of",
    "spec_parts",
    "specs",
]
