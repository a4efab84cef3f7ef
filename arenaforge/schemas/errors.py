"""Arenaforge's error hierarchy: one class per boundary a failure can cross, each with its failure kind.

    ArenaforgeError              user-facing; the CLI prints str(err) as one line and exits non-zero
    ├── ConfigError              malformed arenaforge.toml, bad env var or flag
    ├── WarehouseError           unknown table, locked file, failed migration
    ├── InputError               a user-supplied file or argument that cannot be used
    ├── RunFailed                a run produced nothing because what it depends on failed
    ├── ProviderError            a model endpoint failed the request               (kind: provider_*)
    │   ├── ProviderUnreachable  no connection / no answer in time, every retry     provider_unreachable
    │   ├── ProviderOverloaded   429 / 503 after every retry                        provider_overloaded
    │   ├── ProviderRefused      4xx: the endpoint refused this request             provider_bad_request
    │   └── ParseError           an answer that never fit the step's contract       invalid_output
    ├── SandboxError             the sandbox runtime itself failed (not a tool)     infrastructure
    └── ContractError            a record that breaks its JSON Schema contract

`FailureKind` classifies why a record was not produced. Only `quality_rejection` is about the record's
own data; the rest are failures of something it depended on (`environment_failure`): they are counted
apart, never scored as an agent's or a generator's fault, and a run that produced nothing because of
them ends failed.

Rejected records are values (`arenaforge.schemas.models.Rejection`), not exceptions: a stage catches
only these known types at its boundary and writes a rejection row. Everything else is a bug and is
allowed to raise with its traceback.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class FailureKind(StrEnum):
    QUALITY = "quality_rejection"  # a check refused the record's own data
    INVALID_OUTPUT = "invalid_output"  # the model never answered within the step's contract
    PROVIDER_UNREACHABLE = "provider_unreachable"  # connection refused, reset or timed out
    PROVIDER_OVERLOADED = "provider_overloaded"  # 429 / 503
    PROVIDER_BAD_REQUEST = "provider_bad_request"  # 4xx: this request is refused whatever the retries
    PROVIDER_FAILED = "provider_failed"  # the endpoint answered with a server error (500)
    INFRASTRUCTURE = "infrastructure"  # sandbox worker, MCP server, engine: not the record's fault

    @property
    def environment_failure(self) -> bool:
        """A failure of what the record depends on, not of the record (excluded from rewards and quality)."""
        return self not in (FailureKind.QUALITY, FailureKind.INVALID_OUTPUT)


class ArenaforgeError(Exception):
    """Base class for errors a user should see as one clear line."""

    kind: FailureKind = FailureKind.QUALITY


class ConfigError(ArenaforgeError):
    pass


class WarehouseError(ArenaforgeError):
    kind = FailureKind.INFRASTRUCTURE


class InputError(ArenaforgeError):
    pass


class RunFailed(ArenaforgeError):
    """A run that produced nothing because its provider or infrastructure failed (the message has the top reasons)."""

    kind = FailureKind.INFRASTRUCTURE


class ProviderError(ArenaforgeError):
    kind = FailureKind.PROVIDER_FAILED


class ProviderUnreachable(ProviderError):
    kind = FailureKind.PROVIDER_UNREACHABLE


class ProviderOverloaded(ProviderError):
    kind = FailureKind.PROVIDER_OVERLOADED


class ProviderRefused(ProviderError):
    kind = FailureKind.PROVIDER_BAD_REQUEST


class ParseError(ProviderError):
    kind = FailureKind.INVALID_OUTPUT


class SandboxError(ArenaforgeError):
    kind = FailureKind.INFRASTRUCTURE


class ContractError(ArenaforgeError):
    pass


def first_error(err: Any) -> str:
    """A pydantic `ValidationError`'s first error on one line: `where: message (got value)`."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not where:  # a rule over several fields: its input is all of them
        return f"parameters: {message}"
    if first.get("type") == "missing":
        return f"{where}: {message}"
    return f"{where}: {message} (got {first.get('input')!r})"
