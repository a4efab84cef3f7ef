"""Knowledge sources for the RL track: what QA instances are synthesized from and grounded on.

A source is a set of tables in an in-memory DuckDB, profiled (`source.py`). Each named kind is one
module here defining `NAME` and `load(shared_data, **profile_kw)` (`sample`, `tau2_retail`, `astra`);
any other name is a path to table files (CSV, Parquet, JSON, JSON-lines) or a folder of them. Adding a
kind is adding one module.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.envs.knowledge.astra import load_text_corpus
from arenaforge.tracks.envs.knowledge.sample import load_sample
from arenaforge.tracks.envs.knowledge.source import (
    READERS,
    Column,
    KnowledgeSource,
    Link,
    TableProfile,
    from_files,
    from_records,
    profile,
)
from arenaforge.tracks.envs.knowledge.tau2_retail import load_tau2_retail

__all__ = ["Column", "KnowledgeSource", "Link", "TableProfile", "default_shared_data", "from_files", "from_records",
           "kinds", "load_sample", "load_source", "load_tables", "load_tau2_retail", "load_text_corpus", "profile",
           "run_sources"]


@functools.cache
def kinds() -> dict[str, ModuleType]:
    """Source-kind modules by NAME."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if getattr(module, "NAME", None):
            found[module.NAME] = module
    return found


def default_shared_data() -> Path:
    """Where the third-party data folder is looked for: $ARENAFORGE_SHARED_DATA, else ../shared/data."""
    return Path(os.environ.get("ARENAFORGE_SHARED_DATA") or Path.cwd().parent / "shared" / "data")


def run_sources(run: RunScope, names: Sequence[str], shared_data: str | None = None) -> dict[str, KnowledgeSource]:
    """Sources by name, loaded once per run (kept in `run.sources`, closed with the run) and shared by its stages
    (a big one takes seconds)."""
    out = {}
    for name in names:
        key = (name, shared_data)
        if key not in run.sources:
            run.sources[key] = load_source(name, shared_data=shared_data)
        source = run.sources[key]
        out[source.name] = source
    return out


def load_source(spec: str, shared_data: str | Path | None = None, **profile_kw: Any) -> KnowledgeSource:
    """A source by kind name (`sample`, `tau2_retail`, `astra`: these two need the shared data) or a path to table
    files or a folder of them."""
    kind = kinds().get(spec)
    if kind is not None:
        return kind.load(Path(shared_data) if shared_data else default_shared_data(), **profile_kw)
    path = Path(spec)
    if path.is_dir():
        return from_files(path.name, sorted(p for p in path.iterdir() if p.suffix.lower() in READERS), **profile_kw)
    if path.is_file():
        return from_files(path.stem, [path], **profile_kw)
    raise InputError(f"unknown knowledge source {spec!r}: use {', '.join(sorted(kinds()))} or a path to table files")


load_tables = from_files  # a source from table files, one table per file
