"""Tool-document formats: detecting one from a record, and reading a file's records as raw tools and servers.

  openai          OpenAI function JSON: a list / JSONL of {"type": "function", "function": {...}} or bare functions
                  (the server is the file's stem, or a record's "server" key)
  astra           MCP server records: {name|title, description, domain, tools: [...]} (tools in OpenAI or MCP form)
  bfcl            BFCL question records: {id, question: [[...]], function: [...]} with `dict`/`float`/`tuple`/`any` types
  acebench        ACEBench records: {id, question: "...", function: [...]} (agent records grouped by involved class)
  stabletoolbench StableToolBench queries: [{query, api_list: [{tool_name, api_name, required_parameters, ...}]}]

A new format is a branch in `detect_format` and one in `records_to_raw`, here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import Rejection
from arenaforge.tracks.sft.ingest_tools.records import RawServer, RawTool, reject
from arenaforge.tracks.sft.ingest_tools.schemas import response_schema, slug
from arenaforge.tracks.sft.mcp_client import parse_command


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
                rejections.append(reject(f"{path}:{n}", "malformed_json", f"line {n}: {err.msg} at column {err.colno}",
                                          payload=line[:2000]))
        if not records:  # not JSON-lines either: one malformed document
            return [], [reject(str(path), "malformed_json", f"{whole_err.msg} at line {whole_err.lineno}")]
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
            rejections.append(reject(ref, "unrecognised_format", f"record is not a {fmt} tool document",
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
                    rejections.append(reject(f"{ref}/tools/{j}", "unrecognised_format", "tool entry is not an object"))
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
