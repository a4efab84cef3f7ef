"""Answers as text: how a source value is written as an answer, how two answers compare, entity words."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any


def fmt_value(value: Any) -> str | None:
    """A source value as answer text (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (float, Decimal)):
        f = float(value)
        return str(int(f)) if f.is_integer() else f"{f:.2f}".rstrip("0").rstrip(".")
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


def entity(table: str) -> str:
    words = table.replace("_", " ")
    if words.endswith("ies"):
        return words[:-3] + "y"
    return words[:-1] if words.endswith("s") and not words.endswith("ss") else words


def human(column: str) -> str:
    return column.replace("_", " ")


def is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def same_answer(a: str, b: str) -> bool:
    """Equal as numbers (within 1e-9) or as case-folded text."""
    if is_number(a) and is_number(b):
        return abs(float(a) - float(b)) < 1e-9
    return a.strip().casefold() == b.strip().casefold()
