"""What verl 0.9.1 reads, written side by side in one directory (`write_dataset_dir`):

    train.parquet, val.parquet  one row per environment, for verl's RLHFDataset: `prompt` (chat messages),
                                `agent_name` (arena_agent), `reward_model.ground_truth` (gold sub-answers, JSON),
                                `extra_info` {index, env_id, split, need_tools_kwargs, tools_kwargs, tool_selection},
                                `tools` (the environment's OpenAI tool list at turn 0, JSON: format 2 reveals some later)
    environments.jsonl          the Environment records, looked up by id by the loop and the tools
    agent_loops.yaml            registers `arena_agent` (actor_rollout_ref.rollout.agent.agent_loop_config_path)
    tool_config.yaml            every tool as a verl BaseTool (actor_rollout_ref.rollout.multi_turn.tool_config_path),
                                for verl's stock `tool_agent` loop

Two loops can run the rows. `arena_agent` (ours, `verl_adapter.ArenaAgentLoop`) runs the whole episode in one
sandbox session and sets the F1 reward itself. verl's stock `ToolAgentLoop` (`agent_name: tool_agent`) looks
each called tool up by name among the tools of `tool_config.yaml`, keeps a sample to the names in
`extra_info.tool_selection`, and creates the tool with `extra_info.tools_kwargs[<name>].create_kwargs`
({env_id, function}); the reward then comes from `reward.compute_score`.

verl's tool names are global (one BaseTool, one schema, per name) while ours belong to an environment:
tools with the same name and schema share one verl tool; a name seen again with another schema gets a
numbered suffix (`lookup_2`) in verl, and its create_kwargs name the environment's own function.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arenaforge.schemas.models import Environment, FunctionDoc
from arenaforge.tracks.train.rollout.episodes import DEFAULT_SYSTEM, initial_messages

AGENT_NAME = "arena_agent"
AGENT_LOOP_TARGET = "arenaforge.tracks.train.verl.verl_adapter.ArenaAgentLoop"
TOOL_CLASS = "arenaforge.tracks.train.verl.verl_adapter.VerlArenaTool"
DATA_SOURCE = "arenaforge"


@dataclass(frozen=True)
class VerlFiles:
    """Paths of one written dataset directory (absolute)."""

    train: Path
    val: Path
    environments: Path
    agent_config: Path
    tool_config: Path


def verl_tool_names(envs: Sequence[Environment]) -> tuple[dict[tuple[str, str], str], dict[str, FunctionDoc]]:
    """({(env id, function): verl tool name}, {verl tool name: schema}) over every tool of `envs`."""
    by_name: dict[str, list[tuple[str, FunctionDoc]]] = {}
    names: dict[tuple[str, str], str] = {}
    schemas: dict[str, FunctionDoc] = {}
    for env in envs:
        for tool in env.tools:
            key = json.dumps(tool.model_dump(mode="json", exclude={"name"}), sort_keys=True)
            variants = by_name.setdefault(tool.name, [])
            match = next((n for k, n in variants if k == key), None)
            if match is None:
                match = tool.name if not variants else f"{tool.name}_{len(variants) + 1}"
                variants.append((key, match))
                schemas[match] = tool.model_copy(update={"name": match})
            names[(env.id, tool.name)] = match
    return names, schemas


def dataset_rows(envs: Sequence[Environment], names: dict[tuple[str, str], str], split: str,
                 system_prompt: str | None = DEFAULT_SYSTEM) -> list[dict[str, Any]]:
    rows = []
    for index, env in enumerate(envs):
        own = {names[(env.id, t.name)]: t.name for t in env.tools}
        first = env.visible_tools(0)  # format 2: a tool revealed at a later turn is not offered in the prompt
        rows.append({
            "data_source": f"{DATA_SOURCE}/{env.name.rsplit('-', 1)[0]}",
            "prompt": [{"role": m.role, "content": m.content or ""} for m in initial_messages(env, system_prompt)],
            "agent_name": AGENT_NAME,
            "ability": "tool_use",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(env.gold_answers)},
            "extra_info": {
                "index": index, "env_id": env.id, "split": split, "need_tools_kwargs": True,
                "tools_kwargs": {verl: {"create_kwargs": {"env_id": env.id, "function": fn}} for verl, fn in own.items()},
                "tool_selection": [names[(env.id, t.name)] for t in first],
                "provenance": env.lineage(),
            },
            "tools": json.dumps([t.as_openai_tool() for t in first]),
        })
    return rows


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path


def _yaml(value: Any) -> str:
    """YAML via JSON (a YAML subset): no YAML writer needed and no quoting surprises in schemas."""
    return json.dumps(value, indent=2) + "\n"


def write_dataset_dir(train: Sequence[Environment], val: Sequence[Environment], out_dir: str | Path) -> VerlFiles:
    """Write the Parquet splits, the environments and both verl config files under `out_dir`."""
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    everything = list({e.id: e for e in [*train, *val]}.values())
    names, schemas = verl_tool_names(everything)
    files = VerlFiles(out / "train.parquet", out / "val.parquet", out / "environments.jsonl",
                      out / "agent_loops.yaml", out / "tool_config.yaml")
    _write_parquet(dataset_rows(train, names, "train"), files.train)
    _write_parquet(dataset_rows(val, names, "val"), files.val)
    tmp = files.environments.with_name(files.environments.name + ".tmp")
    tmp.write_text("".join(e.model_dump_json() + "\n" for e in everything))
    tmp.replace(files.environments)
    files.agent_config.write_text(_yaml([{"name": AGENT_NAME, "_target_": AGENT_LOOP_TARGET,
                                          "environments": str(files.environments)}]))
    files.tool_config.write_text(_yaml({"tools": [
        {"class_name": TOOL_CLASS, "config": {"type": "native", "environments": str(files.environments)},
         "tool_schema": schema.as_openai_tool()} for schema in schemas.values()]}))
    return files


@functools.lru_cache(maxsize=8)
def _environment_lines(path: str) -> dict[str, str]:
    lines: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lines[json.loads(line)["id"]] = line
    return lines


def load_environment(environments: str | Path, env_id: str) -> Environment:
    """One Environment of an `environments.jsonl` (the file is indexed once per process)."""
    line = _environment_lines(str(environments)).get(env_id)
    if line is None:
        raise KeyError(f"environment {env_id} is not in {environments}")
    return Environment.model_validate_json(line)


def write_verl(envs: Sequence[Environment], out_dir: str | Path, held_out: Collection[str] = ()) -> VerlFiles:
    """verl 0.9.1's files for `envs` (train/val Parquet, environments, agent-loop and tool configs) in `out_dir`.

    `envs export --format verl` writes it (`export_environments(..., write_verl=write_verl)`). val holds the
    environments in `held_out` (the warehouse's test split, `held_out_ids`): what `eval` scores is what verl
    validates on, and no test environment reaches verl's training data.
    """
    val = [e for e in envs if e.id in held_out]
    if not val and len(envs) > 1:  # verl validates before training: a small export still gets one val row
        val = [min(envs, key=lambda e: e.id)]
    held = {e.id for e in val}
    return write_dataset_dir([e for e in envs if e.id not in held], val, out_dir)
