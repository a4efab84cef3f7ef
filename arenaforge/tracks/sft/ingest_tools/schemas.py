"""Tool parameter schemas as JSON Schema: the non-standard type names of BFCL / ACEBench / StableToolBench
mapped, response templates turned into schemas, and a fast validity check with a cache per node."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from arenaforge.schemas.contracts import check_json_schema
from arenaforge.schemas.ids import canonical_json

# Non-standard type names seen in BFCL / ACEBench / StableToolBench docs -> JSON Schema types (None: any type).
_TYPE_MAP: dict[str, str | None] = {
    "dict": "object", "object": "object", "map": "object", "hashmap": "object",
    "float": "number", "double": "number", "number": "number", "decimal": "number",
    "int": "integer", "integer": "integer", "long": "integer",
    "str": "string", "string": "string", "char": "string", "enum": "string", "date": "string",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "tuple": "array", "set": "array",
    "null": "null", "none": "null", "any": None, "object_any": None,
}
_RESPONSE_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "NoneType": "null"}



class SchemaProblem(ValueError):
    """A parameter schema that cannot be turned into JSON Schema."""


MAX_DEPTH = 64  # real tool schemas nest a few levels; past this a document is broken or hostile


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply `value` nests (dicts and lists), counted level by level without recursion and stopping past
    `limit` (a level is one list: no tuple per node, as every tool's parameters and returns pass here)."""
    depth, level = 0, [value]
    while level and depth <= limit:
        depth += 1
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                below.extend(node.values())
            elif isinstance(node, list):
                below.extend(node)
        level = below
    return depth


def normalise_schema(schema: Any, top: bool = True) -> dict[str, Any]:
    """A JSON Schema (Draft 2020-12) from a BFCL/ACEBench/ToolBench-style parameter schema."""
    if not isinstance(schema, dict):
        raise SchemaProblem(f"a schema must be an object, got {type(schema).__name__}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("optional", "required") and isinstance(value, bool):
            continue  # per-property flags; lifted into the parent's `required` below
        out[key] = value
    if "type" in schema:
        out.pop("type")
        mapped = _map_type(schema["type"])
        if mapped is not None:
            out["type"] = mapped
    if isinstance(out.get("properties"), dict):
        props = {}
        required = [r for r in out.get("required", []) if isinstance(r, str)] if isinstance(out.get("required"), list) else []
        for name, sub in out["properties"].items():
            props[str(name)] = normalise_schema(sub, top=False)
            if isinstance(sub, dict) and sub.get("required") is True and name not in required:
                required.append(name)
            if isinstance(sub, dict) and sub.get("optional") is True and name in required:
                required.remove(name)
        out["properties"] = props
        out["required"] = required
        if not required:
            out.pop("required")
    elif "properties" in out:
        raise SchemaProblem("`properties` must be an object")
    elif "required" in out and not isinstance(out["required"], list):
        out.pop("required")
    if "items" in out:
        items = out["items"]
        if isinstance(items, list):  # tuple form -> prefixItems (2020-12)
            out.pop("items")
            out["prefixItems"] = [normalise_schema(i, top=False) for i in items]
        elif isinstance(items, dict):
            out["items"] = normalise_schema(items, top=False)
        else:
            out.pop("items")
    for key in ("additionalProperties",):
        if isinstance(out.get(key), dict):
            out[key] = normalise_schema(out[key], top=False)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [normalise_schema(s, top=False) for s in out[key]]
    if out.get("type") == "array" and "items" not in out and "prefixItems" not in out:
        out["items"] = {}
    if top:
        if "type" not in out and "properties" in out:
            out["type"] = "object"
        if out.get("type") != "object":
            raise SchemaProblem(f"the arguments schema must have type object, got {out.get('type')!r}")
        out.setdefault("properties", {})
    return out


def _map_type(value: Any) -> Any:
    if isinstance(value, list):
        mapped = [_map_type(v) for v in value]
        return None if None in mapped else list(dict.fromkeys(mapped))
    if not isinstance(value, str):
        raise SchemaProblem(f"type must be a string, got {value!r}")
    key = value.strip().lower()
    if key.startswith("date") or key.startswith("time"):
        return "string"
    if key not in _TYPE_MAP:
        raise SchemaProblem(f"unknown type {value!r}")
    return _TYPE_MAP[key]


def response_schema(template: Any) -> dict[str, Any] | None:
    """JSON Schema of a StableToolBench `template_response` ({"field": "str", "list": [{...}]})."""
    if template is None or template == {} or template == "":
        return None
    if isinstance(template, dict):
        props = {str(k): response_schema(v) or {} for k, v in template.items() if k != "_list_length"}
        return {"type": "object", "properties": props}
    if isinstance(template, list):
        return {"type": "array", "items": (response_schema(template[0]) or {}) if template else {}}
    if isinstance(template, str):
        if template in _RESPONSE_TYPES:
            return {"type": _RESPONSE_TYPES[template]}
        match = re.match(r"list of (\w+)", template)
        if match:
            return {"type": "array", "items": {"type": _RESPONSE_TYPES.get(match.group(1), "string")}}
        return {"type": "string"}
    return None


# Keywords whose values are subschemas (or maps / lists of them) in Draft 2020-12.
_SUB_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
            "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SUB_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUB_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")
_ANNOTATIONS = ("description", "title", "$comment")


def check_schema_fast(schema: Any) -> str | None:
    """`arenaforge.schemas.contracts.check_json_schema`, node by node with a cache (the meta-schema check costs ~4 ms a call).

    Each schema node is checked against the meta-schema without its subschemas (which are
    checked recursively) and with string annotations blanked, so the thousands of repeated
    nodes in a corpus ({"type": "string", "description": ...}) are checked once.
    """
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"(root): {schema!r} is not of type 'object', 'boolean'"
    shallow: dict[str, Any] = {}
    children: list[tuple[str, Any]] = []
    for key, value in schema.items():
        if key in _SUB_ONE and isinstance(value, (dict, bool)):
            children.append((key, value))
        elif key in _SUB_MAP and isinstance(value, dict):
            children += [(f"{key}/{k}", v) for k, v in value.items()]
        elif key in _SUB_LIST and isinstance(value, list) and value:
            children += [(f"{key}/{i}", v) for i, v in enumerate(value)]
        elif key in _ANNOTATIONS and isinstance(value, str):
            shallow[key] = ""
        elif key == "required" and isinstance(value, list) and all(isinstance(v, str) for v in value) \
                and len(set(value)) == len(value):
            shallow[key] = [f"p{i}" for i in range(len(value))]  # only shape and uniqueness matter here
        elif key in ("default", "const"):
            shallow[key] = None  # any JSON value is valid here
        elif key == "examples" and isinstance(value, list):
            shallow[key] = []
        else:
            shallow[key] = value
    problem = _check_node(canonical_json(shallow))
    if problem is not None:
        return problem
    for where, child in children:
        problem = check_schema_fast(child)
        if problem is not None:
            return f"{where}/{problem}" if not problem.startswith("(root)") else f"{where}{problem[6:]}"
    return None


@functools.lru_cache(maxsize=65536)
def _check_node(text: str) -> str | None:
    return check_json_schema(json.loads(text))


def sanitize_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name.strip()).strip("_")
    return cleaned[:64]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "server"
