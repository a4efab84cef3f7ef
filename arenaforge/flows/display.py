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
