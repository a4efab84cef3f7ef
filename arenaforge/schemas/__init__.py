"""Data contracts: JSON Schema files (`json/`) and the typed models that mirror them."""

from arenaforge.schemas.base import Backend, Frozen, Provenance, Record
from arenaforge.schemas.errors import (
    ArenaforgeError,
    ConfigError,
    ContractError,
    InputError,
    ParseError,
    ProviderError,
    SandboxError,
    WarehouseError,
)
from arenaforge.schemas.models import *  # noqa: F401,F403  (the public surface is models.__all__)
from arenaforge.schemas.models import __all__ as _model_names

__all__ = sorted(
    [
        "ArenaforgeError",
        "Backend",
        "ConfigError",
        "ContractError",
        "Frozen",
        "InputError",
        "ParseError",
        "Provenance",
        "ProviderError",
        "Record",
        "SandboxError",
        "WarehouseError",
        *_model_names,
    ]
)
