"""The Parquet dataset verl's RLHFDataset reads, one row per environment.

Columns: `data_source`, `prompt` (chat messages; verl applies the chat template with
`return_raw_chat`), `agent_name` (our registered loop), `reward_model.ground_truth` (the gold
sub-answers as JSON) and `extra_info` (`index`, `env_id`, `tools_kwargs.arena.create_kwargs.env_json`,
the whole environment record, so workers need no warehouse).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arenaforge.schemas.models import Environment
from arenaforge.tasks.rollout.episodes import DEFAULT_SYSTEM, initial_messages
from arenaforge.tasks.verl.agent_loop import env_payload

AGENT_NAME = "arena_agent"
DATA_SOURCE = "arenaforge"


def dataset_rows(envs: Sequence[Environment], system_prompt: str | None = DEFAULT_SYSTEM) -> list[dict[str, Any]]:
    rows = []
    for index, env in enumerate(envs):
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": m.role, "content": m.content or ""} for m in initial_messages(env, system_prompt)],
            "agent_name": AGENT_NAME,
            "ability": "tool_use",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(env.gold_answers)},
            "extra_info": {"index": index, "env_id": env.id, "need_tools_kwargs": True,
                           "tools_kwargs": env_payload(env)},
        })
    return rows


def write_dataset(envs: Sequence[Environment], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(dataset_rows(envs)), path)
    return path
