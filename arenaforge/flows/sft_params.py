"""The typed parameters of the SFT track's flows (`ingest`, `graph`, `sft`): their Prefect forms and the options of
their commands. Apart from the flows, so a command reads them without importing Prefect."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from arenaforge.schemas.config import Config, load_config


class _ConfigRef(BaseModel):
    """Where a flow's config comes from (a command passes its global --config and --set, not options of its own)."""

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted config overrides, e.g. model.backend.")

    def config(self) -> Config:
        return load_config(self.config_path, overrides=self.overrides)


class IngestParams(_ConfigRef):
    paths: list[str] = Field(default_factory=list, description="Tool-document files or folders (formats auto-detected).")
    mcp: list[str] = Field(default_factory=list, description="Live MCP server commands, e.g. 'mcp-server-time'.")


class GraphParams(_ConfigRef):
    servers: list[str] = Field(default_factory=list, description="Servers to (re)build; empty = all.")


class SftParams(_ConfigRef):
    servers: list[str] = Field(default_factory=list, description="Servers to synthesize for; empty = all.")
    seed: int | None = Field(default=None, description="Seed of walks, queries and simulators (default: config seed).")
    server_only: bool = Field(default=True, description="Also write server-only tasks (not conditioned on a chain).")
    export_dir: str | None = Field(default=None, description="Export kept trajectories of this run here (JSONL+Parquet).")
    batch_size: int = Field(default=64, ge=1, description="runner.kind = ray: tasks per batch whose trajectories a "
                                                          "worker runs and judges (one task run each).")


CONFIG_REF = tuple(_ConfigRef.model_fields)
