"""Ingestion: format detection, normalisation to valid JSON Schema, filters with reasons, live MCP servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.schemas.config import SftConfig
from arenaforge.schemas.contracts import check_json_schema
from arenaforge.tracks.sft.ingest_tools import (
    check_schema_fast,
    detect_format,
    ingest_mcp,
    ingest_paths,
    normalise_schema,
)
from arenaforge.tracks.sft.mcp_client import McpServerError, McpSession

SAMPLE = Path(str(resources.files("arenaforge.data").joinpath("sample_tools")))
VENV_BIN = Path(sys.executable).parent
FLAKY = [sys.executable, "-m", "tests.support.flaky_mcp_server"]


def _write(path: Path, records, jsonl: bool = True) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n" if jsonl else json.dumps(records))
    return path


def test_sample_corpus_groups_servers_and_records_every_rejection():
    result = ingest_paths([SAMPLE], SftConfig())
    servers = {s.name: s for s in result.servers}
    assert set(servers) == {"shop", "weather", "calendar", "notes"}
    assert servers["shop"].tool_names == ["add_to_cart", "checkout", "get_product", "search_products", "track_order"]
    assert servers["calendar"].source == "astra" and servers["calendar"].domain == "productivity"
    reasons = Counter(r.reason for r in result.rejections)
    assert reasons == {"malformed_json": 1, "duplicate_name": 1, "invalid_schema": 1, "poor_description": 1}
    assert {r.subject for r in result.rejections if r.reason != "malformed_json"} == {
        "notes/create_note", "notes/delete_note", "notes/tag_note"}
    assert all(check_json_schema(t.function.parameters) is None for t in result.tools)
    shop = {t.function.name: t for t in result.tools if t.server == "shop"}
    assert shop["checkout"].returns["properties"]["order_id"] == {"type": "string"}


def test_bfcl_types_become_json_schema():
    raw = {"type": "dict", "properties": {
        "base": {"type": "float", "description": "b"}, "pair": {"type": "tuple", "items": {"type": "integer"}},
        "anything": {"type": "any"}, "opts": {"type": "dict", "properties": {"x": {"type": "String"}}, "required": ["x"]},
        "flag": {"type": "boolean", "optional": True, "default": True}}, "required": ["base", "flag"]}
    schema = normalise_schema(raw)
    assert schema["type"] == "object" and schema["required"] == ["base"]
    assert schema["properties"]["base"]["type"] == "number"
    assert schema["properties"]["pair"] == {"type": "array", "items": {"type": "integer"}}
    assert "type" not in schema["properties"]["anything"]
    assert schema["properties"]["opts"]["properties"]["x"]["type"] == "string"
    assert check_json_schema(schema) is None


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "[unclosed"}}},
    {"type": "object", "properties": {"a": {"type": "strin"}}},
    {"type": "object", "required": "a"},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"minItems": -1}}}},
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"enum": "x"}]}}},
    {"type": "object", "properties": {"a": {"type": "string", "description": "fine"}}, "required": ["a"]},
])
def test_fast_schema_check_agrees_with_the_meta_schema(schema):
    assert (check_schema_fast(schema) is None) == (check_json_schema(schema) is None)


def test_formats_are_detected_per_file(tmp_path):
    tb = {"query": "q", "api_list": [
        {"category_name": "Data", "tool_name": "The Clique", "api_name": "Songkick concert", "api_description": "Concert info",
         "required_parameters": [{"name": "id_conc", "type": "STRING", "description": "", "default": "x"}],
         "optional_parameters": [{"name": "when", "type": "DATE (YYYY-MM-DD)", "description": "day"}],
         "template_response": {"date": "str", "line_up": [{"name": "str", "_list_length": 2}]}},
        {"category_name": "Data", "tool_name": "The Clique", "api_name": "empty", "api_description": "",
         "required_parameters": [], "optional_parameters": []}]}
    _write(tmp_path / "G1.json", [tb, tb], jsonl=False)  # the same API twice: one tool, not a duplicate
    ace = {"id": "agent_1", "question": "turn on wifi", "involved_classes": ["BaseApi"],
           "function": [{"name": "turn_on_wifi", "description": "Turn on WiFi connection.", "parameters": {"type": "dict", "properties": {}, "required": []}}]}
    _write(tmp_path / "ace.json", [ace])
    _write(tmp_path / "answers.json", [{"id": "x", "ground_truth": {"f": {}}}])
    (tmp_path / "README.md").write_text("not a tool file")
    result = ingest_paths([tmp_path], SftConfig())
    tools = {t.function.name: t for t in result.tools}
    assert set(tools) == {"Songkick_concert", "turn_on_wifi"}
    concert = tools["Songkick_concert"]
    assert concert.server == "toolbench.the-clique" and concert.source == "stabletoolbench"
    assert concert.function.parameters["required"] == ["id_conc"]
    assert concert.function.parameters["properties"]["when"] == {"type": "string", "description": "day", "format": "date"}
    assert concert.returns["properties"]["line_up"] == {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
    assert tools["turn_on_wifi"].server == "acebench.BaseApi"
    reasons = {(r.reason, Path(r.subject).name if "/" in r.subject and r.reason == "no_tool_documents" else r.subject) for r in result.rejections}
    assert ("no_tool_documents", "answers.json") in reasons
    assert ("poor_description", "toolbench.the-clique/empty") in reasons
    assert detect_format({"type": "function", "function": {"name": "f"}}) == "openai"
    assert detect_format({"id": 1, "question": [[]], "function": []}) == "bfcl"


def test_folder_without_tool_docs_and_missing_path_are_rejected(tmp_path):
    (tmp_path / "db.json").write_text(json.dumps({"users": {}, "orders": {}}))
    result = ingest_paths([tmp_path, tmp_path / "nope"], SftConfig())
    assert result.tools == [] and result.servers == []
    assert Counter(r.reason for r in result.rejections) == {"no_tool_documents": 2, "missing_path": 1}


def test_filters_min_tools_and_max_tools(tmp_path):
    fns = [{"name": f"tool_{i}", "description": f"Does thing number {i} well.", "parameters": {"type": "object", "properties": {}}}
           for i in range(3)]
    _write(tmp_path / "svc.json", fns, jsonl=False)
    few = ingest_paths([tmp_path], SftConfig(min_tools_per_server=4))
    assert few.servers == [] and Counter(r.reason for r in few.rejections) == {"too_few_tools": 3}
    many = ingest_paths([tmp_path], SftConfig(max_tools_per_server=2))
    assert many.servers[0].tool_names == ["tool_0", "tool_1"]
    assert [r.subject for r in many.rejections] == ["svc/tool_2"]


@pytest.mark.shared_data
def test_every_shared_tool_doc_folder_loads(shared_data):
    cfg = SftConfig()
    for folder, source in (("bfcl_single_turn", "bfcl"), ("acebench", "acebench"), ("stabletoolbench", "stabletoolbench")):
        result = ingest_paths([shared_data / folder], cfg)
        assert len(result.tools) > 500 and len(result.servers) > 100, folder
        assert {t.source for t in result.tools} == {source}
        assert all(check_json_schema(t.function.parameters) is None for t in result.tools[::25])
    for folder in ("tau2_retail", "tau2_mock"):
        tau = ingest_paths([shared_data / folder], cfg)
        assert tau.tools == [] and any(r.reason == "no_tool_documents" and r.subject.endswith(folder) for r in tau.rejections)


def test_live_mcp_servers_time_and_git_are_ingested(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    result = asyncio.run(ingest_mcp([str(VENV_BIN / "mcp-server-time"),
                                     f"{VENV_BIN / 'mcp-server-git'} --repository {tmp_path}"], SftConfig()))
    servers = {s.name: s for s in result.servers}
    assert set(servers) == {"mcp.mcp-time", "mcp.mcp-git"}
    assert servers["mcp.mcp-time"].tool_names == ["convert_time", "get_current_time"]
    assert servers["mcp.mcp-time"].launch == [str(VENV_BIN / "mcp-server-time")]
    assert "git_status" in servers["mcp.mcp-git"].tool_names
    now = next(t for t in result.tools if t.function.name == "get_current_time")
    assert now.source == "mcp" and now.returns["required"] == ["timezone", "datetime", "day_of_week", "is_dst"]
    assert now.function.parameters["required"] == ["timezone"]


def test_mcp_servers_that_fail_to_start_are_rejections():
    result = asyncio.run(ingest_mcp(["/nonexistent/mcp-server", [*FLAKY, "--no-handshake"]], SftConfig(mcp_timeout_s=2)))
    assert result.tools == []
    assert [r.reason for r in result.rejections] == ["mcp_unavailable", "mcp_unavailable"]
    assert all(r.environment_failure for r in result.rejections)
    assert "handshake" in result.rejections[1].detail


def test_mcp_session_turns_hangs_and_deaths_into_observations():
    async def scenario():
        async with McpSession(FLAKY, call_timeout_s=1.0, cwd=str(Path(__file__).resolve().parents[3])) as s:
            names = sorted(t.name for t in await s.list_tools())
            ok, env1 = await s.call("echo", {"text": "hi"})
            hung, env2 = await s.call("hang", {})
            after, env3 = await s.call("echo", {"text": "again"})
        async with McpSession(FLAKY, call_timeout_s=5.0, cwd=str(Path(__file__).resolve().parents[3])) as s:
            died, env4 = await s.call("die", {})
        return names, (ok, env1), (hung, env2), (after, env3), (died, env4)

    names, ok, hung, after, died = asyncio.run(scenario())
    assert names == ["die", "echo", "hang"]
    assert ok[0].outcome == "ok" and json.loads(ok[0].output) == {"text": "hi", "length": 2} and not ok[1]
    assert hung[0].outcome == "timeout" and hung[1]
    assert after[0].outcome == "error" and "unavailable" in after[0].error and after[1]
    assert died[0].outcome in ("error", "timeout") and died[1]


def test_mcp_session_start_failure_raises_input_error():
    async def go():
        async with McpSession(["/nonexistent/binary"]):
            pass

    with pytest.raises(McpServerError, match="nonexistent"):
        asyncio.run(go())


def test_ingest_survives_any_file_and_keeps_the_good_ones(tmp_path):
    """A 100k-deep nested document, binary garbage and a deep parameter schema beside a good file: the good tools
    are kept, each bad file is a rejection with its reason, nothing raises."""
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "garbage.json").write_bytes(bytes(range(256)) * 8)
    depth = 400  # readable by json, deeper than a schema walk can go
    deep_schema = '{"type": "object", "properties": {"x": ' * depth + '{"type": "object"}' + "}}" * depth
    (tmp_path / "deep_schema.json").write_text(
        '[{"name": "deep_tool", "description": "A tool whose schema nests very deeply.", "parameters": '
        + deep_schema + "}]")
    (tmp_path / "good.json").write_text(json.dumps(
        [{"name": "get_weather", "description": "Current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]))
    result = ingest_paths([tmp_path], SftConfig())
    assert [t.function.name for t in result.tools] == ["get_weather"]
    reasons = {(Path(r.subject.split(":")[0]).name if r.subject.startswith("/") else r.subject, r.reason)
               for r in result.rejections}
    assert ("deep.json", "malformed_json") in reasons and ("garbage.json", "malformed_json") in reasons, reasons
    assert any(reason == "invalid_schema" and "deep_tool" in subject for subject, reason in reasons), reasons
