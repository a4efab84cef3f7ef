"""SFT flows through the CLI: ingest -> graph build -> sft synth (with export) -> graph show, on the sample corpus."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from typer.testing import CliRunner

import arenaforge.flows.sft_flows  # noqa: F401  (imports prefect now: its log handlers bind to the real stderr, not a CliRunner's)
from arenaforge.flows.cli import app
from arenaforge.flows.registry import FLOWS, load_flow
from arenaforge.schemas.models import JudgeScore, Run, Server, Trajectory

SAMPLE = Path(str(resources.files("arenaforge.data").joinpath("sample_tools")))


def _run(db: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["--db", str(db), *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _json(output: str) -> dict:
    """The JSON block a command prints first (its table of rejection reasons follows)."""
    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def test_sft_flows_are_registered_with_one_params_model():
    from arenaforge.flows.deployments import params_model

    for name in ("ingest", "graph", "sft"):
        assert FLOWS[name] == f"arenaforge.flows.sft_flows:{name}"
        flow = load_flow(name)
        assert flow.name == name and params_model(flow) is not None


def test_ingest_graph_sft_export_and_show_end_to_end(tmp_warehouse, tmp_path, monkeypatch, scripted_openai):
    monkeypatch.setenv("ARENAFORGE_SFT__USE_EMBEDDINGS", "false")
    monkeypatch.setenv("ARENAFORGE_OUT_DIR", str(tmp_path / "out"))
    db = tmp_warehouse.path
    counts = _json(_run(db, "ingest", str(SAMPLE)))
    assert counts["tools"] == 14 and counts["servers"] == 4 and counts["rejections"] == 4
    graph = _json(_run(db, "graph", "build"))
    assert graph["servers"] == 4 and graph["edges"] > 5
    synth = _json(_run(db, "sft", "synth", "--seed", "3", "--export", str(tmp_path / "sft")))
    assert synth["trajectories"] == synth["accepted_tasks"] > 0 and synth["scored"] == synth["trajectories"]
    assert synth["exported"] == synth["kept"] > 0
    assert (tmp_path / "sft" / "sft.parquet").exists() and (tmp_path / "sft" / "sft_stats.json").exists()
    runs = {r.flow: r for r in tmp_warehouse.load(Run)}
    assert {f: r.status for f, r in runs.items()} == {"ingest": "completed", "graph": "completed", "sft": "completed"}
    assert runs["sft"].counts["trajectories"] == synth["trajectories"]
    assert len(tmp_warehouse.load(Trajectory)) == synth["trajectories"]
    assert len(tmp_warehouse.load(JudgeScore)) == synth["scored"]
    assert {s.name for s in tmp_warehouse.load(Server)} == {"shop", "weather", "calendar", "notes"}

    shown = _run(db, "graph", "show", "shop", "--out", str(tmp_path / "shop.png"))
    assert "checkout" in shown and (tmp_path / "shop.png").read_bytes()[:4] == b"\x89PNG"
    exported = _json(_run(db, "sft", "export", "--out", str(tmp_path / "all")))
    assert exported["samples"] == synth["kept"]

    from tests.tasks.sft_responder import SftResponder

    scripted_openai.responder = SftResponder()  # the same flow on the openai backend
    model = _json(_run(db, "--backend", "openai", "--base-url", scripted_openai.url, "--model", "scripted",
                       "sft", "synth", "--server", "weather", "--seed", "4"))
    assert model["trajectories"] == model["accepted_tasks"] > 0 and model["scored"] == model["trajectories"]
    judged = tmp_warehouse.load(JudgeScore, where="run_id = ?", params=[model["run_id"]])
    assert {s.judge for s in judged} == {"model"} and len(judged) == model["scored"]


def test_ingest_without_inputs_is_a_one_line_error(tmp_warehouse):
    result = CliRunner().invoke(app, ["--db", str(tmp_warehouse.path), "ingest"])
    assert result.exit_code != 0
    assert "at least one PATH" in str(result.exception) or "at least one PATH" in result.output


def test_ingest_parses_mcp_options_between_paths(monkeypatch):
    import arenaforge.flows.sft_flows as sft_flows

    seen = {}
    monkeypatch.setattr(sft_flows, "ingest", lambda params: seen.setdefault("params", params) and {"tools": 0})
    result = CliRunner().invoke(app, ["ingest", "a", "--mcp", "mcp-server-git --repository .", "b", "--mcp", "t"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert seen["params"].paths == ["a", "b"] and seen["params"].mcp == ["mcp-server-git --repository .", "t"]
