"""Arenaforge's error hierarchy: one class per boundary a failure can cross.

    ArenaforgeError              user-facing; the CLI prints str(err) as one line and exits 2
    ├── ConfigError              malformed arenaforge.toml, bad env var or flag
    ├── WarehouseError           unknown table, locked file, failed migration
    ├── InputError               a user-supplied file or argument that cannot be used
    ├── ProviderError            a model endpoint that is unreachable or keeps failing
    │   └── ParseError           a model answer that is not valid JSON / breaks the step's schema
    ├── SandboxError             the sandbox runtime itself failed (not a tool's own error)
    └── ContractError            a record that breaks its JSON Schema contract

Rejected records are values (`arenaforge.schemas.models.Rejection`), not exceptions: a stage catches
only these known types at its boundary and writes a rejection row. Everything else is a bug
and is allowed to raise with its traceback.
"""

from __future__ import annotations


class ArenaforgeError(Exception):
    """Base class for errors a user should see as one clear line."""


class ConfigError(ArenaforgeError):
    pass


class WarehouseError(ArenaforgeError):
    pass


class InputError(ArenaforgeError):
    pass


class ProviderError(ArenaforgeError):
    pass


class ParseError(ProviderError):
    pass


class SandboxError(ArenaforgeError):
    pass


class ContractError(ArenaforgeError):
    pass
