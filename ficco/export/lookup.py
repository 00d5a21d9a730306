"""Answer "which schedule?" from an exported ficco table, with the standard library only.

This module imports nothing from ficco (nor numpy, torch or scikit-learn): a runtime may copy
this one file and call it::

    from lookup import load_table
    table = load_table("schedules/h200x2/table.json")
    answer = table.lookup("ag_gemm", m=8192, n=28672, k=8192, world=2, dtype="bf16")
    answer.schedule, answer.speedup, answer.reason

A table (JSON, ``format: ficco.schedule-table``, ``schema_version: 2``) holds:

``roofs``         the machine constants the predicted-time features use;
``features``      the feature names, in the order ``table_features`` computes them;
``range``         per (pattern, world, dtype) the training problems' m / n / k (and experts)
                  ranges (the table's training range);
``safe_default``  per pattern, the schedule of least mean regret over the training problems
                  (ties: least worst-case regret), with that regret and its speedup: the answer
                  outside the training range, which says so and by how much (``outside``:
                  per field, the factor by which the value lies beyond the bound);
``fallback``      the answer for a pattern the table has no safe default for (serial, always
                  legal);
``nodes``     a decision tree: internal nodes ``{id, feature, threshold, left, right}`` go left
              when ``feature <= threshold``; leaves ``{id, schedule, speedup, support,
              examples}`` answer (``speedup``: serial time / schedule time, the geometric mean
              over the training problems the leaf covers; ``support``: how many).

Features are quantities computed from the problem (see ``table_features``; each pattern's
sizes are ``SIZES``, the twins of its spec's in ``ficco.patterns``). For the all-to-all patterns
a lookup takes the routing as a W x experts table of token counts (``routing=``, e.g. a
runtime's router counts; ``ficco.recommend`` also draws one from a skew description) and the
experts per token (``top_k=``), else assumes uniform routing, top-1. The routing features
(``ROUTING_FEATURES``: top-k, experts per rank, tokens per expert, and the imbalance of tokens
received per rank and per expert) are ratios and counts that keep their meaning as sizes grow.
A table lists the features it was trained on (any of ``TABLE_FEATURES``: tables written before
the routing features still load) and, for the all-to-alls, may bound ``top_k`` and the two
imbalances in its ``range``. A CSV export of the same table (one row per rule, -1 meaning
"any", first match wins) is read by ``ficco.export.lookup_csv.load_csv_table``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

FORMAT = "ficco.schedule-table"
SCHEMA_VERSION = 2

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}
_DTYPE_ALIASES |= {"float": "fp32", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}

#: Feature names in the order ``table_features`` returns them.
_FEATURE_NAMES = (
    "is_ag_gemm is_gemm_rs is_a2a_gemm is_gemm_a2a world dtype_bytes experts m n k m_shard rows"
    " flops comm_bytes shard_bytes intensity t_gemm_pred_ms t_comm_ce_pred_ms"
    " t_comm_nccl_pred_ms comm_compute_ratio"
    " top_k experts_per_rank tokens_per_expert rank_imbalance expert_imbalance"
)
TABLE_FEATURES: tuple[str, ...] = tuple(_FEATURE_NAMES.split())
#: Patterns a table answers: those with a one-hot column (``ficco``'s selector patterns).
PATTERNS: tuple[str, ...] = tuple(f[3:] for f in TABLE_FEATURES if f.startswith("is_"))
#: Patterns whose tokens are routed to experts (they take experts, routing and top_k).
ROUTED_PATTERNS = frozenset({"a2a_gemm", "gemm_a2a"})
#: The routing features (the last five): 0 / 0 / 0.0 / 1.0 / 1.0 for ag_gemm and gemm_rs.
ROUTING_FEATURES: tuple[str, ...] = TABLE_FEATURES[20:]
#: Features that are integers for every problem (the rest are real-valued).
INTEGER_FEATURES = frozenset(TABLE_FEATURES[:15] + ("top_k", "experts_per_rank"))
#: Routing bounds a table's all-to-all ``range`` entry may carry: integer top_k, real imbalances.
ROUTING_RANGES: tuple[str, ...] = ("top_k", "rank_imbalance", "expert_imbalance")
ROOF_KEYS = ("gemm_tflops", "gemm_floor_us", "ce_gbps", "ce_floor_us", "nccl_gbps", "nccl_floor_us")


class TableError(ValueError):
    """A table file that cannot be used: unreadable, corrupt, or of another schema version."""


class Answer(NamedTuple):
    """One lookup's answer."""

    schedule: str
    """The schedule string, e.g. ``finer-c4-m/ce/cublas``."""
    speedup: float | None
    """Predicted serial time / schedule time (None when the table has no estimate)."""
    in_range: bool
    """Whether the problem lies inside the table's training range."""
    rule: int | None
    """The leaf node id (JSON) or row number (CSV) that answered; None for the fallback."""
    path: tuple[tuple[str, float, str, float], ...]
    """The decisions taken: ``(feature, value, '<=' or '>', threshold)``."""
    reason: str
    """Why this answer, in words."""
    features: tuple[float, ...]
    """The problem's features, in ``TABLE_FEATURES`` order (empty when out of range)."""
    outside: tuple[tuple[str, Any, Any, Any, float | None], ...] = ()
    """Out of range: per field ``(field, value, low, high, factor)``, the factor by which the
    value lies beyond the nearest bound (``value / high`` above, ``low / value`` below; None
    for a dtype or pattern the table has no problems of)."""


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


# --- validation -------------------------------------------------------------------------------


def _fail(where: str, rule: str) -> TableError:
    return TableError(f"{where}: {rule}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int_range(where: str, value: Any) -> tuple[int, int]:
    pair = isinstance(value, list) and len(value) == 2
    if not (pair and all(type(v) is int for v in value)) or value[0] > value[1]:
        raise _fail(where, f"must be [low, high] integers with low <= high, got {value!r}")
    return value[0], value[1]


def validate_table(data: Any, source: str = "table") -> None:
    """Raise :class:`TableError` saying what is wrong when ``data`` is not a usable table."""
    if not isinstance(data, dict):
        raise _fail(source, f"a table is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise _fail(
            f"{source}: format",
            f"expected {FORMAT!r}, got {data.get('format')!r} (not a ficco schedule table)",
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _fail(
            f"{source}: schema_version",
            f"this table has version {version!r} but this reader reads version "
            f"{SCHEMA_VERSION}; retrain the table with this ficco (ficco train) or use the "
            "ficco that wrote it",
        )
    for key in ("machine", "roofs", "features", "fallback", "safe_default", "range", "nodes"):
        if key not in data:
            raise _fail(source, f"missing key {key!r}")
    if not isinstance(data["machine"], str) or not data["machine"]:
        raise _fail(f"{source}: machine", "must be a non-empty string")
    roofs = data["roofs"]
    if not isinstance(roofs, dict):
        raise _fail(f"{source}: roofs", "must be an object")
    for key in ROOF_KEYS:
        if key not in roofs:
            raise _fail(f"{source}: roofs", f"missing key {key!r}")
    tflops = roofs["gemm_tflops"]
    if not isinstance(tflops, dict) or not all(_number(v) and v > 0 for v in tflops.values()):
        raise _fail(f"{source}: roofs.gemm_tflops", "must map dtype names to positive numbers")
    for key in ROOF_KEYS[1:]:
        if not _number(roofs[key]) or roofs[key] < 0 or (key.endswith("gbps") and roofs[key] == 0):
            raise _fail(f"{source}: roofs.{key}", f"must be a positive number, got {roofs[key]!r}")
    features = data["features"]
    listed = isinstance(features, list) and len(set(map(str, features))) == len(features)
    if not listed or not set(features) <= set(TABLE_FEATURES):
        raise _fail(
            f"{source}: features",
            f"must be distinct names among the features this reader computes "
            f"{list(TABLE_FEATURES)!r}, got {features!r}",
        )
    fallback = data["fallback"]
    if not isinstance(fallback, dict) or not isinstance(fallback.get("schedule"), str):
        raise _fail(f"{source}: fallback", "must be an object with a 'schedule' string")
    safe = data["safe_default"]
    if not isinstance(safe, dict):
        raise _fail(f"{source}: safe_default", "must be an object mapping patterns to entries")
    for pattern, entry in safe.items():
        where = f"{source}: safe_default.{pattern}"
        if pattern not in PATTERNS:
            raise _fail(where, f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
        if not isinstance(entry, dict) or not isinstance(entry.get("schedule"), str):
            raise _fail(where, "must be an object with a 'schedule' string")
        for key in ("mean_regret", "worst_regret"):
            if not (_number(entry.get(key)) and entry[key] >= 0):
                raise _fail(f"{where}.{key}", f"must be a number >= 0, got {entry.get(key)!r}")
        speedup = entry.get("speedup")
        if speedup is not None and not (_number(speedup) and speedup > 0):
            raise _fail(f"{where}.speedup", f"must be a positive number or null, got {speedup!r}")
    if not isinstance(data["range"], list):
        raise _fail(f"{source}: range", "must be a list of training ranges")
    for i, entry in enumerate(data["range"]):
        where = f"{source}: range[{i}]"
        if not isinstance(entry, dict):
            raise _fail(where, "must be an object")
        if entry.get("pattern") not in PATTERNS:
            raise _fail(f"{where}.pattern", f"unknown pattern {entry.get('pattern')!r}")
        if entry.get("dtype") not in DTYPE_BYTES:
            raise _fail(f"{where}.dtype", f"unknown dtype {entry.get('dtype')!r}")
        if entry["dtype"] not in tflops:
            raise _fail(f"{where}.dtype", f"roofs.gemm_tflops has no {entry['dtype']!r}")
        world = entry.get("world")
        if not isinstance(world, int) or isinstance(world, bool) or world < 2:
            raise _fail(f"{where}.world", f"must be an integer >= 2, got {world!r}")
        for dim in ("m", "n", "k"):
            _int_range(f"{where}.{dim}", entry.get(dim))
        if entry["pattern"] in ROUTED_PATTERNS:
            _int_range(f"{where}.experts", entry.get("experts"))
            for name in ROUTING_RANGES:
                bounds = entry.get(name)
                pair = isinstance(bounds, list) and len(bounds) == 2
                ok = pair and all(_number(v) and v >= 1 for v in bounds) and bounds[0] <= bounds[1]
                if name in entry and not ok:
                    raise _fail(
                        f"{where}.{name}", f"must be [low, high], 1 <= low <= high, got {bounds!r}"
                    )
    nodes = data["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise _fail(f"{source}: nodes", "must be a non-empty list")
    for i, node in enumerate(nodes):
        where = f"{source}: nodes[{i}]"
        if not isinstance(node, dict) or node.get("id") != i:
            raise _fail(where, f"must be an object with id {i}")
        if "schedule" in node:
            if not isinstance(node["schedule"], str) or not node["schedule"]:
                raise _fail(f"{where}.schedule", "must be a non-empty string")
            speedup = node.get("speedup")
            if speedup is not None and not (_number(speedup) and speedup > 0):
                raise _fail(
                    f"{where}.speedup", f"must be a positive number or null, got {speedup!r}"
                )
            continue
        if node.get("feature") not in features:
            raise _fail(
                f"{where}.feature", f"{node.get('feature')!r} is not among the table's features"
            )
        if not _number(node.get("threshold")):
            raise _fail(
                f"{where}.threshold", f"must be a finite number, got {node.get('threshold')!r}"
            )
        for side in ("left", "right"):
            child = node.get(side)
            # Children come after their parent, so every walk ends at a leaf.
            if not isinstance(child, int) or isinstance(child, bool) or not i < child < len(nodes):
                raise _fail(
                    f"{where}.{side}", f"must be a node id in ({i}, {len(nodes)}), got {child!r}"
                )


def _factor(value: int, lo: int, hi: int) -> float:
    return value / hi if value > hi else lo / value


def outside_range(
    ranges: list[dict[str, Any]],
    pattern: str,
    m: int,
    n: int,
    k: int,
    world: int,
    dtype: str,
    experts: int | None,
    routed: dict[str, float] | None = None,
) -> tuple[str | None, tuple[tuple[str, Any, Any, Any, float | None], ...]]:
    """``(why, outside)``: why the problem lies outside the training ranges (None inside) and,
    per field beyond its bounds, ``(field, value, low, high, factor)``. ``routed``: the
    all-to-all's routing features, checked against the bounds the entry has of them."""
    entry = next(
        (
            r
            for r in ranges
            if r["pattern"] == pattern and r["world"] == world and r["dtype"] == dtype
        ),
        None,
    )
    if entry is None:
        covered = ", ".join(sorted(f"{r['pattern']} W={r['world']} {r['dtype']}" for r in ranges))
        why = f"no training problems for {pattern} W={world} {dtype} (the table covers {covered})"
        same = [r for r in ranges if r["pattern"] == pattern]
        worlds = sorted({r["world"] for r in same if r["dtype"] == dtype})
        if worlds:
            lo, hi = worlds[0], worlds[-1]
            factor = _factor(world, lo, hi) if not lo <= world <= hi else None
            return why, (("world", world, lo, hi, factor),)
        dtypes = sorted({r["dtype"] for r in same})
        if dtypes:
            return why, (("dtype", dtype, dtypes[0], dtypes[-1], None),)
        return why, (("pattern", pattern, None, None, None),)
    dims = [("m", m), ("n", n), ("k", k)]
    if pattern in ROUTED_PATTERNS:
        dims.append(("experts", experts))
        dims += [(name, (routed or {})[name]) for name in ROUTING_RANGES if name in entry]
    outside = []
    for dim, value in dims:
        lo, hi = entry[dim]
        if not lo <= value <= hi:
            outside.append((dim, value, lo, hi, _factor(value, lo, hi)))
    if not outside:
        return None, ()
    words = "; ".join(
        f"{d}={v:.4g} is outside the trained range [{lo}, {hi}] ({f:.3g}x beyond)"
        for d, v, lo, hi, f in outside
    )
    return f"{words} for {pattern} W={world} {dtype}", tuple(outside)


# --- JSON tables ------------------------------------------------------------------------------


class Table:
    """A validated table, ready to answer lookups."""

    __slots__ = ("data", "source", "machine", "roofs", "fallback", "safe", "_nodes", "_ranges")

    def __init__(self, data: dict[str, Any], source: str = "table"):
        validate_table(data, source)
        self.data = data
        self.source = source
        self.machine: str = data["machine"]
        self.roofs: dict[str, Any] = data["roofs"]
        self.fallback: str = data["fallback"]["schedule"]
        self.safe: dict[str, dict[str, Any]] = data["safe_default"]
        index = {name: i for i, name in enumerate(TABLE_FEATURES)}
        # (feature index, threshold, left, right) for internal nodes; (-1, speedup, schedule,
        # support) for leaves.
        self._nodes = [
            (-1, n.get("speedup"), n["schedule"], n.get("support", 0))
            if "schedule" in n
            else (index[n["feature"]], float(n["threshold"]), n["left"], n["right"])
            for n in data["nodes"]
        ]
        self._ranges: dict[tuple[str, int, str], dict[str, Any]] = {
            (r["pattern"], r["world"], r["dtype"]): r for r in data["range"]
        }

    def lookup(
        self,
        pattern: str,
        m: int,
        n: int,
        k: int,
        world: int,
        dtype: str = "bf16",
        experts: int | None = None,
        routing: Any = None,
        top_k: int | None = None,
    ) -> Answer:
        """The table's schedule for a problem (all-to-alls: ``routing`` a W x experts table of
        token counts, None for uniform; ``top_k`` experts per token, None for 1); the measured
        safe default outside the training range."""
        dtype = canonical_dtype(dtype)
        check_problem(pattern, m, n, k, world, experts, routing, top_k)
        problem = (pattern, m, n, k, world, dtype, experts, routing, top_k)
        features, why, outside = placed_problem(self.roofs, self.data["range"], problem)
        if why is not None:
            return safe_default_answer(self.safe, self.fallback, pattern, why, outside)
        nodes, path, i = self._nodes, [], 0
        while nodes[i][0] >= 0:
            feature, threshold, left, right = nodes[i]
            value = features[feature]
            below = value <= threshold
            path.append((TABLE_FEATURES[feature], value, "<=" if below else ">", threshold))
            i = left if below else right
        _, speedup, schedule, support = nodes[i]
        reason = f"rule {i} of the {self.machine} table ({support} training problems in its region)"
        return Answer(schedule, speedup, True, i, tuple(path), reason, features)


def placed_problem(
    roofs: dict, ranges: list, problem: tuple[str, int, int, int, int, str, Any, Any, Any]
) -> tuple[tuple, str | None, tuple]:
    """A checked problem's table features (``()`` where the roofs have no figure for its dtype)
    and where it stands against the training ranges (``outside_range``'s ``(why, outside)``):
    what every table format computes before it answers. ``problem``: ``(pattern, m, n, k,
    world, dtype, experts, routing, top_k)``, as :meth:`Table.lookup` takes them."""
    pattern, m, n, k, world, dtype, experts, routing, top_k = problem
    tflops = roofs["gemm_tflops"].get(dtype)
    args = (pattern, m, n, k, world, DTYPE_BYTES[dtype], experts, roofs, tflops, routing, top_k)
    features = table_features(*args) if tflops is not None else ()
    # the routing features close the feature tuple; () out of roofs
    routed = dict(zip(ROUTING_FEATURES, features[-len(ROUTING_FEATURES) :], strict=False))
    why, outside = outside_range(ranges, pattern, m, n, k, world, dtype, experts, routed)
    return features, why, outside


def safe_default_answer(
    safe: dict[str, dict[str, Any]], fallback: str, pattern: str, why: str, outside: tuple
) -> Answer:
    """Outside the training range: the pattern's measured safe default, else the fallback."""
    entry = safe.get(pattern)
    if entry is None:
        reason = f"{why}: no measured safe default for {pattern}; answering the fallback {fallback}"
        return Answer(fallback, 1.0, False, None, (), reason, (), outside)
    reason = (
        f"{why}: answering the measured safe default {entry['schedule']} (mean regret "
        f"{100 * entry['mean_regret']:.1f}% over the {pattern} training problems)"
    )
    return Answer(entry["schedule"], entry.get("speedup"), False, None, (), reason, (), outside)


def load_table(path: str | Path) -> Table:
    """Read and validate a JSON table; :class:`TableError` says what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")  # a binary file: then invalid JSON, below
    except OSError as err:
        raise TableError(f"{path}: cannot read the table ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TableError(
            f"{path}: not valid JSON at line {err.lineno} column {err.colno} ({err.msg}); the file "
            "is corrupt or truncated: re-export or retrain it"
        ) from None
    return Table(data, str(path))
