"""Every option and argument of every `arenaforge` command says what it does and shows its default.

Walks the whole Typer/Click command tree, so a command added later is covered without editing this test;
a check on a small app with one help text missing proves the walk sees what it is there to see."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer


def walk(command: Any, path: str = "arenaforge") -> Iterator[tuple[str, Any]]:
    """(`arenaforge sub cmd`, command) for every command in the tree, groups included (Typer's own click)."""
    yield path, command
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, f"{path} {name}")


def missing_help(app: typer.Typer) -> list[str]:
    """`arenaforge db show --limit` for each option or argument without help text, or an option whose default
    `--help` does not show."""
    found = []
    for path, command in walk(typer.main.get_command(app)):
        for param in command.params:
            option = param.param_type_name == "option"
            name = f"{path} {param.opts[0] if option else param.name.upper()}"
            if not (getattr(param, "help", None) or "").strip():
                found.append(f"{name}: no help text")
            elif option and not param.is_flag and not param.show_default \
                    and param.default is not None:
                found.append(f"{name}: default not shown")
    return found


def test_every_option_has_help_and_shows_its_default() -> None:
    from arenaforge.flows.cli import app

    commands = [path for path, _ in walk(typer.main.get_command(app))]
    assert "arenaforge bench sandbox" in commands and "arenaforge db query" in commands  # the walk reaches leaves
    assert missing_help(app) == []


def test_the_check_sees_an_option_without_help() -> None:
    app = typer.Typer()
    sub = typer.Typer()
    app.add_typer(sub, name="db")

    @sub.command()
    def show(table: str = typer.Argument(..., help="Table."), limit: int = typer.Option(20, help="Rows."),
             where: str = typer.Option("")) -> None:
        """Show rows."""

    @sub.command()
    def query(sql: str = typer.Argument(...), quiet: bool = typer.Option(False, help="No title.")) -> None:
        """Run SQL."""

    assert missing_help(app) == ["arenaforge db query SQL: no help text", "arenaforge db show --where: no help text"]
