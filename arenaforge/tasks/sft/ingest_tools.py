"""Ingest tool documents into normalised OpenAI function schemas grouped by server (ASTRA §1a.1).

Reads, per file (a folder is walked; the format is detected per file from its first record):
  openai          OpenAI function JSON: a list / JSONL of {"type": "function", "function": {...}} or bare functions
                  (the server is the file's stem, or a record's "server" key)
  astra           MCP server records: {name|title, description, domain, tools: [...]} (tools in OpenAI or MCP form)
  bfcl            BFCL question records: {id, question: [[...]], function: [...]} with `dict`/`float`/`tuple`/`any` types
  acebench        ACEBench records: {id, question: "...", function: [...]} (agent records grouped by involved class)
  stabletoolbench StableToolBench queries: [{query, api_list: [{tool_name, api_name, required_parameters, ...}]}]
and live MCP servers over stdio (`ingest_mcp`). Every tool that is not kept becomes a `Rejection`
(stage "ingest") with a reason code: malformed_json, unrecognised_format, no_tool_documents,
invalid_name, invalid_schema, poor_description, duplicate_name, too_few_tools, too_many_tools,
mcp_unavailable. The warehouse write is the caller's (one batch per run).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import SftConfig
from arenaforge.schemas.contracts import check_json_schema
from arenaforge.schemas.ids import canonical_json
from arenaforge.schemas.models import FunctionDoc, Rejection, Server, Tool
from arenaforge.tasks.sft.mcp_client import McpServerError, list_server_tools, parse_command

STAGE = "ingest"
_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_PROVENANCE = Provenance(backend="import")

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


def _reject(subject: str, reason: str, detail: str, payload: Any = None, env_failure: bool = False) -> Rejection:
    return Rejection(stage=STAGE, subject=subject[:300], reason=reason, detail=detail[:1000], payload=payload,
                     environment_failure=env_failure, provenance=_PROVENANCE)


# --------------------------------------------------------------------------- schema normalisation
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


# --------------------------------------------------------------------------- reading files
def read_records(path: Path) -> tuple[list[Any], list[Rejection]]:
    """Records of a JSON document (a list, or one object) or a JSON-lines file; malformed lines rejected."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        doc = json.loads(text)
        return (doc if isinstance(doc, list) else [doc]), []
    except json.JSONDecodeError as whole_err:
        records, rejections = [], []
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for n, line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                rejections.append(_reject(f"{path}:{n}", "malformed_json", f"line {n}: {err.msg} at column {err.colno}",
                                          payload=line[:2000]))
        if not records:  # not JSON-lines either: one malformed document
            return [], [_reject(str(path), "malformed_json", f"{whole_err.msg} at line {whole_err.lineno}")]
        return records, rejections


def detect_format(record: Any) -> str | None:
    """Source format of one record, or None when it is not a tool document."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("api_list"), list):
        return "stabletoolbench"
    if isinstance(record.get("function"), list) and "question" in record:
        return "bfcl" if isinstance(record["question"], list) else "acebench"
    if isinstance(record.get("tools"), list):
        return "astra"
    if record.get("type") == "function" and isinstance(record.get("function"), dict):
        return "openai"
    if isinstance(record.get("name"), str) and ("parameters" in record or "description" in record) and "question" not in record:
        return "openai"
    return None


def _openai_function(item: dict[str, Any]) -> dict[str, Any]:
    return item["function"] if item.get("type") == "function" and isinstance(item.get("function"), dict) else item


def _raw_from_function(fn: dict[str, Any], server: str, source: str, ref: str) -> RawTool:
    params = fn.get("parameters", fn.get("input_schema", fn.get("inputSchema", {"type": "object", "properties": {}})))
    returns = fn.get("returns", fn.get("output_schema", fn.get("outputSchema", fn.get("response"))))
    return RawTool(server=server, name=str(fn.get("name", "")), description=str(fn.get("description") or ""),
                   parameters=params, returns=returns, source=source, source_ref=ref, code=fn.get("code"))


def records_to_raw(fmt: str, records: list[Any], path: Path) -> tuple[list[RawTool], list[RawServer], list[Rejection]]:
    """Raw tools and servers of one file's records (records of another format are rejected)."""
    tools: list[RawTool] = []
    servers: dict[str, RawServer] = {}
    rejections: list[Rejection] = []
    stem = path.stem
    for index, record in enumerate(records):
        ref = f"{path}#{index}"
        if detect_format(record) != fmt:
            rejections.append(_reject(ref, "unrecognised_format", f"record is not a {fmt} tool document",
                                      payload=_clip(record)))
            continue
        if fmt == "openai":
            fn = _openai_function(record)
            if fn is not record and "returns" in record and "returns" not in fn:
                fn = {**fn, "returns": record["returns"]}
            server = str(record.get("server") or fn.get("server") or stem)
            servers.setdefault(server, RawServer(name=server, source="openai", title=server))
            tools.append(_raw_from_function(fn, server, "openai", ref))
        elif fmt == "astra":
            name = str(record.get("name") or record.get("server") or slug(str(record.get("title", stem))))
            servers.setdefault(name, RawServer(
                name=name, source="astra", title=str(record.get("title") or name),
                description=str(record.get("description") or ""), domain=str(record.get("domain") or "general"),
                launch=parse_command(record["launch"]) if record.get("launch") else None))
            for j, item in enumerate(record["tools"]):
                if isinstance(item, dict):
                    tools.append(_raw_from_function(_openai_function(item), name, "astra", f"{ref}/tools/{j}"))
                else:
                    rejections.append(_reject(f"{ref}/tools/{j}", "unrecognised_format", "tool entry is not an object"))
        elif fmt in ("bfcl", "acebench"):
            involved = record.get("involved_classes")
            rid = str(record.get("id", index))
            server = f"{fmt}.{'_'.join(involved)}" if involved else f"{fmt}.{stem}.{rid}"
            servers.setdefault(server, RawServer(name=server, source=fmt, title=rid, domain=_domain_of(stem)))
            for j, fn in enumerate(record["function"]):
                if isinstance(fn, dict):
                    tools.append(_raw_from_function(fn, server, fmt, f"{ref}/function/{j}"))
        elif fmt == "stabletoolbench":
            for j, api in enumerate(record["api_list"]):
                server = f"toolbench.{slug(str(api.get('tool_name', 'unknown')))}"
                servers.setdefault(server, RawServer(name=server, source="stabletoolbench",
                                                     title=str(api.get("tool_name", "")),
                                                     domain=str(api.get("category_name") or "general").lower()))
                tools.append(_toolbench_raw(api, server, f"{ref}/api_list/{j}"))
    return tools, list(servers.values()), rejections


def _domain_of(stem: str) -> str:
    return re.sub(r"^(BFCL_v\d+_|data_)", "", stem)


def _toolbench_raw(api: dict[str, Any], server: str, ref: str) -> RawTool:
    props: dict[str, Any] = {}
    required: list[str] = []
    for kind in ("required_parameters", "optional_parameters"):
        for p in api.get(kind) or []:
            if not isinstance(p, dict) or not p.get("name"):
                continue
            raw_type = str(p.get("type") or "string")
            prop: dict[str, Any] = {"type": raw_type}
            if p.get("description"):
                prop["description"] = str(p["description"])
            if p.get("default") not in (None, ""):
                prop["default"] = p["default"]
            if raw_type.upper().startswith("DATE"):
                prop["format"] = "date"
            props[str(p["name"])] = prop
            if kind == "required_parameters":
                required.append(str(p["name"]))
    params = {"type": "object", "properties": props, **({"required": required} if required else {})}
    return RawTool(server=server, name=str(api.get("api_name", "")), description=str(api.get("api_description") or ""),
                   parameters=params, returns=response_schema(api.get("template_response")),
                   source="stabletoolbench", source_ref=ref)


def _clip(value: Any, limit: int = 2000) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else text[:limit]


# --------------------------------------------------------------------------- normalise + filter
def finalise(raw_tools: list[RawTool], raw_servers: list[RawServer], cfg: SftConfig) -> IngestResult:
    """Normalised, filtered Tool and Server records from raw ones; everything dropped is a Rejection."""
    result = IngestResult()
    by_server: dict[str, dict[str, Tool]] = {}
    for raw in raw_tools:
        tool, rejection = _normalise_tool(raw, cfg)
        if rejection is not None:
            result.rejections.append(rejection)
            continue
        assert tool is not None
        kept = by_server.setdefault(tool.server, {})
        existing = kept.get(tool.function.name)
        if existing is None:
            kept[tool.function.name] = tool
        elif (existing.function, existing.returns) != (tool.function, tool.returns):
            result.rejections.append(_reject(
                f"{tool.server}/{tool.function.name}", "duplicate_name",
                f"another tool named {tool.function.name!r} with a different schema is already in server {tool.server!r} "
                f"(kept {existing.source_ref})", payload=tool.function.model_dump(mode="json")))
    meta = {s.name: s for s in raw_servers}
    for server_name, tools in by_server.items():
        names = sorted(tools)
        if len(names) > cfg.max_tools_per_server:
            for extra in names[cfg.max_tools_per_server:]:
                result.rejections.append(_reject(f"{server_name}/{extra}", "too_many_tools",
                                                 f"server has {len(names)} tools, the limit is {cfg.max_tools_per_server}"))
            names = names[: cfg.max_tools_per_server]
        if len(names) < cfg.min_tools_per_server:
            for name in names:
                result.rejections.append(_reject(f"{server_name}/{name}", "too_few_tools",
                                                 f"server has {len(names)} usable tools, at least "
                                                 f"{cfg.min_tools_per_server} are needed"))
            continue
        info = meta.get(server_name) or RawServer(name=server_name, source=tools[names[0]].source)
        result.tools += [tools[n] for n in names]
        result.servers.append(Server(
            name=server_name, title=info.title or server_name, description=info.description, domain=info.domain,
            source=info.source, tool_names=names, launch=info.launch,
            parents=[tools[n].id for n in names], provenance=_PROVENANCE))
    return result


def _normalise_tool(raw: RawTool, cfg: SftConfig) -> tuple[Tool | None, Rejection | None]:
    subject = f"{raw.server}/{raw.name or '?'}"
    payload = _clip({"name": raw.name, "description": raw.description, "parameters": raw.parameters})
    name = raw.name if _NAME_OK.match(raw.name or "") else sanitize_name(raw.name or "")
    if not name:
        return None, _reject(subject, "invalid_name", f"tool name {raw.name!r} has no usable characters", payload)
    description = " ".join(raw.description.split())
    if len(description) < cfg.min_description_chars:
        return None, _reject(subject, "poor_description",
                             f"description has {len(description)} characters, at least {cfg.min_description_chars} "
                             "are needed", payload)
    try:
        params = normalise_schema(raw.parameters)
    except SchemaProblem as err:
        return None, _reject(subject, "invalid_schema", str(err), payload)
    problem = check_schema_fast(params)
    if problem is not None:
        return None, _reject(subject, "invalid_schema", f"not a JSON Schema: {problem}", payload)
    returns = None
    if raw.returns not in (None, {}, ""):
        try:
            returns = normalise_schema(raw.returns, top=False) if isinstance(raw.returns, dict) else None
        except SchemaProblem:
            returns = None  # an unusable output schema only costs us the data-flow hint
        if returns is not None and check_schema_fast(returns) is not None:
            returns = None
    tool = Tool(server=raw.server, function=FunctionDoc(name=name, description=description, parameters=params),
                returns=returns, source=raw.source, source_ref=raw.source_ref, code=raw.code, provenance=_PROVENANCE)
    return tool, None


# --------------------------------------------------------------------------- entry points
def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for p in paths:
        path = Path(p)
        if path.is_dir():
            yield from sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in (".json", ".jsonl"))
        else:
            yield path


def read_file(path: Path) -> tuple[list[RawTool], list[RawServer], list[Rejection]]:
    """Raw tools and servers of one file, its format detected from its first record."""
    records, rejections = read_records(path)
    if not records:
        return [], [], rejections
    fmt = detect_format(records[0])
    if fmt is None:
        first = records[0]
        reason = "no_tool_documents"
        keys = sorted(first)[:8] if isinstance(first, dict) else type(first).__name__
        return [], [], rejections + [_reject(str(path), reason,
                                             f"no tool documents found (first record has keys {keys})")]
    tools, servers, more = records_to_raw(fmt, records, path)
    return tools, servers, rejections + more


def ingest_paths(paths: Iterable[str | Path], cfg: SftConfig) -> IngestResult:
    """Tools and servers from files and folders (formats auto-detected), with rejections."""
    raw_tools: list[RawTool] = []
    raw_servers: list[RawServer] = []
    rejections: list[Rejection] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            rejections.append(_reject(str(path), "missing_path", "no such file or folder"))
            continue
        files = list(iter_files([path]))
        found = 0
        for file in files:
            tools, servers, rejected = read_file(file)
            raw_tools += tools
            raw_servers += servers
            rejections += rejected
            found += len(tools)
        if path.is_dir() and found == 0:
            rejections.append(_reject(str(path), "no_tool_documents",
                                      f"folder has {len(files)} JSON files and none holds tool documents"))
    result = finalise(raw_tools, raw_servers, cfg)
    result.rejections = rejections + result.rejections
    return result


async def ingest_mcp(commands: Iterable[str | list[str]], cfg: SftConfig) -> IngestResult:
    """Tools of live MCP servers (stdio); a server that fails to start or list is a rejection."""
    raw_tools: list[RawTool] = []
    raw_servers: list[RawServer] = []
    rejections: list[Rejection] = []
    for command in commands:
        argv = parse_command(command)
        try:
            server_name, tools = await list_server_tools(argv, timeout_s=cfg.mcp_timeout_s)
        except McpServerError as err:
            rejections.append(_reject(shlex.join(argv), "mcp_unavailable", str(err), env_failure=True))
            continue
        name = f"mcp.{slug(server_name or Path(argv[0]).name)}"
        raw_servers.append(RawServer(name=name, source="mcp", title=server_name or argv[0],
                                     description=f"Live MCP server `{shlex.join(argv)}`", launch=argv))
        for t in tools:
            raw_tools.append(RawTool(server=name, name=t.name, description=t.description, parameters=t.input_schema,
                                     returns=t.output_schema, source="mcp", source_ref=shlex.join(argv)))
    result = finalise(raw_tools, raw_servers, cfg)
    result.rejections = rejections + result.rejections
    return result
