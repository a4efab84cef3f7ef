"""Imports point one way (docs/ARCHITECTURE.md): a package may import only the ones on its row."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "arenaforge"
LAYERS = {"flows", "benchmarks", "testing", "tracks", "services", "environments", "schemas", "warehouse"}
ALLOWED = {
    "flows": {"flows", "benchmarks", "tracks", "services", "schemas", "warehouse", "environments"},
    # benchmarks measure anything below flows, with test doubles where something cannot run here
    "benchmarks": {"benchmarks", "testing", "tracks", "services", "environments", "warehouse", "schemas"},
    # test doubles (arenaforge/testing/) serve benchmarks and tests; the product never imports them
    "testing": {"testing", "tracks", "services", "environments", "warehouse", "schemas"},
    "tracks": {"tracks", "services", "environments", "warehouse", "schemas"},
    "services": {"services", "environments", "warehouse", "schemas"},
    "environments": {"environments", "schemas"},
    "warehouse": {"warehouse", "schemas"},
    "schemas": {"schemas"},
}
FORBIDDEN_THIRD_PARTY = {"environments": {"duckdb", "prefect"}, "benchmarks": {"prefect"}, "tracks": {"prefect"},
                         "services": {"prefect"}, "warehouse": {"prefect"}, "schemas": {"prefect", "duckdb"}}
_MODULE_PATH = re.compile(r"arenaforge(\.\w+)+")


def _module_path(node: ast.expr) -> str | None:
    """The module path a string (or an f-string's literal start, up to its first hole) names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rstrip(".") or None
    return None


def _imported_modules(path: Path) -> set[str]:
    """Dotted paths a module imports: import statements (`from a.b import c` counts as `a.b.c`),
    `importlib.import_module(...)` / `import_module(...)` / `__import__(...)` calls whose argument spells its path, and
    any other string that is a module path (`resources.files("arenaforge...")`, a class path handed to verl)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        named = _module_path(node) if isinstance(node, (ast.Constant, ast.JoinedStr)) else None
        if named and _MODULE_PATH.fullmatch(named.split(":")[0]):
            found.add(named.split(":")[0])
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and node.args
              and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")):
            named = _module_path(node.args[0])
            if named:
                found.add(named)
    return found


def _imports(path: Path) -> set[str]:
    """Top-level names imported; `arenaforge.<layer>` counts as `<layer>`."""
    found = set()
    for name in _imported_modules(path):
        parts = name.split(".")
        found.add(parts[1] if parts[0] == "arenaforge" and len(parts) > 1 else parts[0])
    return found


def _modules(package: str) -> list[Path]:
    found = sorted((PACKAGE / package).rglob("*.py"))
    assert found, f"no modules under {PACKAGE / package}: the layer rules would check nothing"
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package):
    bad = []
    for path in _modules(package):
        imported = _imports(path)
        for name in imported & LAYERS - ALLOWED[package]:
            bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
        for name in imported & FORBIDDEN_THIRD_PARTY.get(package, set()):
            bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_rules_see_a_violation(tmp_path):
    # the checker itself: a schemas module importing the warehouse is caught
    bad = tmp_path / "bad.py"
    bad.write_text("from arenaforge.warehouse.db import Warehouse\nimport duckdb\n")
    assert _imports(bad) & LAYERS - ALLOWED["schemas"] == {"warehouse"}
    assert _imports(bad) & FORBIDDEN_THIRD_PARTY["schemas"] == {"duckdb"}
    # and an import by a module path in a string, which no import statement shows
    hidden = tmp_path / "hidden.py"
    hidden.write_text('import importlib\nimportlib.import_module(f"arenaforge.flows.commands.{name}")\n'
                      '__import__("arenaforge.tracks.envs")\n')
    assert _imports(hidden) & LAYERS - ALLOWED["environments"] == {"flows", "tracks"}
    # and a module path in any other string (a package's files, a class path another program loads)
    named = tmp_path / "named.py"
    named.write_text('"""Reads `arenaforge.tracks.envs`."""\nfrom importlib import resources\n'
                     'resources.files("arenaforge.tracks.envs")\nTARGET = "arenaforge.benchmarks.sft:main"\n')
    assert _imports(named) & LAYERS - ALLOWED["services"] == {"tracks", "benchmarks"}
    # and a stage that reaches for a test double
    double = tmp_path / "double.py"
    double.write_text("from arenaforge.testing.scripted_policy import ScriptedEngine\n")
    assert _imports(double) & LAYERS - ALLOWED["tracks"] == {"testing"}


# Inside tracks/: sft and envs import no other track; train may import both (it consumes their data).
TRACK_MAY_IMPORT = {"sft": {"sft"}, "envs": {"envs"}, "train": {"train", "sft", "envs"}}


def _tracks_imported(path: Path) -> set[str]:
    return {name.split(".")[2] for name in _imported_modules(path) if name.startswith("arenaforge.tracks.")}


def test_tracks_import_only_the_tracks_they_consume():
    assert {p.name for p in (PACKAGE / "tracks").iterdir() if p.is_dir() and p.name != "__pycache__"} == \
        set(TRACK_MAY_IMPORT), "a new track needs its row in TRACK_MAY_IMPORT"
    bad = [f"{path.relative_to(PACKAGE)} imports the {other} track" for track, allowed in TRACK_MAY_IMPORT.items()
           for path in _modules(f"tracks/{track}") for other in sorted(_tracks_imported(path) - allowed)]
    assert not bad, "\n".join(bad)


def test_the_track_rule_sees_a_crossing(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import importlib\nfrom importlib import resources\nfrom arenaforge.tracks.envs import export\n"
                   "from arenaforge.tracks import train\nresources.files('arenaforge.tracks.sft.data')\n"
                   "importlib.import_module(f'arenaforge.tracks.train.verl.{name}')\n")
    assert _tracks_imported(bad) - TRACK_MAY_IMPORT["envs"] == {"sft", "train"}


# The model layer (services/models/) sits under every stage: stages declare their steps and bring their offline
# rules (services.models.steps), so nothing in it imports a track (the layer rule) or another service.
MODEL_LAYER = "services/models"


def _upward_from_the_model_layer(path: Path) -> set[str]:
    return {name for name in _imported_modules(path)
            if name.startswith(("arenaforge.services.", "arenaforge.tracks."))
            and not name.startswith("arenaforge.services.models.")}


def test_the_model_layer_imports_no_stage():
    bad = [f"{path.relative_to(PACKAGE)} imports {name}" for path in _modules(MODEL_LAYER)
           for name in sorted(_upward_from_the_model_layer(path))]
    assert not bad, "\n".join(bad)


def test_the_model_layer_rule_sees_an_upward_link(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import importlib\nfrom arenaforge.services import run_scope\n"
                   "from arenaforge.services.models import Step\n"
                   'importlib.import_module("arenaforge.tracks.envs.offline_decompose")\n'
                   'importlib.import_module(f"{run_scope.__name__}.{name}")\n')
    assert _upward_from_the_model_layer(bad) == {"arenaforge.services.run_scope",
                                                 "arenaforge.tracks.envs.offline_decompose"}


# Which provider answers is decided once, when the run's model is built (services/models/providers/): no step
# compares a backend or provider name, and no module keeps a dict keyed by them.
_PROVIDER_NAMES = {"offline", "openai"}
_MAY_NAME_PROVIDERS = {"services/models/providers", "schemas/config.py", "schemas/base.py", "flows"}


def _provider_branches(path: Path) -> list[str]:
    """`x == "offline"`-style comparisons and dict literals keyed by provider names in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            names = [n.value for n in (node.left, *node.comparators) if isinstance(n, ast.Constant)]
            attrs = [n.attr for n in (node.left, *node.comparators) if isinstance(n, ast.Attribute)]
            if _PROVIDER_NAMES & set(names) and {"backend", "kind"} & set(attrs):
                found.append(f"line {node.lineno}: compares {attrs[0]} with {names[0]!r}")
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(_PROVIDER_NAMES & keys) == 2:
                found.append(f"line {node.lineno}: a dict keyed by provider names")
    return found


def test_no_step_branches_on_the_provider():
    bad = []
    for path in _modules("tracks") + _modules("services") + _modules("environments"):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel.removeprefix(p) != rel for p in _MAY_NAME_PROVIDERS):
            continue
        bad += [f"{rel} {what}" for what in _provider_branches(path)]
    assert not bad, "\n".join(bad)


def test_the_provider_rule_sees_a_branch(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if cfg.model.backend == "offline":\n    pass\nSTEPS = {"offline": 1, "openai": 2}\n')
    assert len(_provider_branches(bad)) == 2


def _event_loop_starts(path: Path) -> list[int]:
    """Lines that start an event loop (`asyncio.run`) outside an `if __name__ == "__main__":` block."""
    tree = ast.parse(path.read_text())
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            guarded |= {id(n) for n in ast.walk(node)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "asyncio.run" and id(node) not in guarded]


def test_event_loops_start_only_at_entry_points():
    # tracks, services, benchmarks and environments are async at their core: a loop belongs to the CLI or the flow
    # run that calls them
    modules = _modules("tracks") + _modules("services") + _modules("benchmarks") + _modules("environments")
    bad = [f"{path.relative_to(PACKAGE)}:{line}" for path in modules for line in _event_loop_starts(path)]
    assert not bad, "asyncio.run under tracks/, services/, benchmarks/ or environments/: " + ", ".join(bad)


def test_the_event_loop_rule_sees_a_start(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nasyncio.run(main())\nif __name__ == '__main__':\n    asyncio.run(main())\n")
    assert _event_loop_starts(bad) == [2]


# SQL statements are the warehouse's: new SQL goes in arenaforge/warehouse/ as typed functions. The exceptions
# query something that is not the warehouse, or measure it raw:
_MAY_HOLD_SQL = {
    "warehouse/": "the warehouse itself",
    "tracks/envs/knowledge/": "queries over a knowledge source (the user's tables, not the warehouse)",
    "tracks/envs/evidence/": "each evidence kind checks itself against the knowledge source with parameterised queries",
    "tracks/envs/tool_data.py": "a tool's data, read from the knowledge source it answers over",
    "tracks/envs/offline_decompose.py": "the offline provider decides from the source's tables, as a model reads them",
    "benchmarks/": "benchmarks read the warehouse and sources raw to measure them",
    "testing/envs_responder.py": "a scripted model reads the knowledge source, as a model would",
}
_SQL_STATEMENT = re.compile(
    r"\s*(WITH\b.*\bSELECT\b|SELECT\b.*\bFROM\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\S+\s+SET\b|DELETE\s+FROM\b"
    r"|CREATE\s+(OR\s+REPLACE\s+)?(TEMP\w*\s+)?(TABLE|VIEW|INDEX|MACRO|SEQUENCE|SCHEMA|TYPE)\b)", re.S)


def _sql_statements(path: Path) -> list[int]:
    """Lines of string literals (f-strings with their holes) that start like an SQL statement."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if _SQL_STATEMENT.match(text):
            found.add(node.lineno)
    return sorted(found)


def _found_outside(exempt: dict[str, str], find: Callable[[Path], list[Any]]) -> list[str]:
    """What `find` reports in every module of the package except those under an `exempt` path (a file or a folder)."""
    stale = [p for p in exempt if not (PACKAGE / p).exists()]
    assert not stale, f"exceptions naming nothing: {stale}"
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not any(rel.startswith(allowed) for allowed in exempt):
            bad += [f"{rel}:{found}" for found in find(path)]
    return bad


def test_sql_lives_in_the_warehouse():
    bad = _found_outside(_MAY_HOLD_SQL, _sql_statements)
    assert not bad, "SQL outside arenaforge/warehouse/ (make it a typed function there): " + ", ".join(bad)


# Seams are objects, not names: a sandbox backend declares its capabilities, an evidence kind and an imported suite's
# grader are classes, each found once in its registry. Nothing else compares a backend, engine or kind by name.
_SEAM_REGISTRIES = {
    "environments/runtime/launchers.py": "sandbox backends by name (`sandbox.backend`, auto)",
    "tracks/envs/evidence/__init__.py": "evidence kinds by `Evidence.kind`",
    "tracks/envs/graders/__init__.py": "imported suites' graders by `NativeCheck.kind`",
    "flows/ray_runner.py": "where a flow's batches run (`runner.kind`)",
    "services/policy/registry.py": "policy engines by name (`--engine`)",
}
_SEAM_NAMES = {"backend", "engine", "kind"}


def _seam_branches(path: Path) -> list[int]:
    """Lines of `backend == ...`, `engine != ...`, `x.kind == ...` comparisons (a name or attribute `backend`/`engine`,
    an attribute `kind`) in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            continue
        for side in (node.left, *node.comparators):
            name = side.attr if isinstance(side, ast.Attribute) else side.id if isinstance(side, ast.Name) else ""
            if name in _SEAM_NAMES and (name != "kind" or isinstance(side, ast.Attribute)):
                found.append(node.lineno)
                break
    return found


def test_seams_are_chosen_only_in_their_registry():
    bad = _found_outside(_SEAM_REGISTRIES, _seam_branches)
    assert not bad, "a seam chosen by name outside its registry (ask the object instead):\n" + "\n".join(bad)


@pytest.mark.parametrize(("find", "source"), [
    (_sql_statements, 'con.execute(f"SELECT * FROM {t} WHERE id = ?")\n"""Select the tool from the list."""\n'
                      'q = ("DELETE FROM runs "\n     "WHERE id = ?")\nCREATE = "CREATE TABLE x (a INT)"\n'),
    (_seam_branches, 'if self.backend == "process":\n    pass\nif engine != "hf":\n    pass\n'
                     'ok = ev.kind == "span"\nkind = 1\nsame = kind == 2\n'),
])
def test_the_sql_and_seam_rules_see_a_violation(tmp_path, find, source):
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    assert find(bad) == [1, 3, 5]
