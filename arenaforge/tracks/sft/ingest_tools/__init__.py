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

import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path

from arenaforge.schemas.config import SftConfig
from arenaforge.schemas.models import FunctionDoc, Rejection, Server, Tool
from arenaforge.tracks.sft.ingest_tools.formats import _clip, detect_format, read_records, records_to_raw
from arenaforge.tracks.sft.ingest_tools.records import _PROVENANCE, IngestResult, RawServer, RawTool, reject
from arenaforge.tracks.sft.ingest_tools.schemas import (
    MAX_DEPTH,
    SchemaProblem,
    check_schema_fast,
    nesting_depth,
    normalise_schema,
    response_schema,
    sanitize_name,
    slug,
)
from arenaforge.tracks.sft.mcp_client import McpServerError, list_server_tools, parse_command

__all__ = ["IngestResult", "RawServer", "RawTool", "check_schema_fast", "detect_format", "finalise", "ingest_mcp",
           "ingest_paths", "normalise_schema", "read_file", "response_schema"]

_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


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
            result.rejections.append(reject(
                f"{tool.server}/{tool.function.name}", "duplicate_name",
                f"another tool named {tool.function.name!r} with a different schema is already in server {tool.server!r} "
                f"(kept {existing.source_ref})", payload=tool.function.model_dump(mode="json")))
    meta = {s.name: s for s in raw_servers}
    for server_name, tools in by_server.items():
        names = sorted(tools)
        if len(names) > cfg.max_tools_per_server:
            for extra in names[cfg.max_tools_per_server:]:
                result.rejections.append(reject(f"{server_name}/{extra}", "too_many_tools",
                                                 f"server has {len(names)} tools, the limit is {cfg.max_tools_per_server}"))
            names = names[: cfg.max_tools_per_server]
        if len(names) < cfg.min_tools_per_server:
            for name in names:
                result.rejections.append(reject(f"{server_name}/{name}", "too_few_tools",
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
    try:
        return _normalise_checked(raw, cfg, subject)
    except RecursionError:
        return None, reject(subject, "invalid_schema", "the parameter schema is nested deeper than can be checked")


def _normalise_checked(raw: RawTool, cfg: SftConfig, subject: str) -> tuple[Tool | None, Rejection | None]:
    if nesting_depth(raw.parameters) > MAX_DEPTH or nesting_depth(raw.returns) > MAX_DEPTH:
        return None, reject(subject, "invalid_schema", f"the schema nests deeper than {MAX_DEPTH} levels")
    payload = _clip({"name": raw.name, "description": raw.description, "parameters": raw.parameters})
    name = raw.name if _NAME_OK.match(raw.name or "") else sanitize_name(raw.name or "")
    if not name:
        return None, reject(subject, "invalid_name", f"tool name {raw.name!r} has no usable characters", payload)
    description = " ".join(raw.description.split())
    if len(description) < cfg.min_description_chars:
        return None, reject(subject, "poor_description",
                             f"description has {len(description)} characters, at least {cfg.min_description_chars} "
                             "are needed", payload)
    try:
        params = normalise_schema(raw.parameters)
    except SchemaProblem as err:
        return None, reject(subject, "invalid_schema", str(err), payload)
    problem = check_schema_fast(params)
    if problem is not None:
        return None, reject(subject, "invalid_schema", f"not a JSON Schema: {problem}", payload)
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
    """Raw tools and servers of one file, its format detected from its first record. Any file is a result: a file
    that cannot be read or parsed is a rejection, and the other files of the run go on."""
    try:
        return _read_file(path)
    except RecursionError:
        return [], [], [reject(str(path), "malformed_json", "nested deeper than can be read (Python's recursion limit)")]
    except (OSError, UnicodeError) as err:
        return [], [], [reject(str(path), "unreadable_file", f"cannot read {path}: {err}")]


def _read_file(path: Path) -> tuple[list[RawTool], list[RawServer], list[Rejection]]:
    records, rejections = read_records(path)
    if not records:
        return [], [], rejections
    fmt = detect_format(records[0])
    if fmt is None:
        first = records[0]
        reason = "no_tool_documents"
        keys = sorted(first)[:8] if isinstance(first, dict) else type(first).__name__
        return [], [], rejections + [reject(str(path), reason,
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
            rejections.append(reject(str(path), "missing_path", "no such file or folder"))
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
            rejections.append(reject(str(path), "no_tool_documents",
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
            rejections.append(reject(shlex.join(argv), "mcp_unavailable", str(err), env_failure=True))
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
