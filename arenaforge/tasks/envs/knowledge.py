"""Knowledge sources for the RL track: tables in an in-memory DuckDB, profiled for QA synthesis.

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

The source's DuckDB connection is private to the caller's thread; every sub-answer the
offline generator produces is the result of a query on it (the SQL is kept as evidence).
"""

from __future__ import annotations

import json
import os
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rejection

SAMPLE_DIR = Path(str(resources.files("arenaforge.tasks.data").joinpath("sample_source")))
_READERS = {".csv": "read_csv_auto", ".parquet": "read_parquet", ".json": "read_json_auto", ".jsonl": "read_json_auto",
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


def load_tables(name: str, paths: list[str | Path], **profile_kw: Any) -> KnowledgeSource:
    """A source from table files (CSV, Parquet, JSON array or JSON-lines), one table per file."""
    source = _new(name)
    for raw in paths:
        path = Path(raw)
        reader = _READERS.get(path.suffix.lower())
        if reader is None or not path.is_file():
            source.close()
            raise InputError(f"cannot load knowledge table {path}: not a CSV/Parquet/JSON file")
        escaped = str(path).replace("'", "''")
        try:
            source.con.execute(f'CREATE TABLE "{_table_name(path)}" AS SELECT * FROM {reader}(\'{escaped}\')')
        except duckdb.Error as err:
            source.rejections.append(_reject(name, path.name, "unreadable_table", str(err).splitlines()[0]))
    return profile(source, **profile_kw)


def load_sample(**profile_kw: Any) -> KnowledgeSource:
    """The project's own small shop source (arenaforge/tasks/data/sample_source)."""
    files = sorted(p for p in SAMPLE_DIR.iterdir() if p.suffix in _READERS)
    return load_tables("sample_shop", files, **profile_kw)


def load_tau2_retail(db_json: str | Path, **profile_kw: Any) -> KnowledgeSource:
    """τ²-bench retail `db.json` flattened into products, variants, users, payment_methods, orders, order_items."""
    path = Path(db_json)
    if path.is_dir():
        path = path / "db.json"
    if not path.is_file():
        raise InputError(f"no tau2 retail db.json at {path}")
    db = json.loads(path.read_text())
    tables: dict[str, list[dict[str, Any]]] = {k: [] for k in
                                               ("products", "variants", "users", "payment_methods", "orders", "order_items")}
    for p in db.get("products", {}).values():
        tables["products"].append({"product_id": p["product_id"], "name": p["name"], "variant_count": len(p.get("variants", {}))})
        for v in p.get("variants", {}).values():
            opts = v.get("options", {})
            tables["variants"].append({
                "item_id": v["item_id"], "product_id": p["product_id"], "price": v.get("price"),
                "available": bool(v.get("available")),
                "options": ", ".join(f"{k} {val}" for k, val in sorted(opts.items())),
                "color": opts.get("color"), "size": opts.get("size"), "material": opts.get("material")})
    for u in db.get("users", {}).values():
        addr = u.get("address", {})
        tables["users"].append({
            "user_id": u["user_id"], "first_name": u["name"]["first_name"], "last_name": u["name"]["last_name"],
            "email": u.get("email"), "city": addr.get("city"), "state": addr.get("state"), "zip": addr.get("zip"),
            "country": addr.get("country"), "order_count": len(u.get("orders", []))})
        for pm in u.get("payment_methods", {}).values():
            tables["payment_methods"].append({"payment_method_id": pm["id"], "user_id": u["user_id"], "source": pm.get("source"),
                                              "brand": pm.get("brand"), "last_four": pm.get("last_four"), "balance": pm.get("balance")})
    line = 0
    for o in db.get("orders", {}).values():
        addr = o.get("address", {})
        pay = sum(h.get("amount", 0) for h in o.get("payment_history", []) if h.get("transaction_type") == "payment")
        tables["orders"].append({"order_id": o["order_id"], "user_id": o["user_id"], "status": o.get("status"),
                                 "city": addr.get("city"), "state": addr.get("state"), "zip": addr.get("zip"),
                                 "item_count": len(o.get("items", [])), "amount_paid": round(pay, 2)})
        for it in o.get("items", []):
            line += 1
            tables["order_items"].append({"line_id": f"L{line:05d}", "order_id": o["order_id"], "item_id": it["item_id"],
                                          "product_id": it["product_id"], "name": it.get("name"), "price": it.get("price")})
    return load_records("tau2_retail", tables, **profile_kw)


def load_records(name: str, tables: dict[str, list[dict[str, Any]]], **profile_kw: Any) -> KnowledgeSource:
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


_SECTION = re.compile(r"Known Infomation:|Known Information:", re.IGNORECASE)
_FACT = re.compile(r"([A-Z][A-Za-z /]{1,40}?):\s*([^.:;]{1,80}?)(?:\.\s|\.$|;|$)")


def load_text_corpus(path: str | Path, limit: int | None = 400, questions: str | Path | None = None,
                     **profile_kw: Any) -> KnowledgeSource:
    """ASTRA knowledge contexts (`context.jsonl`) as `passages` plus one fact table per domain.

    Each context's "Known Information" part is split into `Key: value` facts; a domain's facts
    are pivoted into a table `<domain>_facts` (doc_id -> one column per fact key), whose
    `doc_id` links back to `passages`. Keys most documents lack become NULL-heavy columns and
    are rejected by profiling like any other.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "context.jsonl"
    if not path.is_file():
        raise InputError(f"no knowledge corpus at {path}")
    passages: list[dict[str, Any]] = []
    facts: dict[str, list[dict[str, Any]]] = {}
    with path.open() as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                break
            rec = json.loads(line)
            doc_id = f"DOC{i:05d}"
            domain = re.sub(r"\W+", "_", str(rec.get("domain", "general")).lower()).strip("_") or "general"
            text = str(rec.get("knowledge_corpus", ""))
            passages.append({"doc_id": doc_id, "domain": domain, "text": text[:2000]})
            known = _SECTION.split(text, maxsplit=1)
            if len(known) < 2:
                continue
            body = known[1].split("Information Needed")[0]
            row: dict[str, Any] = {"doc_id": doc_id}
            for key, value in _FACT.findall(body):
                col = re.sub(r"\W+", "_", key.strip().lower()).strip("_")
                if col and col != "doc_id" and col not in row:
                    row[col] = value.strip()
            if len(row) > 1:
                facts.setdefault(domain, []).append(row)
    tables: dict[str, list[dict[str, Any]]] = {"passages": passages}
    for domain, rows in facts.items():
        keys = sorted({k for r in rows for k in r})
        tables[f"{domain}_facts"] = [{k: r.get(k) for k in keys} for r in rows]
    source = load_records("astra_knowledge", tables, **profile_kw)
    if questions is not None and Path(questions).is_file():
        with Path(questions).open() as fh:
            source.seed_questions = [json.loads(line)["question"] for line in fh if line.strip()]
    return source


def default_shared_data() -> Path:
    """Where the third-party data folder is looked for: $ARENAFORGE_SHARED_DATA, else ../shared/data."""
    return Path(os.environ.get("ARENAFORGE_SHARED_DATA") or Path.cwd().parent / "shared" / "data")


def load_source(spec: str, shared_data: str | Path | None = None, **profile_kw: Any) -> KnowledgeSource:
    """A source by name: `sample`, `tau2_retail`, `astra` (needs shared data), or a file/dir of tables."""
    shared = Path(shared_data) if shared_data else default_shared_data()
    if spec == "sample":
        return load_sample(**profile_kw)
    if spec == "tau2_retail":
        return load_tau2_retail(shared / "tau2_retail" / "db.json", **profile_kw)
    if spec == "astra":
        base = shared / "astra_knowledge" / "en"
        return load_text_corpus(base / "context.jsonl", questions=base / "questions.jsonl", **profile_kw)
    path = Path(spec)
    if path.is_dir():
        return load_tables(path.name, sorted(p for p in path.iterdir() if p.suffix.lower() in _READERS), **profile_kw)
    if path.is_file():
        return load_tables(path.stem, [path], **profile_kw)
    raise InputError(f"unknown knowledge source {spec!r}: use sample, tau2_retail, astra or a path to table files")
