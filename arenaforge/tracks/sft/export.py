"""Export kept trajectories as SFT data in the OpenAI chat-with-tools format, JSONL and Parquet, with statistics.

One row per trajectory whose latest judge score has `keep` (view `v_sft_kept`), optionally one
run only or above a stricter score. `sft.jsonl` is the format the field trains on (what
`tokenizer.apply_chat_template(messages, tools=tools)`, TRL and `arenaforge train sft` read):

    {"messages": [{"role": "user", "content": "..."},
                  {"role": "assistant", "content": "", "tool_calls": [{"id": "...", "type": "function",
                   "function": {"name": "...", "arguments": "{...}"}}]},
                  {"role": "tool", "tool_call_id": "...", "name": "...", "content": "..."}, ...],
     "tools": [{"type": "function", "function": {"name": "...", "description": "...", "parameters": {...}}}],
     "id": "...", "server": "...", "score": 0.91,
     "provenance": {"record_id": "...", "run_id": "...", "backend": "openai", "model": "...", "prompt_hash": "...",
                    "source": "<server>"}}

A message carries only the keys that apply to its role (no null keys); `content` is always a
string; `arguments` is the JSON string OpenAI sends. `sft.parquet` holds the same rows, except
that `tools` is one JSON string per row: tool parameter schemas differ in shape from tool to
tool, which one Arrow column type cannot hold (`json.loads(row["tools"])` gives the list).

The statistics mirror the paper's SFT-set report (METHOD.md §1a.5): samples, messages, messages
and tool calls per sample, the distribution of tool-call counts (share with 1-5 calls), distinct
functions called, plus judge scores and the achieved fault-injection rate.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arenaforge.schemas.models import ChatMessage, JudgeScore, Trajectory
from arenaforge.warehouse.db import Warehouse
from arenaforge.warehouse.lookups import by_ids, kept_trajectory_scores

_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                   ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(_CALL)),
                      ("tool_call_id", pa.string()), ("name", pa.string())])
_LINEAGE = pa.struct([(k, pa.string()) for k in ("record_id", "run_id", "backend", "model", "prompt_hash", "source")])
SCHEMA = pa.schema([("messages", pa.list_(_MESSAGE)), ("tools", pa.string()), ("id", pa.string()),
                    ("server", pa.string()), ("score", pa.float64()), ("provenance", _LINEAGE)])


def kept_trajectories(wh: Warehouse, run_id: str | None = None, min_score: float | None = None
                      ) -> list[tuple[Trajectory, float]]:
    """Trajectories the judge kept (optionally of one run, at least `min_score`), by id, with their scores."""
    score = kept_trajectory_scores(wh, run_id, min_score)
    if not score:
        return []
    trajectories = by_ids(wh, Trajectory, list(score))
    return [(t, score[t.id]) for t in sorted(trajectories, key=lambda t: t.id)]


def openai_message(m: ChatMessage) -> dict[str, Any]:
    """One message in OpenAI's shape with only the keys its role uses (content always a string)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump(mode="json") for c in m.tool_calls]
    if m.role == "tool":
        out.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v is not None})
    return out


def sft_row(t: Trajectory, score: float) -> dict[str, Any]:
    """The JSONL row: OpenAI messages + tools, then id/server/score and where it came from."""
    return {"messages": [openai_message(m) for m in t.messages], "tools": [f.as_openai_tool() for f in t.tools],
            "id": t.id, "server": t.server, "score": score, "provenance": t.lineage(source=t.server)}


def _lines(row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The JSONL line (exactly `json.dumps(row, ensure_ascii=False)`) and the Parquet row, the tools encoded once:
    both carry the same text, and the tools are most of a row."""
    tools = json.dumps(row["tools"], ensure_ascii=False)
    rest = {k: v for k, v in row.items() if k not in ("messages", "tools")}
    line = ('{"messages": ' + json.dumps(row["messages"], ensure_ascii=False) + ', "tools": ' + tools + ", "
            + json.dumps(rest, ensure_ascii=False)[1:])
    return line, {**row, "tools": tools}


def statistics(items: list[tuple[Trajectory, float]], scores: list[JudgeScore] | None = None) -> dict[str, Any]:
    n = len(items)
    msgs = [len(t.messages) for t, _ in items]
    calls = [t.tool_calls for t, _ in items]
    functions = Counter(c.function.name for t, _ in items for m in t.messages for c in (m.tool_calls or []))
    dist = Counter(calls)
    faults = sum(t.faults_injected for t, _ in items)
    sim_calls = sum(t.tool_calls for t, _ in items if t.executor == "simulator")
    return {
        "samples": n,
        "messages": sum(msgs),
        "messages_per_sample": round(sum(msgs) / n, 2) if n else 0.0,
        "tool_calls_per_sample": round(sum(calls) / n, 2) if n else 0.0,
        "share_1_to_5_calls": round(sum(v for k, v in dist.items() if 1 <= k <= 5) / n, 4) if n else 0.0,
        "tool_call_distribution": {str(k): dist[k] for k in sorted(dist)},
        "distinct_functions": len(functions),
        "servers": len({t.server for t, _ in items}),
        "mean_score": round(sum(s for _, s in items) / n, 4) if n else 0.0,
        "faults_injected": faults,
        "achieved_fault_rate": round(faults / sim_calls, 4) if sim_calls else 0.0,
        "executors": dict(Counter(t.executor for t, _ in items)),
    }


def export_sft(wh: Warehouse, out_dir: str | Path, run_id: str | None = None, min_score: float | None = None,
               name: str = "sft") -> dict[str, Any]:
    """Write <out_dir>/<name>.jsonl, .parquet and _stats.json; returns the statistics with the paths."""
    out = Path(out_dir).expanduser().resolve()  # the report names absolute paths
    out.mkdir(parents=True, exist_ok=True)
    items = kept_trajectories(wh, run_id, min_score)
    lines, rows = zip(*(_lines(sft_row(t, s)) for t, s in items)) if items else ((), ())
    jsonl = out / f"{name}.jsonl"
    parquet = out / f"{name}.parquet"
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")
    tmp.replace(jsonl)
    tmp = parquet.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(list(rows), schema=SCHEMA), tmp)
    tmp.replace(parquet)
    stats = statistics(items)
    report = out / f"{name}_stats.json"
    report.write_text(json.dumps(stats, indent=2) + "\n")
    return {**stats, "jsonl": str(jsonl), "parquet": str(parquet), "report": str(report)}
