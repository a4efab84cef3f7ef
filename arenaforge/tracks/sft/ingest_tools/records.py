"""What ingestion reads before normalising: raw tools and servers, the result, and rejection rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.models import Rejection, Server, Tool

STAGE = "ingest"
_PROVENANCE = Provenance(backend="import")


@dataclass
class RawTool:
    """A tool as read, before normalisation and filtering."""

    server: str
    name: str
    description: str
    parameters: Any
    returns: Any = None
    source: str = "openai"
    source_ref: str | None = None
    code: str | None = None


@dataclass
class RawServer:
    name: str
    source: str
    title: str = ""
    description: str = ""
    domain: str = "general"
    launch: list[str] | None = None


@dataclass
class IngestResult:
    tools: list[Tool] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)

    def extend(self, other: "IngestResult") -> None:
        self.tools += other.tools
        self.servers += other.servers
        self.rejections += other.rejections

    def counts(self) -> dict[str, int]:
        return {"tools": len(self.tools), "servers": len(self.servers), "rejections": len(self.rejections)}



def reject(subject: str, reason: str, detail: str, payload: Any = None, env_failure: bool = False) -> Rejection:
    return Rejection(stage=STAGE, subject=subject[:300], reason=reason, detail=detail[:1000], payload=payload,
                     environment_failure=env_failure, provenance=_PROVENANCE)
