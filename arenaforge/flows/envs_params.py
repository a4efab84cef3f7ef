"""The `envs` flow's parameters, apart from the flow so the CLI builds them without importing Prefect."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from arenaforge.tracks.envs.pipeline import EnvsSpec


class EnvsParams(EnvsSpec):
    """`envs` flow parameters: what to synthesize, plus where the config comes from."""

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted config overrides, e.g. model.backend.")
