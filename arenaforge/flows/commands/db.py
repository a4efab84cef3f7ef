"""`arenaforge db`: list, browse, query and export the DuckDB warehouse."""

from __future__ import annotations

import typer

from arenaforge.flows.context import state
from arenaforge.flows.display import console, print_rows
from arenaforge.schemas.errors import InputError

app = typer.Typer(help="Browse, query and export the DuckDB warehouse.", no_args_is_help=True)


@app.command()
def tables(ctx: typer.Context) -> None:
    """List every table and view with its row count and what it holds."""
    from arenaforge.warehouse.reports import relation_comments

    wh = state(ctx).warehouse()
    about = relation_comments(wh)
    rows = [(name, kind, wh.count(name), about.get(name, "")) for name, kind in wh.relations()]
    print_rows(["name", "kind", "rows", "about"], rows, title=str(wh.path), width=max(24, console.width - 48))


@app.command()
def describe(ctx: typer.Context, table: str = typer.Argument(..., help="Table or view.")) -> None:
    """The columns of a table or view: type and comment."""
    from arenaforge.warehouse.reports import relation_columns, relation_comments

    wh = state(ctx).warehouse()
    print_rows(["column", "type", "about"], relation_columns(wh, table),
               title=f"{table}: {relation_comments(wh).get(table, '')}", full=True)


@app.command()
def show(
    ctx: typer.Context,
    table: str = typer.Argument(..., help="Table or view; `environments` shows the browsing view v_environments."),
    where: str = typer.Option("", "--where", "-w", help="SQL filter, e.g. \"verified AND tools > 3\"."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="Rows to print."),
    run: str = typer.Option(None, "--run", help="Only rows written by this run (its run id)."),
) -> None:
    """Print rows of a table or view (its browsing view v_<table> when one exists); long cells are cut on screen."""
    from arenaforge.warehouse.reports import relation_total

    wh = state(ctx).warehouse()
    known = {n for n, _ in wh.relations()}
    name = f"v_{table}" if f"v_{table}" in known else table
    if run:
        where = f"run_id = '{run.replace(chr(39), '')}'" + (f" AND ({where})" if where else "")
    total = relation_total(wh, name, where)
    sql = f'SELECT * FROM "{name}"' + (f" WHERE {where}" if where else "") + f" LIMIT {limit}"
    columns, rows = wh.query(sql)
    more = "; --limit N shows more" if total > len(rows) else ""
    print_rows(columns, rows, title=f"{name}: {len(rows)} of {total} rows{' matching' if where else ''}{more}")


@app.command()
def query(ctx: typer.Context, sql: str = typer.Argument(..., help="Any DuckDB SQL.")) -> None:
    """Run SQL against the warehouse and print the result."""
    columns, rows = state(ctx).warehouse().query(sql)
    if columns:
        print_rows(columns, rows, width=80)
    else:
        console.print("ok")


@app.command()
def export(
    ctx: typer.Context,
    table: str = typer.Argument(..., help="Table or view to export."),
    format: str = typer.Option("parquet", "--format", "-f", help="parquet or jsonl."),
    out: str = typer.Option(None, "--out", "-o", help="Destination file (default out/<table>.<format>)."),
    where: str = typer.Option("", "--where", "-w", help="SQL filter."),
) -> None:
    """Export a table or view to Parquet or JSONL."""
    from arenaforge.warehouse.exports import export_relation

    if format not in ("parquet", "jsonl"):
        raise InputError(f"unknown format {format!r}; use parquet or jsonl")
    path = export_relation(state(ctx).warehouse(), table, format, out, where)  # type: ignore[arg-type]
    console.print(f"wrote {path}")


@app.command()
def migrate(ctx: typer.Context) -> None:
    """Apply pending migrations (every command does this on first use)."""
    wh = state(ctx).warehouse()
    with wh.connect() as con:
        applied = con.execute("SELECT name FROM schema_migrations ORDER BY version").fetchall()
    console.print("\n".join(name for (name,) in applied))
