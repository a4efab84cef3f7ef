"""Readable terminal output for rows: rich tables with long cells shortened."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def _cell(value: Any, width: int) -> str:
    text = "" if value is None else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, width: int = 48) -> None:
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v, width) for v in row))
    console.print(table)
