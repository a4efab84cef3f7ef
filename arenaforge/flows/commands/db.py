"""`arenaforge db`: list, browse, query and export the DuckDB warehouse."""

from __future__ import annotations

import typer

from arenaforge.flows.context import state
from arenaforge.flows.display import FORMAT_HELP, check_format, console, print_records, print_rows
from arenaforge.schemas.errors import InputError
from arenaforge.warehouse.extensions import DUCKDB_VERSION

app = typer.Typer(help="Browse, query and export the DuckDB warehouse.", no_args_is_help=True)


@app.command()
def tables(ctx: typer.Context, fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP)) -> None:
    """List every table and view with its row count and what it holds."""
    from arenaforge.warehouse.reports import relation_comments

    check_format(fmt)
    wh = state(ctx).warehouse()
    about = relation_comments(wh)
    rows = [(name, kind, wh.count(name), about.get(name, "")) for name, kind in wh.relations()]
    print_records(["name", "kind", "rows", "about"], rows, fmt, title=str(wh.path),
                  width=max(24, console.width - 48))


@app.command()
def describe(
    ctx: typer.Context,
    table: str = typer.Argument(..., help="Table or view."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """The columns of a table or view: type and comment."""
    from arenaforge.warehouse.reports import relation_columns, relation_comments

    check_format(fmt)
    wh = state(ctx).warehouse()
    print_records(["column", "type", "about"], relation_columns(wh, table), fmt,
                  title=f"{table}: {relation_comments(wh).get(table, '')}", full=True)


@app.command()
def show(
    ctx: typer.Context,
    table: str = typer.Argument(..., help="Table or view; `environments` shows the browsing view v_environments."),
    where: str = typer.Option("", "--where", "-w", help="SQL filter, e.g. \"verified AND tools > 3\"."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="Rows to print."),
    run: str = typer.Option(None, "--run", help="Only rows written by this run (its run id); default: every run."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Print rows of a table or view (its browsing view v_<table> when one exists); long cells are cut on screen
    (in the table format only)."""
    from arenaforge.warehouse.reports import browsing_name, relation_page

    check_format(fmt)
    wh = state(ctx).warehouse()
    page = relation_page(wh, browsing_name(wh, table), where, run, limit)
    more = "; --limit N shows more" if page.total > len(page.rows) else ""
    matching = " matching" if where or run else ""
    print_records(page.columns, page.rows, fmt,
                  title=f"{page.name}: {len(page.rows)} of {page.total} rows{matching}{more}")


@app.command()
def query(
    ctx: typer.Context,
    sql: str = typer.Argument(..., help="Any DuckDB SQL."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Run SQL against the warehouse and print the result."""
    check_format(fmt)
    columns, rows = state(ctx).warehouse().query(sql)
    if columns or fmt != "table":
        print_records(columns, rows, fmt, width=80)
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
def migrate(
    ctx: typer.Context,
    from_file: str = typer.Option(None, "--from", help="A single-file warehouse (.duckdb) to copy into this one."),
) -> None:
    """Apply pending migrations; with --from, copy a single-file warehouse into this (DuckLake) one."""
    wh = state(ctx).warehouse()
    if from_file:
        from arenaforge.warehouse.legacy import import_single_file

        if wh.layout != "ducklake":
            raise InputError(f"{wh.path} is a single DuckDB file; pass a new directory with --db, e.g. --db ./arenaforge.lake")
        done = import_single_file(from_file, wh)
        rows = [(table, n) for table, n in done["rows_copied"].items() if n]
        print_rows(["table", "rows copied"], rows, title=f"{done['from']} -> {done['to']}")
        if done["tables_skipped"]:
            console.print(f"skipped (no such table here): {', '.join(done['tables_skipped'])}")
        return
    applied = wh.migrate()
    console.print("\n".join(wh.applied_migrations()) + (f"\n(applied now: {', '.join(applied)})" if applied else ""))


@app.command()
def compact(
    ctx: typer.Context,
    older_than_hours: float = typer.Option(24.0, "--older-than-hours", min=0, help=(
        "Drop snapshots (and files only they use) from before the UTC day this many hours ago; "
        "readers holding an older snapshot would lose its files.")),
) -> None:
    """Maintenance: merge small Parquet files, flush rows inlined in the catalog, drop expired snapshots."""
    wh = state(ctx).warehouse()
    done = wh.compact(older_than_hours)
    if "before" in done:
        keys = list(done["before"])
        print_rows(["", *keys], [("before", *done["before"].values()), ("after", *done["after"].values())],
                   title=f"compacted {wh.path}")
    else:
        console.print(f"{wh.path}: single DuckDB file, checkpointed")


@app.command(help=(
    f"Open the warehouse read-only in the DuckDB CLI (safe while flows write). Needs the DuckDB CLI v{DUCKDB_VERSION} "
    f"(PyPI duckdb-cli=={DUCKDB_VERSION}, installed with arenaforge): the DuckLake and catalog extensions load only "
    "into the DuckDB version they were built for; another version is refused in one line."))
def cli(
    ctx: typer.Context,
    print_only: bool = typer.Option(False, "--print", help="Print the shell command instead of running it."),
) -> None:
    import os
    import shlex

    from arenaforge.warehouse.extensions import cli_binary

    args = [cli_binary(), *state(ctx).warehouse().cli_args()]
    if print_only:
        typer.echo(shlex.join(args))
        return
    os.execv(args[0], args)
