"""Problems: one GEMM glued to one collective, on W ranks.

Shapes are global unless named ``_shard``. What each pattern's ranks hold and produce, and
every other fact of a pattern, is in its module under ``ficco.patterns`` (``ag_gemm``,
``gemm_rs``, ``a2a_gemm``, ``gemm_a2a``, ``gemm_ar``, ``emb_a2a``); the rules a problem checks
here are the pattern-independent ones, plus what its spec says (M divisible by W where every
rank holds M/W rows; experts and a routing where tokens are routed; the fields a pattern
declares of its own, its spec's ``problem_fields``, such as emb_a2a's tables: checked, keyed
and written as the declaration says, and read as attributes like the common ones).

For the all-to-all patterns ``m`` is the global number of routed tokens and ``routing[s][e]`` the
tokens rank ``s`` sends to expert ``e`` (uniform routing spreads ``m/W`` tokens per rank evenly).

Torch is never imported here: problems are pure values, so enumerating and recommending never
touch CUDA.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

import ficco.validate as validate
from ficco.dtypes import DTYPES, dtype_of
from ficco.dtypes import lookup as dtype_lookup
from ficco.patterns import Pattern, problem_field, problem_fields, spec_of
from ficco.validate import InputError

#: element size in bytes of each supported dtype name (``ficco.dtypes`` holds every trait)
DTYPE_BYTES: dict[str, int] = {name: d.bytes for name, d in DTYPES.items()}

#: FP8 tensor-core GEMMs (cuBLASLt, ``torch._scaled_mm``) take K and N in multiples of this
SCALED_GEMM_ALIGN = 16


class AScale(enum.StrEnum):
    """How A's fp32 scales go with a scaled dtype: one for the whole global A (every rank
    uses the same), or one per row (each row quantized alone; its scale travels with it)."""

    TENSOR = "tensor"
    ROW = "row"


class BScale(enum.StrEnum):
    """How B's fp32 scales go: one for all of B, or one per output column."""

    TENSOR = "tensor"
    COLUMN = "column"


def canonical_dtype(name: str) -> str:
    """``'bfloat16'`` -> ``'bf16'``; raises ValueError naming the field for unknown dtypes."""
    found = dtype_lookup(name)
    if found is None:
        raise InputError("dtype", name, f"unknown dtype; expected one of {sorted(DTYPE_BYTES)}")
    return found.name


def torch_dtype(name: str):
    """The torch dtype of a dtype name (imports torch: call only where tensors are made)."""
    import torch

    return getattr(torch, dtype_of(canonical_dtype(name)).torch_name)


def parse_pattern(value: str | Pattern) -> Pattern:
    try:
        return Pattern(str(value))
    except ValueError:
        names = ", ".join(p.value for p in Pattern)
        raise InputError("pattern", value, f"unknown pattern; expected one of {names}") from None


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` items into ``parts`` counts differing by at most one, larger counts first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _token_count(value: Any, source: int, expert: int) -> int:
    where = f"tokens rank {source} sends to expert {expert}"
    try:
        return validate.integer("routing", value, minimum=0, text=False)
    except InputError as err:
        rule = "token counts must be >= 0" if "must be an integer >=" in err.rule else err.rule
        raise InputError("routing", value, f"{rule} ({where})") from None


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class Problem:
    """One GEMM + collective pair on ``world`` ranks (global shapes). Beside the fields
    below, it takes (as keywords) and exposes (as attributes, None where its pattern does not
    declare them) the fields its pattern declares of its own (``PatternSpec.problem_fields``:
    emb_a2a's ``tables``, ``pooling``, ``bags``), kept canonical in :attr:`pattern_fields`."""

    pattern: Pattern
    """Which collective surrounds the GEMM (see the module docstring)."""
    m: int
    """Rows of the global GEMM (tokens); for all-to-all patterns, all routed tokens."""
    n: int
    """Output columns of the GEMM."""
    k: int
    """Reduction dimension of the GEMM as each rank computes it."""
    world: int
    """Number of ranks W (one GPU each); at least 2."""
    dtype: str = "bf16"
    """Element type of the GEMM's inputs (``ficco.dtypes``): bf16, fp16 or fp32 (outputs
    alike), or fp8_e4m3 / fp8_e5m2 (scaled inputs, bf16 outputs)."""
    a_scale: AScale | None = None
    """Scaled dtypes only: A's scale granularity (None: per tensor)."""
    b_scale: BScale | None = None
    """Scaled dtypes only: B's scale granularity (None: per tensor)."""
    experts: int | None = None
    """All-to-all patterns only: total experts, a multiple of ``world``."""
    routing: tuple[tuple[int, ...], ...] | None = None
    """All-to-all patterns only: ``routing[s][e]`` tokens rank s sends to expert e; None = uniform."""
    top_k: int | None = None
    """All-to-all patterns only: experts each token is routed to (its rows appear top_k times
    in ``m``); None = not stated (read as 1). The routing cannot tell it: rows summing to 4096
    are 4096 tokens routed once or 1024 routed to 4 experts."""
    pattern_fields: tuple[tuple[str, Any], ...] = ()
    """``(name, value)`` of every field the pattern declares of its own, canonical, in its
    spec's order (given as keywords, ``tables=...``; read as attributes, ``problem.tables``)."""
    name: str = field(default="", compare=False)
    """Optional label (e.g. ``l3-70b.fc1``); not part of the problem's identity."""

    def __init__(
        self,
        *,
        pattern: Pattern | str,
        m: int,
        n: int,
        k: int,
        world: int,
        dtype: str = "bf16",
        a_scale: AScale | str | None = None,
        b_scale: BScale | str | None = None,
        experts: int | None = None,
        routing: Any = None,
        top_k: int | None = None,
        pattern_fields: Any = (),
        name: str = "",
        **declared: Any,
    ) -> None:
        # ``declared``: the pattern's own fields by name, over ``pattern_fields`` (how
        # dataclasses.replace(problem, tables=...) passes a change)
        given = dict(pattern_fields)
        given.update(declared)
        for fname, value in (
            ("pattern", pattern),
            ("m", m),
            ("n", n),
            ("k", k),
            ("world", world),
            ("dtype", dtype),
            ("a_scale", a_scale),
            ("b_scale", b_scale),
            ("experts", experts),
            ("routing", routing),
            ("top_k", top_k),
            ("pattern_fields", tuple(given.items())),
            ("name", name),
        ):
            object.__setattr__(self, fname, value)
        self.__post_init__()

    def __getattr__(self, attribute: str) -> Any:
        """A field the pattern declares of its own (None: one only other patterns declare)."""
        if attribute.startswith("_") or attribute == "pattern_fields":
            raise AttributeError(attribute)  # unpickling and copying probe before slots fill
        for fname, value in self.pattern_fields:
            if fname == attribute:
                return value
        if attribute in problem_fields():
            return None
        raise AttributeError(f"'Problem' object has no attribute {attribute!r}")

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", parse_pattern(self.pattern))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        # integers: never 64.7, "12.9", True or the string "64" (text is parsed by its reader:
        # ficco.workloads.read_shapes_csv, ficco.api.make_problem)
        for fname in ("m", "n", "k", "world"):
            value = validate.integer(
                fname, getattr(self, fname), minimum=1, rule="must be positive", text=False
            )
            object.__setattr__(self, fname, value)
        if self.world < 2:
            raise InputError("world", self.world, "needs at least 2 ranks to communicate")
        if not isinstance(self.name, str):
            raise InputError("name", self.name, "must be a string")
        self._validate_pattern_fields()
        self._validate_scales()
        if self.pattern.is_all_to_all:
            self._validate_all_to_all()
        else:
            if self.experts is not None or self.routing is not None:
                raise InputError(
                    "experts/routing",
                    (self.experts, self.routing),
                    f"only the all-to-all patterns take them, not {self.pattern}",
                )
            if self.top_k is not None:
                raise InputError(
                    "top_k", self.top_k, f"only the all-to-all patterns take it, not {self.pattern}"
                )
            if self.m % self.world and spec_of(self.pattern).rows_per_rank:
                raise InputError(
                    "m",
                    self.m,
                    f"{self.pattern} gives every rank M/W rows, so m must be divisible by "
                    f"world={self.world}",
                )

    def _validate_pattern_fields(self) -> None:
        """Each field the pattern declares, checked in order (an omitted one as its default);
        a field only other patterns declare is refused naming them, an unknown one as Python
        refuses an unexpected keyword."""
        given = dict(self.pattern_fields)
        object.__setattr__(self, "pattern_fields", ())
        for declared in spec_of(self.pattern).problem_fields:
            value = given.pop(declared.name, None)
            value = declared.check(self, declared.default if value is None else value)
            object.__setattr__(
                self, "pattern_fields", (*self.pattern_fields, (declared.name, value))
            )
        if not given:
            return
        everywhere = problem_fields()
        for fname, value in given.items():
            if fname not in everywhere:
                raise TypeError(f"Problem got an unexpected keyword argument {fname!r}")
            if value is not None:  # None: not given (make_problem passes every option)
                takers = ", ".join(str(p) for p, _ in everywhere[fname])
                raise InputError(fname, value, f"only {takers} takes it, not {self.pattern}")

    def _declared(self):
        """``(declaration, value)`` of each field the pattern declares of its own."""
        values = dict(self.pattern_fields)
        return [(d, values[d.name]) for d in spec_of(self.pattern).problem_fields]

    def _written(self):
        """:meth:`_declared`, less the fields at a default their declaration leaves implicit
        (``ProblemField.implicit_default``: the key and dict of a problem that does not use
        such a field are what they were before the field existed)."""
        return [
            (d, value)
            for d, value in self._declared()
            if not (d.implicit_default and value == d.default)
        ]

    def _validate_scales(self) -> None:
        """Scaled dtypes take a scale granularity per side (default per tensor), a pattern
        whose spec takes scaled inputs, and K and N the FP8 tensor cores can run."""
        if not dtype_of(self.dtype).scaled:
            for fname in ("a_scale", "b_scale"):
                if getattr(self, fname) is not None:
                    raise InputError(
                        fname, getattr(self, fname), f"only scaled dtypes take it, not {self.dtype}"
                    )
            return
        for fname, kind in (("a_scale", AScale), ("b_scale", BScale)):
            value = getattr(self, fname)
            try:
                value = kind(value if value is not None else "tensor")
            except ValueError:
                names = ", ".join(k.value for k in kind)
                raise InputError(fname, value, f"must be one of {names}") from None
            object.__setattr__(self, fname, value)
        if not spec_of(self.pattern).scaled_inputs:
            raise InputError(
                "dtype",
                self.dtype,
                f"{self.pattern} does not take scaled inputs (its spec's scaled_inputs); "
                "use bf16, fp16 or fp32",
            )
        for fname in ("k", "n"):
            if getattr(self, fname) % SCALED_GEMM_ALIGN:
                raise InputError(
                    fname,
                    getattr(self, fname),
                    f"{self.dtype} GEMMs (cuBLASLt FP8, torch._scaled_mm) need {fname} to be "
                    f"a multiple of {SCALED_GEMM_ALIGN}",
                )

    def _validate_all_to_all(self) -> None:
        if self.experts is None:
            raise InputError("experts", None, f"{self.pattern} needs the number of experts")
        experts = validate.integer("experts", self.experts, text=False)
        object.__setattr__(self, "experts", experts)
        if experts <= 0 or experts % self.world:
            raise InputError(
                "experts",
                experts,
                f"must be a positive multiple of world={self.world} (each rank owns experts/W "
                "of them)",
            )
        if self.top_k is not None:
            top_k = validate.integer("top_k", self.top_k, minimum=1, text=False)
            if top_k > experts:
                raise InputError(
                    "top_k", top_k, f"must be <= experts={experts} (distinct experts per token)"
                )
            object.__setattr__(self, "top_k", top_k)
        if self.routing is None:
            if self.m % self.world:
                raise InputError(
                    "m",
                    self.m,
                    "uniform routing gives every rank M/W tokens, so m must be divisible by "
                    f"world={self.world}",
                )
            if self.top_k is not None:
                self._check_top_k(self.routing_table())
            return
        object.__setattr__(self, "routing", self._routing_counts(self.routing))
        if self.top_k is not None:
            self._check_top_k(self.routing)

    def _check_top_k(self, routing: tuple[tuple[int, ...], ...]) -> None:
        """Each rank's rows are its tokens x top_k, and no expert gets a token twice."""
        top_k = self.top_k
        assert top_k is not None
        for s, row in enumerate(routing):
            rows = sum(row)
            if rows % top_k:
                raise InputError(
                    "top_k",
                    top_k,
                    f"rank {s} sends {rows} rows, not a whole number of tokens x top_k",
                )
            if max(row) > rows // top_k:
                raise InputError(
                    "top_k",
                    top_k,
                    f"rank {s} sends {max(row)} rows to one expert but has only "
                    f"{rows // top_k} tokens (each token picks distinct experts)",
                )

    def _routing_counts(self, table: Any) -> tuple[tuple[int, ...], ...]:
        """The routing as a W x experts tuple of int token counts; every count an integer
        >= 0 (12.9 tokens is refused, not rounded), the counts summing to m."""
        shape_rule = f"must have world={self.world} rows of experts={self.experts} counts"
        if isinstance(table, str | bytes) or not hasattr(table, "__iter__"):
            raise InputError("routing", table, "must be a W x experts table of token counts")
        rows = list(table)
        if len(rows) != self.world or any(
            isinstance(row, str | bytes) or not hasattr(row, "__len__") or len(row) != self.experts
            for row in rows
        ):
            raise InputError("routing", table, shape_rule)
        routing = tuple(
            tuple(_token_count(c, s, e) for e, c in enumerate(row)) for s, row in enumerate(rows)
        )
        total = sum(map(sum, routing))
        if total != self.m:
            raise InputError(
                "routing", table, f"counts must sum to m={self.m}, they sum to {total}"
            )
        return routing

    # --- derived sizes -------------------------------------------------------------------

    @property
    def dtype_bytes(self) -> int:
        """Bytes per input element (A and B)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def scaled(self) -> bool:
        """Inputs are quantized with fp32 scales (fp8)."""
        return dtype_of(self.dtype).scaled

    @property
    def output_dtype(self) -> str:
        """The dtype the GEMM writes and collectives move after it (bf16 for fp8)."""
        return dtype_of(self.dtype).output_name

    @property
    def output_bytes(self) -> int:
        return DTYPE_BYTES[self.output_dtype]

    @property
    def row_scale_bytes(self) -> int:
        """Bytes of scale that go with each row of A (row-wise scales: one fp32)."""
        return 4 if self.a_scale is AScale.ROW else 0

    @property
    def m_shard(self) -> int:
        """Rows each rank holds (ag_gemm) or owns after the reduce-scatter (gemm_rs; gemm_ar's
        ``+rs_ag`` schedules, legal only where W divides M)."""
        return self.m // self.world

    @property
    def experts_per_rank(self) -> int:
        assert self.experts is not None
        return self.experts // self.world

    def routing_table(self) -> tuple[tuple[int, ...], ...]:
        """``[s][e]`` tokens rank s sends to expert e (the uniform table when none was given)."""
        if self.routing is not None:
            return self.routing
        assert self.experts is not None
        return tuple(
            tuple(split_evenly(self.m // self.world, self.experts)) for _ in range(self.world)
        )

    def tokens_between(self) -> list[list[list[int]]]:
        """``[src][dst][j]``: tokens rank src sends to rank dst's j-th local expert."""
        table, epr = self.routing_table(), self.experts_per_rank
        return [
            [[table[s][d * epr + j] for j in range(epr)] for d in range(self.world)]
            for s in range(self.world)
        ]

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the whole GEMM across all ranks."""
        return spec_of(self.pattern).flops(self)

    def comm_bytes_per_rank(self) -> int:
        """Bytes the busiest rank receives (the pattern's spec says how)."""
        return spec_of(self.pattern).comm_bytes(self)

    # --- identity ------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """Stable string identity, used as a key in profiles and tables."""
        base = f"{self.pattern}:m{self.m}:n{self.n}:k{self.k}:w{self.world}:{self.dtype}"
        if self.pattern.is_all_to_all:
            base += f":e{self.experts}"
            if self.routing is not None:
                base += ":r" + "/".join(",".join(map(str, row)) for row in self.routing)
            if self.top_k is not None:
                base += f":t{self.top_k}"
        for declared, value in self._written():
            base += ":" + declared.key(value)
        if self.scaled:
            base += f":sa-{self.a_scale}:sb-{self.b_scale}"
        return base

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pattern": self.pattern.value,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "world": self.world,
            "dtype": self.dtype,
        }
        if self.pattern.is_all_to_all:
            out["experts"] = self.experts
            out["routing"] = [list(r) for r in self.routing] if self.routing else None
            if self.top_k is not None:  # absent, not null: records written before it match
                out["top_k"] = self.top_k
        for declared, value in self._written():
            out[declared.name] = declared.to_json(value)
        if self.scaled:  # absent for plain dtypes: records written before them match
            out["a_scale"] = str(self.a_scale)
            out["b_scale"] = str(self.b_scale)
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        known = {"pattern", "m", "n", "k", "world", "dtype", "experts", "routing", "top_k", "name"}
        known |= {"a_scale", "b_scale"}
        known |= set(problem_fields())
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"problem: unknown field(s) {sorted(unknown)}")
        data = dict(data)
        if data.get("routing") is not None:
            data["routing"] = tuple(tuple(r) for r in data["routing"])
        for fname in set(data) & set(problem_fields()):
            declared = problem_field(data.get("pattern", ""), fname)
            if data[fname] is not None and declared is not None:
                data[fname] = declared.from_json(data[fname])
        return cls(**data)

    def __str__(self) -> str:
        return json.dumps(self.to_dict())
