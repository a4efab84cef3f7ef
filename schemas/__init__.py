"""Data contracts: JSON Schema files (`json/`) and the typed models that mirror them."""

from schemas.base import Backend, Frozen, Provenance, Record
from schemas.errors import (
    ArenaforgeError,
    ConfigError,
    ContractError,
    InputError,
    ParseError,
    ProviderError,
    SandboxError,
    WarehouseError,
)
from schemas.models import *  # noqa: F401,F403  (the public surface is models.__all__)
from schemas.models import __all__ as _model_names

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
