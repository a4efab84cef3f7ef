"""A knowledge source: tables in an in-memory DuckDB, profiled for QA synthesis.

A source is a set of tables (CSV, Parquet, JSON or JSON-lines files, τ²-bench retail's
`db.json` flattened, or a text corpus turned into passages + per-domain fact tables). Loading
profiles every table: its key column (unique, non-null), its usable attribute columns, and
the foreign-key links between tables (a column whose values all name rows of another
table's key). What cannot be used becomes a `Rejection` row, never a silent drop:

  no_joinable_columns  a table that links to nothing (kept for single-hop lookups only)
  null_heavy_column    a column that is mostly NULL
  non_ascii_column     a column whose name or most values are not ASCII (questions and
                       tool parameter names are ASCII)
  long_text_column     a text column whose values are too long to be answers
  no_key_column        a table without a unique, non-null column (unusable)

The source's DuckDB connection is private to the caller's thread (other threads get cursors);
every grounded sub-answer is the result of a query on it. Source kinds (sample, tau2_retail, astra,
table files) are one module each in this package (see `__init__.py`).
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rejection

READERS = {".csv": "read_csv_auto", ".parquet": "read_parquet", ".json": "read_json_auto", ".jsonl": "read_json_auto",
            ".ndjson": "read_json_auto"}
_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "DOUBLE", "FLOAT", "DECIMAL", "REAL", "UBIGINT",
            "UINTEGER", "USMALLINT", "UTINYINT")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # DuckDB type name
    numeric: bool
    null_frac: float
    distinct: int


@dataclass
class TableProfile:
    name: str
    rows: int
    key: str | None
    columns: list[Column]
    attributes: list[str] = field(default_factory=list)  # usable answer columns (not the key)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


@dataclass(frozen=True)
class Link:
    """`table.column` holds values of `ref_table.ref_key` (a foreign key)."""

    table: str
    column: str
    ref_table: str
    ref_key: str


@dataclass(eq=False)  # one loaded source is one object: hashable by identity, so caches can be keyed by it
class KnowledgeSource:
    name: str
    con: duckdb.DuckDBPyConnection
    tables: dict[str, TableProfile] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    seed_questions: list[str] = field(default_factory=list)
    _owner: int = field(default_factory=threading.get_ident, repr=False)
    _cursors: threading.local = field(default_factory=threading.local, repr=False)

    _memo: dict[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]]] = field(default_factory=dict, repr=False)
    # data derived from the source by a stage (e.g. a table's rows indexed for tool data), kept with the source
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    MEMO_SIZE = 8192

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of `sql`; safe from any thread (a DuckDB connection is not: other threads get a cursor).

        A source is read-only once loaded, so results are memoised: synthesis asks the same
        lookups again and again (the same entity in many questions, a model's evidence SQL),
        and each DuckDB round trip costs ~1 ms of CPU however small the table.
        """
        key = (sql, tuple(params or ()))
        rows = self._memo.get(key)
        if rows is None:
            rows = self._connection().execute(sql, params or []).fetchall()
            if len(self._memo) >= self.MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = rows
        return list(rows)

    def memoised(self, sql: str, params: list[Any] | None = None) -> bool:
        """Whether `query(sql, params)` would be answered from the memo (no database round trip)."""
        return (sql, tuple(params or ())) in self._memo

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if threading.get_ident() == self._owner:
            return self.con
        cursor = getattr(self._cursors, "con", None)
        if cursor is None:
            cursor = self._cursors.con = self.con.cursor()
        return cursor

    def joinable(self, table: str) -> bool:
        return any(table in (link.table, link.ref_table) for link in self.links)

    def links_from(self, table: str) -> list[Link]:
        return [link for link in self.links if link.table == table]

    def links_to(self, table: str) -> list[Link]:
        return [link for link in self.links if link.ref_table == table]

    def summary(self, sample_rows: int = 2) -> str:
        """Schema text (tables, columns, links, sample rows) for model prompts."""
        lines = []
        for t in self.tables.values():
            cols = ", ".join(f"{c.name} {c.dtype}" for c in t.columns)
            lines.append(f"table {t.name} (key {t.key}; {t.rows} rows): {cols}")
            for row in self.con.execute(f'SELECT * FROM "{t.name}" ORDER BY ALL LIMIT {int(sample_rows)}').fetchall():
                lines.append("  e.g. " + json.dumps([_jsonable(v) for v in row], ensure_ascii=False))
        for link in self.links:
            lines.append(f"link {link.table}.{link.column} -> {link.ref_table}.{link.ref_key}")
        return "\n".join(lines)

    def close(self) -> None:
        self.con.close()


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _ascii_name(text: str) -> bool:
    return text.isascii() and bool(_IDENT.match(text))


def _reject(source: str, subject: str, reason: str, detail: str) -> Rejection:
    return Rejection(stage="knowledge", subject=f"{source}.{subject}", reason=reason, detail=detail)


# --------------------------------------------------------------------------- profiling
def profile(source: KnowledgeSource, max_null_frac: float = 0.5, max_non_ascii_frac: float = 0.5,
            max_answer_chars: int = 120) -> KnowledgeSource:
    """Fill `tables`, `links` and `rejections` from the tables in `source.con`."""
    names = [r[0] for r in source.con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
    source.tables.clear()
    source.links.clear()
    for name in names:
        if not _ascii_name(name):
            source.rejections.append(_reject(source.name, name, "non_ascii_column", f"table name {name!r} is not an ASCII identifier"))
            continue
        t = _profile_table(source, name, max_null_frac, max_non_ascii_frac, max_answer_chars)
        if t is not None:
            source.tables[name] = t
    for t in source.tables.values():
        for c in t.columns:
            if c.name not in t.attributes and c.name != t.key:
                continue
            for ref in source.tables.values():
                if ref.name != t.name and ref.key is not None and _is_foreign_key(source.con, t.name, c, ref):
                    source.links.append(Link(t.name, c.name, ref.name, ref.key))
    for t in source.tables.values():
        if not source.joinable(t.name):
            source.rejections.append(_reject(
                source.name, t.name, "no_joinable_columns",
                f"table {t.name} has no column linking it to another table; used for single-hop questions only"))
    return source


def _profile_table(source: KnowledgeSource, name: str, max_null: float, max_non_ascii: float,
                   max_answer_chars: int) -> TableProfile | None:
    con = source.con
    rows = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
    described = con.execute(f'DESCRIBE "{name}"').fetchall()
    columns: list[Column] = []
    usable: list[str] = []
    for col_name, dtype, *_ in described:
        q = f'"{col_name}"' if col_name.replace('"', "") == col_name else None
        if q is None:
            continue
        nulls, distinct = con.execute(f'SELECT count(*) FILTER (WHERE {q} IS NULL), count(DISTINCT {q}) FROM "{name}"').fetchone()
        null_frac = nulls / rows if rows else 1.0
        numeric = str(dtype).split("(")[0] in _NUMERIC
        column = Column(col_name, str(dtype), numeric, null_frac, distinct)
        if not _ascii_name(col_name):
            source.rejections.append(_reject(source.name, f"{name}.{col_name}", "non_ascii_column",
                                             f"column name {col_name!r} is not an ASCII identifier"))
            continue
        columns.append(column)
        if null_frac > max_null:
            source.rejections.append(_reject(source.name, f"{name}.{col_name}", "null_heavy_column",
                                             f"{null_frac:.0%} of {rows} values are NULL (limit {max_null:.0%})"))
            continue
        if not numeric and rows:
            non_ascii = con.execute(
                f'SELECT count(*) FILTER (WHERE NOT regexp_matches(CAST({q} AS VARCHAR), \'^[\\x00-\\x7F]*$\')) '
                f'FROM "{name}" WHERE {q} IS NOT NULL').fetchone()[0]
            if non_ascii / max(1, rows - nulls) > max_non_ascii:
                source.rejections.append(_reject(source.name, f"{name}.{col_name}", "non_ascii_column",
                                                 f"{non_ascii} of {rows - nulls} values are not ASCII"))
                continue
        if str(dtype).startswith(("STRUCT", "MAP")) or str(dtype).endswith("[]"):
            continue
        if not numeric and rows:
            longest = con.execute(f'SELECT max(length(CAST({q} AS VARCHAR))) FROM "{name}"').fetchone()[0] or 0
            if longest > max_answer_chars:
                source.rejections.append(_reject(source.name, f"{name}.{col_name}", "long_text_column",
                                                 f"values up to {longest} characters are too long to be answers"))
                continue
        usable.append(col_name)
    key = _pick_key(name, columns, usable, rows)
    if key is None:
        source.rejections.append(_reject(source.name, name, "no_key_column",
                                         f"table {name} has no unique, non-null ASCII column to look rows up by"))
        return None
    attributes = [c for c in usable if c != key and next(x for x in columns if x.name == c).distinct >= 2]
    return TableProfile(name=name, rows=rows, key=key, columns=columns, attributes=attributes)


def _pick_key(table: str, columns: list[Column], usable: list[str], rows: int) -> str | None:
    candidates = [c for c in columns if c.name in usable and c.null_frac == 0 and c.distinct == rows and rows > 0]
    if not candidates:
        return None
    singular = table[:-1] if table.endswith("s") else table

    def rank(c: Column) -> tuple[int, int]:
        if c.name in (f"{singular}_id", f"{table}_id"):
            return (0, columns.index(c))
        if c.name.endswith("_id") or c.name == "id":
            return (1, columns.index(c))
        return (2 if not c.numeric else 3, columns.index(c))

    return min(candidates, key=rank).name


def _is_foreign_key(con: duckdb.DuckDBPyConnection, table: str, column: Column, ref: TableProfile) -> bool:
    if column.distinct < 2 or column.null_frac > 0.5:
        return False
    ref_key = ref.column(ref.key)  # type: ignore[arg-type]
    if column.numeric != ref_key.numeric:
        return False
    name_hint = column.name == ref.key or column.name.endswith("_id")
    if not name_hint:
        return False
    missing = con.execute(
        f'SELECT count(*) FROM (SELECT DISTINCT CAST("{column.name}" AS VARCHAR) v FROM "{table}" '
        f'WHERE "{column.name}" IS NOT NULL) a WHERE v NOT IN (SELECT CAST("{ref.key}" AS VARCHAR) FROM "{ref.name}")'
    ).fetchone()[0]
    return missing == 0


# --------------------------------------------------------------------------- loaders
def _new(name: str) -> KnowledgeSource:
    return KnowledgeSource(name=name, con=duckdb.connect(":memory:"))


def _table_name(path: Path) -> str:
    stem = path.name.split(".")[0]
    ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
    return re.sub(r"\W+", "_", ascii_stem).strip("_").lower() or "table"


def from_files(name: str, paths: list[str | Path], **profile_kw: Any) -> KnowledgeSource:
    """A source from table files (CSV, Parquet, JSON array or JSON-lines), one table per file."""
    source = _new(name)
    for raw in paths:
        path = Path(raw)
        reader = READERS.get(path.suffix.lower())
        if reader is None or not path.is_file():
            source.close()
            raise InputError(f"cannot load knowledge table {path}: not a CSV/Parquet/JSON file")
        escaped = str(path).replace("'", "''")
        try:
            source.con.execute(f'CREATE TABLE "{_table_name(path)}" AS SELECT * FROM {reader}(\'{escaped}\')')
        except duckdb.Error as err:
            source.rejections.append(_reject(name, path.name, "unreadable_table", str(err).splitlines()[0]))
    return profile(source, **profile_kw)


def from_records(name: str, tables: dict[str, list[dict[str, Any]]], **profile_kw: Any) -> KnowledgeSource:
    """A source from in-memory rows (one list of dicts per table), via Arrow."""
    import pyarrow as pa

    source = _new(name)
    for table, rows in tables.items():
        if not rows:
            continue
        arrow = pa.Table.from_pylist(rows)
        source.con.register("_rows", arrow)
        source.con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM _rows')
        source.con.unregister("_rows")
    return profile(source, **profile_kw)
