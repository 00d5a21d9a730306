"""A problem's table features, with the standard library only: the problem side of
``ficco.export.lookup`` (which reads tables and answers from them), in a file of its own; a
runtime copies both (``lookup.py`` imports this one from beside it where ficco is absent).

Features are quantities computed from the problem (:func:`table_features`, in
``TABLE_FEATURES`` order; each pattern's sizes are ``SIZES``, the twins of its spec's in
``ficco.patterns``: a parity test holds them equal; ``C_SIZES`` are the same in C, for the
generated header). For the all-to-all patterns a lookup
takes the routing as a W x experts table of token counts (``routing=``, e.g. a runtime's
router counts; ``ficco.recommend`` also draws one from a skew description) and the experts
per token (``top_k=``), else assumes uniform routing, top-1. The routing features
(``ROUTING_FEATURES``: top-k, experts per rank, tokens per expert, and the imbalance of tokens
received per rank and per expert) are ratios and counts that keep their meaning as sizes grow.
"""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}
_DTYPE_ALIASES |= {"float": "fp32", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}

#: Feature names in the order ``table_features`` returns them, in four named groups: the
#: patterns' one-hots (the selector's patterns, in ``ficco.patterns.Pattern``'s order: a
#: parity test holds them equal), the integer sizes, the real-valued predictions, the routing.
_PATTERN_ONE_HOTS = "is_ag_gemm is_gemm_rs is_a2a_gemm is_gemm_a2a"
_INTEGER_SIZES = "world dtype_bytes experts m n k m_shard rows flops comm_bytes shard_bytes"
_PREDICTIONS = "intensity t_gemm_pred_ms t_comm_ce_pred_ms t_comm_nccl_pred_ms comm_compute_ratio"
_ROUTING = "top_k experts_per_rank tokens_per_expert rank_imbalance expert_imbalance"
TABLE_FEATURES: tuple[str, ...] = tuple(
    " ".join((_PATTERN_ONE_HOTS, _INTEGER_SIZES, _PREDICTIONS, _ROUTING)).split()
)
#: Patterns a table answers: those with a one-hot column (``ficco``'s selector patterns).
PATTERNS: tuple[str, ...] = tuple(f.removeprefix("is_") for f in _PATTERN_ONE_HOTS.split())
#: Patterns whose tokens are routed to experts (they take experts, routing and top_k).
ROUTED_PATTERNS = frozenset({"a2a_gemm", "gemm_a2a"})
#: The routing features: 0 / 0 / 0.0 / 1.0 / 1.0 for ag_gemm and gemm_rs.
ROUTING_FEATURES: tuple[str, ...] = tuple(_ROUTING.split())
#: Features that are integers for every problem (the rest are real-valued).
INTEGER_FEATURES = frozenset(
    (*_PATTERN_ONE_HOTS.split(), *_INTEGER_SIZES.split(), "top_k", "experts_per_rank")
)


def canonical_dtype(dtype: str) -> str:
    key = str(dtype).lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return key


def check_problem(
    pattern: str,
    m: int,
    n: int,
    k: int,
    world: int,
    experts: int | None,
    routing: Any = None,
    top_k: int | None = None,
) -> None:
    """ValueError naming the field when the problem is not valid (the rules of
    ``ficco.problem.Problem``)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: unknown pattern {pattern!r}; expected one of {PATTERNS}")
    for name, value in (("m", m), ("n", n), ("k", k), ("world", world)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    if world < 2:
        raise ValueError(f"world: needs at least 2 ranks, got {world}")
    a2a = pattern in ROUTED_PATTERNS
    if not a2a and (routing is not None or top_k is not None):
        raise ValueError(
            f"routing/top_k: only the all-to-all patterns take them, not {pattern}, got "
            f"{(routing, top_k)!r}"
        )
    if routing is None and m % world:
        raise ValueError(f"m: must be divisible by world={world}, got {m}")
    if not a2a:
        return
    if isinstance(experts, bool) or not isinstance(experts, int) or experts <= 0 or experts % world:
        raise ValueError(
            f"experts: {pattern} needs a positive multiple of world={world}, got {experts!r}"
        )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts
    ):
        raise ValueError(f"top_k: must be an integer in [1, experts={experts}], got {top_k!r}")
    rows = [m // world] * world
    if routing is not None:
        rule = f"must be a list of world={world} rows of experts={experts} counts >= 0"
        if not isinstance(routing, (list, tuple)) or len(routing) != world:
            raise ValueError(f"routing: {rule}, got {routing!r}")
        for row in routing:
            if (
                not isinstance(row, (list, tuple))
                or len(row) != experts
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in row)
            ):
                raise ValueError(f"routing: {rule}, got row {row!r}")
        rows = [sum(row) for row in routing]
        if sum(rows) != m:
            raise ValueError(f"routing: counts must sum to m={m}, they sum to {sum(rows)}")
    for s, total in enumerate(rows if top_k else ()):
        # a token's top_k rows go to distinct experts: no expert gets more than the tokens
        most = max(routing[s]) if routing is not None else 0
        if total % top_k or most > total // top_k:
            raise ValueError(
                f"top_k: rank {s} sends {total} rows, at most {most} to one expert: not a "
                f"whole number of tokens x top_k={top_k} with distinct experts per token"
            )


def routing_summary(routing: Any, world: int, experts: int) -> tuple[int, ...]:
    """Sums of a W x experts routing: ``(rows, block, recv_max, back_max, expert_max,
    total)``: the most tokens any rank's experts get, the largest rank-to-rank block, the most
    rows a rank receives from peers (dispatch) and gets back from them (combine), the busiest
    expert's tokens, and all tokens."""
    epr = experts // world
    # between[s][d]: tokens rank s sends to rank d's experts
    between = [[sum(row[d * epr : (d + 1) * epr]) for d in range(world)] for row in routing]
    ranks = range(world)
    return (
        max(sum(between[s][d] for s in ranks) for d in ranks),
        max(between[s][d] for s in ranks for d in ranks if s != d),
        max(sum(between[s][d] for s in ranks) - between[d][d] for d in ranks),
        max(sum(between[s]) - between[s][s] for s in ranks),
        max(sum(col) for col in zip(*routing, strict=True)),
        sum(map(sum, routing)),
    )


# --- sizes: twins of each pattern spec's ``sizes`` (``ficco.patterns``; a parity test holds
# them equal): ``(rows, weights, comm_bytes, shard_bytes, experts)`` of one rank -------------


def _sharded_sizes(m: int, n: int, k: int, w: int, b: int, cols: int) -> tuple[int, ...]:
    shard_bytes = m // w * cols * b
    return m, k * n, (w - 1) * shard_bytes, shard_bytes, 0


def _uniform_blocks(m: int, w: int, e: int) -> tuple[int, int, int, int]:
    """Uniform routing: ``(per_rank, largest block, smallest block, busiest expert)``."""
    per_rank = m // w
    base, extra = divmod(per_rank, e)
    epr = e // w
    block_max = epr * base + min(extra, epr)
    block_min = epr * base + max(0, min(extra - (w - 1) * epr, epr))
    return per_rank, block_max, block_min, w * (base + (extra > 0))


def _routed_sizes(m, n, k, w, b, experts, routing, dispatch: bool) -> tuple[int, ...]:
    e = experts or 0
    weights = e // w * k * n
    cols = k if dispatch else n
    if routing is None:
        per_rank, block_max, block_min, _ = _uniform_blocks(m, w, e)
        rows, shard_bytes = w * block_max, block_max * cols * b
        comm_rows = (w - 1) * block_max if dispatch else per_rank - block_min
    else:
        rows, block, recv_max, back_max, _, _ = routing_summary(routing, w, e)
        shard_bytes, comm_rows = block * cols * b, recv_max if dispatch else back_max
    return rows, weights, comm_rows * cols * b, shard_bytes, e


def _emb_sizes(m, n, w, b, tables) -> tuple[int, ...]:  # tables whole, samples evenly
    c, s = ([x // w + (r < x % w) for r in range(w)] for x in (len(tables), m))
    own = max(sum(tables[sum(c[:r]) : sum(c[: r + 1])]) for r in range(w)) * n
    got = max((len(tables) - c[r]) * s[r] for r in range(w))
    pair = max(c[i] * s[j] for i in range(w) for j in range(w) if i != j)
    return max(c) * m, own, got * n * b, pair * n * b, 0


SIZES = {
    "ag_gemm": lambda m, n, k, w, b, e, r: _sharded_sizes(m, n, k, w, b, k),
    "gemm_rs": lambda m, n, k, w, b, e, r: _sharded_sizes(m, n, k, w, b, n),
    "a2a_gemm": lambda m, n, k, w, b, e, r: _routed_sizes(m, n, k, w, b, e, r, True),
    "gemm_a2a": lambda m, n, k, w, b, e, r: _routed_sizes(m, n, k, w, b, e, r, False),
    "emb_a2a": lambda m, n, k, w, b, e, r: _emb_sizes(m, n, w, b, r),  # r: the tables' rows
    "gemm_ar": lambda m, n, k, w, b, e, r: (
        m,
        k * n,
        -(-2 * (w - 1) * m * n // w) * b,
        -(-m // w) * n * b,
        0,
    ),
}


# --- the same sizes in C, for the generated header (``ficco.export.formats.to_header``) -----
# Per selector pattern (``PATTERNS``), C99 statements that set ``rows``, ``weights``,
# ``comm_bytes`` and ``shard_bytes`` (a routed pattern also ``e``, ``epr``, ``top_k``,
# ``expert_max`` and ``total``: uniform routing, top-1) from ``m``, ``n``, ``k``, ``w``, ``b``,
# ``experts`` and ``m_shard``; ``return -1`` refuses the problem. The header's test compiles
# them and holds their answers to this file's (tests/test_export.py).


def _c_sharded(cols: str) -> str:  # _sharded_sizes
    return f"""\
shard_bytes = m_shard * {cols} * b;
rows = m;
weights = k * n;
comm_bytes = (w - 1) * shard_bytes;"""


def _c_routed(dispatch: bool) -> str:  # _routed_sizes with uniform routing (_uniform_blocks)
    cols = "k" if dispatch else "n"
    # the smallest block (what a combine keeps home) matters to a combine only
    smallest = "" if dispatch else ", block_min, hi, low"
    block_min = (
        ""
        if dispatch
        else """
low = extra - (w - 1) * epr;
hi = low < epr ? low : epr;
block_min = epr * base + (hi > 0 ? hi : 0);"""
    )
    comm_rows = "(w - 1) * block_max" if dispatch else "(m_shard - block_min)"
    return f"""\
long long base, extra, block_max{smallest};
if (experts <= 0 || experts % w != 0) return -1;
e = experts;
base = m_shard / e;
extra = m_shard % e;
epr = e / w;
block_max = epr * base + (extra < epr ? extra : epr);{block_min}
rows = w * block_max;
top_k = 1;
expert_max = w * (base + (extra > 0));
total = m;
weights = epr * k * n;
shard_bytes = block_max * {cols} * b;
comm_bytes = {comm_rows} * {cols} * b;"""


C_SIZES = {
    "ag_gemm": _c_sharded("k"),
    "gemm_rs": _c_sharded("n"),
    "a2a_gemm": _c_routed(dispatch=True),
    "gemm_a2a": _c_routed(dispatch=False),
}


def table_features(
    pattern: str,
    m: int,
    n: int,
    k: int,
    world: int,
    dtype_bytes: int,
    experts: int | None,
    roofs: dict[str, Any],
    tflops: float,
    routing: Any = None,
    top_k: int | None = None,
) -> tuple[float, ...]:
    """The features of a problem in ``TABLE_FEATURES`` order (``routing`` None: uniform;
    ``top_k`` None: 1).

    ``tflops`` is ``roofs['gemm_tflops'][dtype]``. Same arithmetic, in the same order, as
    ``ficco.select.features.raw_features``."""
    b = dtype_bytes
    w = world
    rows, weights, comm_bytes, shard_bytes, e = SIZES[pattern](m, n, k, w, b, experts, routing)
    if pattern in ROUTED_PATTERNS:
        if routing is None:
            expert_max, total = _uniform_blocks(m, w, e)[3], m
        else:
            expert_max, total = routing_summary(routing, w, e)[4:]
        share = (rows * w / total, expert_max * e / total) if total else (1.0, 1.0)
        routed = (top_k or 1, e // w, m / e, *share)
    else:
        routed = (0, 0, 0.0, 1.0, 1.0)
    flops = 2 * rows * n * k
    touched = (rows * k + weights + rows * n) * b
    t_gemm = flops / (tflops * 1e9) + roofs["gemm_floor_us"] / 1000.0
    t_ce = (w - 1) * roofs["ce_floor_us"] / 1000.0 + comm_bytes / (roofs["ce_gbps"] * 1e6)
    t_nccl = roofs["nccl_floor_us"] / 1000.0 + comm_bytes / (roofs["nccl_gbps"] * 1e6)
    return (
        *(float(pattern == p) for p in PATTERNS),
        *map(float, (w, b, e, m, n, k, m // w, rows, flops, comm_bytes, shard_bytes)),
        flops / touched,
        t_gemm,
        t_ce,
        t_nccl,
        t_ce / t_gemm,
        *(float(x) for x in routed),
    )
