"""The record base class every artifact derives from: frozen, strict, content-addressed.

A `Record` knows its kind (`KIND`, which names its JSON Schema file and `$id`), its id prefix
and the warehouse table it lives in. Its `id` is computed from its content when not given, so
two identical artifacts always share an id (see `arenaforge.schemas.ids`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from arenaforge.schemas.ids import content_id

SCHEMA_VERSION = 1
Backend = Literal["offline", "openai"]


class Frozen(BaseModel):
    """Strict, immutable value object."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Provenance(Frozen):
    """How a record was made; excluded from its content id."""

    backend: str = Field(description="Backend that produced the record: offline, openai, hf, vllm, scripted, import.")
    model: str | None = Field(default=None, description="Model id when a model produced it.")
    prompt_hash: str | None = Field(default=None, description="Hash of the prompt template used, if any.")
    seed: int | None = Field(default=None, description="Seed of the deterministic generator, if any.")
    code_version: str = Field(default="0.1.0", description="arenaforge version that made the record.")
    source: str | None = Field(default=None, description="Knowledge source or tool server the record came from.")
    written_by: dict[str, Literal["model", "program"]] | None = Field(
        default=None, description="Which parts of the record a model wrote and which the program wrote (part -> who).")


class Record(Frozen):
    """An artifact stored in the warehouse, with lineage."""

    KIND: ClassVar[str] = "record"
    ID_PREFIX: ClassVar[str] = "rec"
    TABLE: ClassVar[str] = "records"
    # Fields that say where or how a record was made, not what it is: left out of its id, so the same
    # content read from another checkout, machine or path is the same record.
    ID_EXCLUDE: ClassVar[frozenset[str]] = frozenset()

    id: str = Field(default="", description="Content-addressed id: prefix + SHA-256 of the canonical JSON content.")
    parents: list[str] = Field(default_factory=list, description="Ids of the records this one was derived from.")
    run_id: str | None = Field(default=None, description="Id of the run that produced this record.")
    provenance: Provenance | None = Field(default=None, description="Backend, model, prompt hash, seed, version.")

    @model_validator(mode="after")
    def _fill_id(self) -> "Record":
        if not self.id:
            object.__setattr__(self, "id", self.compute_id())
        return self

    def compute_id(self) -> str:
        return content_id(self.ID_PREFIX, self.model_dump(mode="json", exclude=set(self.ID_EXCLUDE)))

    def content(self) -> dict[str, Any]:
        """The record as JSON-ready data (what is stored and validated)."""
        return self.model_dump(mode="json")

    def lineage(self, source: str | None = None) -> dict[str, str]:
        """Where an exported row came from, as flat strings ("" when unknown): the record and run ids, the
        backend, model and prompt that made it, and its source. Every export carries it."""
        p = self.provenance
        return {"record_id": self.id, "run_id": self.run_id or "", "backend": p.backend if p else "",
                "model": (p.model if p else None) or "", "prompt_hash": (p.prompt_hash if p else None) or "",
                "source": source or (p.source if p else None) or ""}
