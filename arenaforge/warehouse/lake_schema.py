"""The numbered migrations, applied to a DuckLake catalog.

Migrations are written for plain DuckDB (`migrations/NNNN_what.sql`) and keep working on both
layouts. DuckLake refuses PRIMARY KEY / UNIQUE constraints and indexes, so every statement is first
run on a scratch in-memory DuckDB holding the declared schema: a statement that creates a table
with a key is sent to the lake as the same table without the constraint (columns, types, NOT NULL
and defaults as DuckDB parsed them), an index is skipped, anything else (views, ALTERs, data
changes) runs on the lake as written. The scratch schema also tells writers each table's key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import duckdb

from arenaforge.schemas.errors import WarehouseError

_COLUMN_COMMENT = re.compile(r'\s*COMMENT\s+ON\s+COLUMN\s+("[^"]+"|\w+)\.', re.IGNORECASE)

# Created before any migration (migrations may refer to it, e.g. to comment on it).
SCHEMA_MIGRATIONS_DDL = ("CREATE TABLE IF NOT EXISTS schema_migrations "
                         "(version INTEGER NOT NULL, name VARCHAR NOT NULL, applied_at TIMESTAMP DEFAULT current_timestamp)")


class DeclaredSchema:
    """The schema the migrations declare, replayed in memory; keys per table and lake DDL."""

    def __init__(self) -> None:
        self.con = duckdb.connect()
        self.con.execute(SCHEMA_MIGRATIONS_DDL)

    def keys(self) -> dict[str, list[str]]:
        """table -> its PRIMARY KEY (else first UNIQUE) columns."""
        rows = self.con.execute(
            "SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE') ORDER BY constraint_type = 'UNIQUE', constraint_index"
        ).fetchall()
        keys: dict[str, list[str]] = {}
        for table, _, columns in rows:
            keys.setdefault(table, list(columns))
        return keys

    def replay(self, sql: str) -> None:
        """Apply an already-applied migration to the scratch schema only."""
        for statement in self.con.extract_statements(sql):
            self.con.execute(statement.query)

    def lake_statements(self, sql: str) -> list[str]:
        """The statements that apply `sql` to a lake (and apply it to the scratch schema)."""
        out = []
        known: dict[str, tuple[bool, int]] | None = None  # the scratch schema's tables, while no other statement ran
        for statement in self.con.extract_statements(sql):
            if statement.type != duckdb.StatementType.CREATE:
                known = None
                self.con.execute(statement.query)
                if not self._comments_view_column(statement.query):
                    out.append(statement.query)
                continue
            before = known if known is not None else self._tables()  # a CREATE's "after" is the next one's "before"
            self.con.execute(statement.query)
            after = known = self._tables()
            new = [t for t in after if t not in before]
            if any(after[t][1] > before[t][1] for t in before if t in after):
                continue  # CREATE INDEX on an existing table: DuckLake has no indexes
            keys = self.keys() if new else {}
            keyed = [t for t in new if t in keys]
            out.extend(self._create_table(t) for t in keyed)
            if not keyed and not (not new and _declares_key(statement.query)):  # a no-op IF NOT EXISTS
                out.append(statement.query)
        return out

    def column_comments(self) -> dict[tuple[str, str], str]:
        """(table or view, column) -> its COMMENT ON COLUMN text."""
        rows = self.con.execute("SELECT table_name, column_name, comment FROM duckdb_columns() "
                                "WHERE comment IS NOT NULL AND database_name = current_database()").fetchall()
        return {(table, column): comment for table, column, comment in rows}

    def _comments_view_column(self, query: str) -> bool:
        """A COMMENT ON COLUMN of a view: DuckLake 1.5.5 refuses it ("not a table"), so it stays in the
        declared schema only (`declared_column_comments`)."""
        found = _COLUMN_COMMENT.match(query)
        if not found:
            return False
        return bool(self.con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND NOT internal",
                                     [found.group(1).strip('"')]).fetchone()[0])

    def _tables(self) -> dict[str, tuple[bool, int]]:
        rows = self.con.execute("SELECT table_name, has_primary_key, index_count FROM duckdb_tables()").fetchall()
        return {name: (pk, indexes) for name, pk, indexes in rows}

    def _create_table(self, table: str) -> str:
        columns = self.con.execute(f"PRAGMA table_info('{table}')").fetchall()  # cid, name, type, notnull, default, pk
        parts = [f'"{name}" {kind}' + (f" DEFAULT ({default})" if default is not None else "")
                 + (" NOT NULL" if notnull else "") for _, name, kind, notnull, default, _ in columns]
        return f'CREATE TABLE IF NOT EXISTS "{table}" ({", ".join(parts)})'


def _declares_key(query: str) -> bool:
    if not any(word in query.upper() for word in ("PRIMARY", "UNIQUE")):
        return False
    scratch = duckdb.connect()
    try:
        scratch.execute(query)
    except duckdb.Error:
        return False
    return bool(scratch.execute("SELECT count(*) FROM duckdb_constraints() WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')").fetchone()[0])


def apply_to_lake(con: duckdb.DuckDBPyConnection, migrations: Sequence[tuple[int, str, str]]) -> tuple[list[str], dict[str, list[str]]]:
    """Apply pending migrations; (names applied, keys per table). The caller holds the writers' lock.

    All pending migrations go in ONE transaction (a DuckLake commit of DDL costs ~0.2 s, and a new
    warehouse has every migration pending): a failing one leaves the warehouse as it was.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(SCHEMA_MIGRATIONS_DDL)
        done = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
        schema = DeclaredSchema()
        applied = []
        for version, name, sql in migrations:
            if version in done:
                schema.replay(sql)
                continue
            try:
                for statement in schema.lake_statements(sql):
                    con.execute(statement)
            except duckdb.Error as err:
                raise WarehouseError(f"migration {name} failed: {str(err).splitlines()[0]}") from None
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
            applied.append(name)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return applied, schema.keys()


# migration names -> (keys per table, column comments), replayed once per process and migration set
_DECLARED: dict[tuple[str, ...], tuple[dict[str, list[str]], dict[tuple[str, str], str]]] = {}


def _declared(migrations: Sequence[tuple[int, str, str]]) -> tuple[dict[str, list[str]], dict[tuple[str, str], str]]:
    names = tuple(name for _, name, _ in migrations)
    if names not in _DECLARED:
        schema = DeclaredSchema()
        for _, _, sql in migrations:
            schema.replay(sql)
        _DECLARED[names] = (schema.keys(), schema.column_comments())
    return _DECLARED[names]


def declared_keys(migrations: Sequence[tuple[int, str, str]]) -> dict[str, list[str]]:
    """Keys per table the migrations declare."""
    return _declared(migrations)[0]


def declared_column_comments(migrations: Sequence[tuple[int, str, str]]) -> dict[tuple[str, str], str]:
    """(table or view, column) -> comment, as the migrations declare them (view columns included)."""
    return _declared(migrations)[1]
