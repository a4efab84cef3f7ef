"""Readable terminal output for rows: rich tables, long cells shortened only on screen (or wrapped in full)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def _cell(value: Any, width: int | None) -> str:
    """The cell's text on one line; cut to `width` with an ellipsis unless width is None (full text)."""
    text = "" if value is None else str(value)
    text = text.replace("\n", " ")
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, width: int = 48,
               full: bool = False) -> None:
    """A table when it fits the terminal; otherwise one `column: value` block per row (still readable).

    Cells longer than `width` are cut on screen (the data keeps its full text); `full=True` wraps
    them instead, for summaries that must be read whole.
    """
    cut = None if full else width
    needed = sum(
        min(width, max([len(str(c))] + [len(_cell(r[i], cut)) for r in rows])) + 3 for i, c in enumerate(columns)
    )
    if needed > console.width and len(columns) > 2:
        _print_vertical(columns, rows, title, width=None if full else max(40, console.width - 24))
        return
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v, cut) for v in row))
    console.print(table)


def _print_vertical(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None,
                    width: int | None) -> None:
    if title:
        console.print(f"[bold]{title}[/bold]")
    pad = max(len(c) for c in columns)
    for n, row in enumerate(rows, 1):
        console.print(f"[dim]── row {n} ──[/dim]")
        for col, value in zip(columns, row, strict=False):
            console.print(f"{col.rjust(pad)}  {_cell(value, width)}", markup=False, highlight=False)


# --------------------------------------------------------------------------- machine-readable output
FORMATS = ("table", "csv", "json", "jsonl")
FORMAT_HELP = "table (for reading), csv, json (one array of objects) or jsonl (one object a line)."


def check_format(fmt: str, allowed: Sequence[str] = FORMATS) -> str:
    """`fmt` when it is one of `allowed`; else a one-line user error."""
    from arenaforge.schemas.errors import InputError

    if fmt not in allowed:
        raise InputError(f"--format {fmt!r}: use one of {', '.join(allowed)}")
    return fmt


def _plain(value: Any) -> Any:
    """A JSON value for what DuckDB returns (lists and structs stay nested; dates as ISO text)."""
    import datetime
    import decimal

    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


def print_records(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table",
                  title: str | None = None, **table: Any) -> None:
    """Rows in `fmt`: a readable table (`print_rows`, with `title`), or CSV / JSON / JSON lines on stdout with
    every cell whole (no title: what a script reads is the rows)."""
    import csv
    import json
    import sys

    check_format(fmt)
    if fmt == "table":
        print_rows(columns, rows, title=title, **table)
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([json.dumps(v, default=_plain) if isinstance(v, list | dict) else _csv_cell(v)
                             for v in row])
        return
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    if fmt == "json":
        sys.stdout.write(json.dumps(records, default=_plain, ensure_ascii=False) + "\n")
    else:
        sys.stdout.writelines(json.dumps(r, default=_plain, ensure_ascii=False) + "\n" for r in records)


def _csv_cell(value: Any) -> Any:
    return "" if value is None else _plain(value) if not isinstance(value, str | int | float | bool) else value
