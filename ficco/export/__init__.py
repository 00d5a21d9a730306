"""Tables runtimes load: JSON (the source), CSV rules, a generated C header, and a
dependency-free Python lookup (``ficco.export.lookup``), plus ``recommend``.

Importing this package stays light (standard library and ficco's pure-Python modules); the
training side (``ficco.export.build``) is imported on first use.
"""

from __future__ import annotations

from importlib import import_module

from ficco.export.lookup import Answer, Table, TableError, load_table
from ficco.export.lookup_csv import CsvTable, load_csv_table

_LAZY = {
    "Recommendation": "ficco.export.recommend",
    "TableNotFound": "ficco.export.recommend",
    "recommend": "ficco.export.recommend",
    "schedules_dir": "ficco.export.recommend",
    "table_path": "ficco.export.recommend",
    "to_csv": "ficco.export.formats",
    "to_header": "ficco.export.formats",
    "to_json": "ficco.export.formats",
    "build_table": "ficco.export.build",
    "train_table": "ficco.export.build",
    "write_table": "ficco.export.build",
}

__all__ = ["Answer", "CsvTable", "Table", "TableError", "load_csv_table", "load_table", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ficco.export' has no attribute {name!r}")
