"""Answer "which schedule?" from an exported ficco table, with the standard library only.

This module and its problem side, ``lookup_features`` (the problem's checks and features),
need nothing of ficco (nor numpy, torch or scikit-learn): a runtime may copy these two files
and call them::

    from lookup import load_table
    table = load_table("schedules/h200x2/table.json")
    answer = table.lookup("ag_gemm", m=8192, n=28672, k=8192, world=2, dtype="bf16")
    answer.schedule, answer.speedup, answer.reason

A table (JSON, ``format: ficco.schedule-table``, ``schema_version: 2``) holds:

``roofs``         the machine constants the predicted-time features use;
``features``      the feature names it uses, among ``TABLE_FEATURES``;
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

The features (``lookup_features.table_features``, in ``lookup_features.TABLE_FEATURES``
order) are quantities computed from the problem; for the all-to-all patterns a lookup also
takes the routing (``routing=``, a W x experts table of token counts) and the experts per token
(``top_k=``), else assumes uniform routing, top-1 (``lookup_features`` says more). A table
lists the features it was trained on (any of ``TABLE_FEATURES``: tables written before the
routing features still load) and, for the all-to-alls, may bound ``top_k`` and the two
imbalances in its ``range``. A CSV export of the same table (one row per rule, -1 meaning
"any", first match wins) is read by ``ficco.export.lookup_csv.load_csv_table``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

try:  # inside ficco
    from ficco.export import lookup_features
except ImportError:  # copied beside lookup_features.py, without ficco
    import lookup_features  # type: ignore[no-redef]

FORMAT = "ficco.schedule-table"
SCHEMA_VERSION = 2

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
    if not listed or not set(features) <= set(lookup_features.TABLE_FEATURES):
        raise _fail(
            f"{source}: features",
            f"must be distinct names among the features this reader computes "
            f"{list(lookup_features.TABLE_FEATURES)!r}, got {features!r}",
        )
    fallback = data["fallback"]
    if not isinstance(fallback, dict) or not isinstance(fallback.get("schedule"), str):
        raise _fail(f"{source}: fallback", "must be an object with a 'schedule' string")
    safe = data["safe_default"]
    if not isinstance(safe, dict):
        raise _fail(f"{source}: safe_default", "must be an object mapping patterns to entries")
    for pattern, entry in safe.items():
        where = f"{source}: safe_default.{pattern}"
        if pattern not in lookup_features.PATTERNS:
            raise _fail(
                where, f"unknown pattern {pattern!r}; expected one of {lookup_features.PATTERNS}"
            )
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
        if entry.get("pattern") not in lookup_features.PATTERNS:
            raise _fail(f"{where}.pattern", f"unknown pattern {entry.get('pattern')!r}")
        if entry.get("dtype") not in lookup_features.DTYPE_BYTES:
            raise _fail(f"{where}.dtype", f"unknown dtype {entry.get('dtype')!r}")
        if entry["dtype"] not in tflops:
            raise _fail(f"{where}.dtype", f"roofs.gemm_tflops has no {entry['dtype']!r}")
        world = entry.get("world")
        if not isinstance(world, int) or isinstance(world, bool) or world < 2:
            raise _fail(f"{where}.world", f"must be an integer >= 2, got {world!r}")
        for dim in ("m", "n", "k"):
            _int_range(f"{where}.{dim}", entry.get(dim))
        if entry["pattern"] in lookup_features.ROUTED_PATTERNS:
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
    if pattern in lookup_features.ROUTED_PATTERNS:
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
        index = {name: i for i, name in enumerate(lookup_features.TABLE_FEATURES)}
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
        problem = (pattern, m, n, k, world, dtype, experts, routing, top_k)
        _, features, why, outside = placed_problem(self.roofs, self.data["range"], problem)
        if why is not None:
            return safe_default_answer(self.safe, self.fallback, pattern, why, outside)
        nodes, path, i = self._nodes, [], 0
        while nodes[i][0] >= 0:
            feature, threshold, left, right = nodes[i]
            value = features[feature]
            below = value <= threshold
            name = lookup_features.TABLE_FEATURES[feature]
            path.append((name, value, "<=" if below else ">", threshold))
            i = left if below else right
        _, speedup, schedule, support = nodes[i]
        reason = f"rule {i} of the {self.machine} table ({support} training problems in its region)"
        return Answer(schedule, speedup, True, i, tuple(path), reason, features)


class Placed(NamedTuple):
    """Where a problem stands before a table answers it (:func:`placed_problem`)."""

    dtype: str
    """Its dtype's canonical name."""
    features: tuple[float, ...]
    """Its table features (``()`` where the roofs have no figure for its dtype)."""
    why: str | None
    """Why it lies outside the training ranges (None inside)."""
    outside: tuple[tuple[str, Any, Any, Any, float | None], ...]
    """Per field beyond its bounds, ``(field, value, low, high, factor)``."""


def placed_problem(
    roofs: dict, ranges: list, problem: tuple[str, int, int, int, int, str, Any, Any, Any]
) -> Placed:
    """The problem checked (ValueError naming the field) and placed against the roofs and the
    training ranges: what every table format computes before it answers. ``problem``:
    ``(pattern, m, n, k, world, dtype, experts, routing, top_k)``, as :meth:`Table.lookup`
    takes them."""
    pattern, m, n, k, world, dtype, experts, routing, top_k = problem
    dtype = lookup_features.canonical_dtype(dtype)
    lookup_features.check_problem(pattern, m, n, k, world, experts, routing, top_k)
    tflops = roofs["gemm_tflops"].get(dtype)
    features = ()
    if tflops is not None:
        b = lookup_features.DTYPE_BYTES[dtype]
        args = (pattern, m, n, k, world, b, experts, roofs, tflops, routing, top_k)
        features = lookup_features.table_features(*args)
    # the routing features close the feature tuple; () out of roofs
    names = lookup_features.ROUTING_FEATURES
    routed = dict(zip(names, features[-len(names) :], strict=False))
    why, outside = outside_range(ranges, pattern, m, n, k, world, dtype, experts, routed)
    return Placed(dtype, features, why, outside)


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
