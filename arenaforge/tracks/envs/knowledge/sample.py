"""The project's own small shop source (`arenaforge/data/sample_source`): `--source sample`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.tracks.envs.knowledge.source import READERS, KnowledgeSource, from_files

NAME = "sample"
SAMPLE_DIR = Path(str(resources.files("arenaforge.data").joinpath("sample_source")))


def load(shared_data: Path, **profile_kw: Any) -> KnowledgeSource:
    return load_sample(**profile_kw)


def load_sample(**profile_kw: Any) -> KnowledgeSource:
    """The project's own small shop source (arenaforge/data/sample_source)."""
    files = sorted(p for p in SAMPLE_DIR.iterdir() if p.suffix in READERS)
    return from_files("sample_shop", files, **profile_kw)
