"""Answer "which schedule?" from the CSV export of a ficco table (standard library only).

One row per rule, ``-1`` meaning "any", first matching row wins; the features are computed
by ``ficco.export.lookup_features.table_features`` (copy ``lookup.py`` and
``lookup_features.py`` beside this file to use it without ficco).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

try:  # inside ficco
    from ficco.export import lookup as json_lookup
    from ficco.export import lookup_features
except ImportError:  # copied beside lookup.py and lookup_features.py, without ficco
    import lookup as json_lookup  # type: ignore[no-redef]
    import lookup_features  # type: ignore[no-redef]

Answer, TableError = json_lookup.Answer, json_lookup.TableError


class CsvTable:
    """A CSV export: one row per rule, ``-1`` meaning "any", first matching row wins.

        Columns: ``pattern, dtype, world``, then ``<feature>_min/_max`` (integers, inclusive) and
        ``<feature>_gt/_le`` (real features: greater than / at most), then ``schedule, speedup,
        support, rule``. Comment lines (``#``) carry the machine, schema version, roofs, fallback,
    the per-pattern safe defaults and the training ranges (JSON).
    """

    __slots__ = ("machine", "roofs", "fallback", "safe", "ranges", "rows", "source")

    def __init__(self, text: str, source: str = "table.csv"):
        self.source = source
        meta: dict[str, str] = {}
        body = []
        for line in text.splitlines():
            if line.startswith("#"):
                key, sep, value = line[1:].partition(":")
                if sep:
                    meta[key.strip()] = value.strip()
            elif line.strip():
                body.append(line)
        if meta.get("format") != json_lookup.FORMAT:
            raise TableError(f"{source}: format: not a ficco schedule table CSV")
        if meta.get("schema_version") != str(json_lookup.SCHEMA_VERSION):
            raise TableError(
                f"{source}: schema_version: this CSV has version {meta.get('schema_version')!r}, "
                f"this reader reads {json_lookup.SCHEMA_VERSION}"
            )
        try:
            self.roofs = json.loads(meta["roofs"])
            self.machine = meta["machine"]
            self.fallback = meta["fallback"]
            self.safe = json.loads(meta["safe_default"])
            self.ranges = json.loads(meta["range"])
        except (KeyError, json.JSONDecodeError) as err:
            raise TableError(f"{source}: header comments: missing or bad {err}") from None
        self.rows = list(csv.DictReader(io.StringIO("\n".join(body))))

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
        """As ``ficco.export.lookup.Table.lookup``."""
        problem = (pattern, m, n, k, world, dtype, experts, routing, top_k)
        dtype, features, why, outside = json_lookup.placed_problem(self.roofs, self.ranges, problem)
        if why is not None:  # as the JSON table: outside the training range, the safe default
            return json_lookup.safe_default_answer(self.safe, self.fallback, pattern, why, outside)
        values = dict(zip(lookup_features.TABLE_FEATURES, features, strict=False))  # () no roofs
        for number, row in enumerate(self.rows):
            if row["pattern"] != pattern or row["dtype"] != dtype or int(row["world"]) != world:
                continue
            if _row_matches(row, values):
                speedup = float(row["speedup"]) if row["speedup"] else None
                return Answer(row["schedule"], speedup, True, number, (), f"row {number}", features)
        # rows are the leaves cut to the training ranges: a problem inside a range lands in
        # one; should none match, answer as outside the range rather than guess
        why = f"no row of {self.source} matches {pattern} {dtype} W={world}"
        return json_lookup.safe_default_answer(self.safe, self.fallback, pattern, why, outside)


def _row_matches(row: dict[str, str], values: dict[str, float]) -> bool:
    for column, bound in row.items():
        if bound in ("", "-1") or column in ("pattern", "dtype", "world"):
            continue
        feature, _, kind = column.rpartition("_")
        if feature not in values:
            continue
        value = values[feature]
        if kind == "min" and value < int(bound):
            return False
        if kind == "max" and value > int(bound):
            return False
        if kind == "gt" and not value > float(bound):
            return False
        if kind == "le" and not value <= float(bound):
            return False
    return True


def load_csv_table(path: str | Path) -> CsvTable:
    path = Path(path)
    try:
        return CsvTable(path.read_text(), str(path))
    except OSError as err:
        raise TableError(f"{path}: cannot read the table ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise TableError(f"{path}: not a CSV text file (byte {err.start} is not UTF-8)") from None
