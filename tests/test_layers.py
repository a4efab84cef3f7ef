"""Imports point one way (docs/ARCHITECTURE.md): a package may import only the ones on its row."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT = {"flows", "tasks", "environments", "schemas", "warehouse"}
ALLOWED = {
    "flows": {"flows", "tasks", "schemas", "warehouse", "environments"},
    "tasks": {"tasks", "environments", "warehouse", "schemas"},
    "environments": {"environments", "schemas"},
    "warehouse": {"warehouse", "schemas"},
    "schemas": {"schemas"},
}
FORBIDDEN_THIRD_PARTY = {"environments": {"duckdb", "prefect"}, "tasks": {"prefect"}, "warehouse": {"prefect"}, "schemas": {"prefect", "duckdb"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package):
    bad = []
    for path in (REPO / package).rglob("*.py"):
        imported = _imports(path)
        for name in imported & PROJECT - ALLOWED[package]:
            bad.append(f"{path.relative_to(REPO)} imports {name}")
        for name in imported & FORBIDDEN_THIRD_PARTY.get(package, set()):
            bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, "\n".join(bad)
