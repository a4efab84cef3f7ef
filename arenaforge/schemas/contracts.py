"""JSON Schema contracts: generation from the typed models and validation against the files.

Each kind's schema is Draft 2020-12 with `$id` = `urn:arenaforge:schema:<kind>:v<version>`.
Validation of JSON data (model output, warehouse writes, ingest) goes through
`validate(kind, data)`, which raises `ContractError` with the first failing path.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator

from arenaforge.schemas.base import SCHEMA_VERSION, Record
from arenaforge.schemas.errors import ContractError

JSON_DIR = Path(str(resources.files("arenaforge.schemas").joinpath("json")))
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_id(kind: str, version: int = SCHEMA_VERSION) -> str:
    return f"urn:arenaforge:schema:{kind}:v{version}"


def build_schema(model: type[Record]) -> dict[str, Any]:
    """The JSON Schema document for a record kind, derived from its typed model."""
    body = model.model_json_schema(mode="validation")
    return {"$schema": DIALECT, "$id": schema_id(model.KIND), **body}


def schema_path(kind: str) -> Path:
    return JSON_DIR / f"{kind}.schema.json"


@lru_cache(maxsize=None)
def load_schema(kind: str) -> dict[str, Any]:
    path = schema_path(kind)
    if not path.exists():
        raise ContractError(f"no JSON Schema for record kind {kind!r} ({path.name} missing)")
    return json.loads(path.read_text())


@lru_cache(maxsize=None)
def validator(kind: str) -> Draft202012Validator:
    # Validating against the schema with its local $refs inlined checks the same constraints about
    # twice as fast (jsonschema resolves every $ref on every descent); records are validated at
    # every warehouse write, so this is on the hot path of each stage.
    return Draft202012Validator(inline_refs(load_schema(kind)), format_checker=Draft202012Validator.FORMAT_CHECKER)


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every non-recursive `#/$defs/...` reference replaced by its definition (same constraints)."""
    defs = schema.get("$defs") or {}

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(v, stack) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs and ref[8:] not in stack:
            name = ref[8:]
            body = walk(defs[name], (*stack, name))
            rest = {k: walk(v, stack) for k, v in node.items() if k != "$ref"}
            return {"allOf": [body], **rest} if rest else body
        # `additionalProperties: true` is the default; spelled out, jsonschema descends into every extra key.
        return {k: (v if k == "$defs" else walk(v, stack)) for k, v in node.items()
                if not (k == "additionalProperties" and v is True)}

    return walk(schema, ())


def describe_error(err: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return f"{where}: {err.message}"


def validate(kind: str, data: Any) -> None:
    """Raise ContractError naming the first violation when `data` breaks the kind's contract."""
    err = _first_error(_fast_validator(kind), validator(kind), data)
    if err is not None:
        raise ContractError(f"{kind} record breaks its contract at {describe_error(err)}")


def validate_against(schema: dict[str, Any], data: Any) -> str | None:
    """Validate against an ad-hoc schema (a step's output schema); the error text, or None."""
    fast, reference = _validators_for(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    err = _first_error(fast, reference, data)
    return None if err is None else describe_error(err)


def _first_error(fast: Any, reference: Draft202012Validator, data: Any) -> jsonschema.ValidationError | None:
    """jsonschema-rs answers "valid?" ~100x faster than jsonschema (validation runs on every model
    answer and every warehouse write, on the event loop); only invalid data pays for the
    reference implementation, which picks and words the error."""
    if fast.is_valid(data):
        return None
    return jsonschema.exceptions.best_match(reference.iter_errors(data))


@lru_cache(maxsize=None)
def _fast_validator(kind: str) -> Any:
    return jsonschema_rs.validator_for(load_schema(kind), validate_formats=True)


@lru_cache(maxsize=256)
def _validators_for(schema_json: bytes) -> tuple[Any, Draft202012Validator]:
    """Built once per distinct schema: a step sends the same schema with every request."""
    schema = json.loads(schema_json)
    return jsonschema_rs.validator_for(schema), Draft202012Validator(schema)


def check_json_schema(schema: Any) -> str | None:
    """Whether `schema` is itself a valid Draft 2020-12 JSON Schema; the error text, or None."""
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        return describe_error(err)
    return None
