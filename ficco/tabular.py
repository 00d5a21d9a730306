"""CSV files users give ficco (shapes, profile frames): read strictly, every error naming the
file and, for a bad row, its line.

A CSV refused here would otherwise fail later with a message that names neither (pandas'
"No columns to parse from file" for an empty file, a codec error for a binary one) or be read
wrong: pandas takes a row with one field too many as an index column plus shifted fields.
So a file is text (UTF-8, no NUL byte), has a header row, and every row has as many fields as
the header; blank lines are skipped.

Pure Python (the ``csv`` module).
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Callable
from pathlib import Path

from ficco.validate import InputError


def _text(field: str, path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InputError(field, str(path), f"cannot be read ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(
            field, str(path), f"is not a text CSV (byte {err.start} is not UTF-8)"
        ) from None
    if "\x00" in text:
        raise InputError(
            field, str(path), f"is not a text CSV (a NUL byte at offset {text.index(chr(0))})"
        )
    return text


def csv_rows(
    field: str, path: str | Path, *, expect: str
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header of the CSV at ``path`` and its rows as ``(line number, {column: cell})``.

    InputError naming ``field`` (the option that gave the file) and the file when it cannot
    be read, is not text, is empty (``expect`` says what its header should hold) or repeats a
    column, or (bad input too) naming the file and the line of a row whose field count
    differs from the header's, or that the csv module cannot parse."""
    path = Path(path)
    text = _text(field, path)
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue  # a blank line
            if header is None:
                header = [c.strip() for c in cells]
                repeated = sorted({c for c in header if header.count(c) > 1})
                if repeated:
                    raise InputError(
                        field, str(path), f"its header repeats the column(s) {repeated}"
                    )
                continue
            if len(cells) != len(header):
                raise InputError(
                    field,
                    None,
                    f"{path}: line {reader.line_num}: {len(cells)} fields, the header has "
                    f"{len(header)} ({','.join(header)})",
                )
            rows.append((reader.line_num, dict(zip(header, cells, strict=True))))
    except csv.Error as err:
        raise InputError(
            field, None, f"{path}: line {reader.line_num}: not valid CSV ({err})"
        ) from None
    if header is None:
        raise InputError(field, str(path), f"is empty; it needs a header row ({expect})")
    return header, rows


class ExtraColumnsWarning(UserWarning):
    """A CSV has columns ficco does not read (ignored)."""


def ignore_columns(
    field: str, path: str | Path, unknown: list[str], notify: Callable[[str], None] | None
) -> None:
    """Say once that the columns ``unknown`` of the CSV at ``path`` are ignored: a line to
    ``notify``, or an :class:`ExtraColumnsWarning` (None). Nothing when there are none."""
    if not unknown:
        return
    line = f"{field}: {path}: ignoring the column(s) {', '.join(unknown)}"
    if notify is None:
        warnings.warn(line, ExtraColumnsWarning, stacklevel=3)
    else:
        notify(line)
