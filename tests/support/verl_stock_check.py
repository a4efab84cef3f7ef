"""Run an `envs export` verl directory through stock verl 0.9.1's own code; print what came out as JSON.

Runs in the verl venv (.venv-verl, scripts/setup-verl.sh), from the repository root:

    .venv-verl/bin/python -m tests.support.verl_stock_check EXPORT_DIR MODEL_DIR

What is verl's own: the trainer config (`verl/trainer/config/ppo_trainer.yaml`, composed with hydra
and our job's overrides: an override verl does not know fails here), `RLHFDataset` reading the
Parquet files, `collate_fn` and `DataProto`, `AgentLoopWorker` (agent-loop registration from
agent_loops.yaml, tools from tool_config.yaml, the `tool_agent` and `arena_agent` loops, padding and
masks) and the custom reward function as verl loads it. What is not: the LLM. `ScriptedLLMClient`
subclasses verl's `LLMServerClient` and replays each environment's gold calls in hermes format (the
one double the project allows), so no Ray cluster or vLLM is needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any


def compose_config(files: Any, model: str) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    from arenaforge.tracks.train.params import GrpoParams
    from arenaforge.tracks.train.verl.job import VerlJobSpec, hydra_overrides

    spec = VerlJobSpec.from_params(GrpoParams(), model_path=model, out_dir=str(files.train.parent / "job"),
                                   train_batch_size=4, max_prompt_length=2048, max_response_length=2048,
                                   max_turns=12, tensor_parallel=1, gpus_per_node=1, group_size=2)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=hydra_overrides(spec, files))


def main(export_dir: str, model: str) -> dict[str, Any]:
    import numpy as np
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    from arenaforge.tracks.train.verl.dataset import VerlFiles, load_environment

    root = Path(export_dir)
    files = VerlFiles(root / "train.parquet", root / "val.parquet", root / "environments.jsonl",
                      root / "agent_loops.yaml", root / "tool_config.yaml")
    cfg = compose_config(files, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    dataset = RLHFDataset(data_files=[str(files.train), str(files.val)], tokenizer=tokenizer, config=cfg.data)
    rows = [dataset[i] for i in range(len(dataset))]

    envs = {r["extra_info"]["env_id"]: load_environment(files.environments, r["extra_info"]["env_id"]) for r in rows}
    by_question = {r["raw_prompt"][-1]["content"]: r["extra_info"]["env_id"] for r in rows}
    assert len(by_question) == len(rows), "the check tells samples apart by their question"
    verl_names = {(r["extra_info"]["env_id"], kw["create_kwargs"]["function"]): name
                  for r in rows for name, kw in (r["extra_info"]["tools_kwargs"] or {}).items() if kw}

    class ScriptedLLMClient(LLMServerClient):
        """verl's server client with the model replaced: the sample's gold calls, one per turn, then an answer."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.requests: list[dict[str, Any]] = []

        async def generate(self, request_id: Any, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           **kwargs: Any) -> TokenOutput:
            self.requests.append(dict(sampling_params))
            text = tokenizer.decode(prompt_ids)
            env = envs[next(env_id for question, env_id in by_question.items() if question in text)]
            done = text.count("<tool_response>")
            if done < len(env.calls):
                call = env.calls[done]
                name = verl_names.get((env.id, call.tool), call.tool)
                reply = f'<tool_call>\n{json.dumps({"name": name, "arguments": call.arguments})}\n</tool_call>'
            else:
                reply = f"The answer is {env.gold_answers[-1]}."
            ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
            return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")

    reward_fn = get_custom_reward_fn(cfg)
    report: dict[str, Any] = {"rows": len(rows), "splits": sorted({r["extra_info"]["split"] for r in rows}),
                              "first_row": {"agent_name": rows[0]["agent_name"],
                                            "tools_kwargs": _plain(rows[0]["tools_kwargs"]),
                                            "tool_selection": list(rows[0]["extra_info"]["tool_selection"])}}
    async def rollout(agent: str) -> tuple[Any, Any]:
        client = ScriptedLLMClient(cfg)
        worker = AgentLoopWorker(cfg, llm_client=client)
        batch = DataProto.from_single_dict(collate_fn(rows))
        batch.non_tensor_batch["agent_name"] = np.array([agent] * len(rows), dtype=object)
        batch.meta_info = {"global_steps": 1, "validate": False}
        return client, await worker.generate_sequences(batch)

    async def both() -> dict[str, Any]:  # one event loop, as in a verl worker: the sandbox pool lives in it
        return {agent: await rollout(agent) for agent in ("arena_agent", "tool_agent")}

    for agent, (client, out) in asyncio.run(both()).items():
        width = out.batch["responses"].shape[1]
        responses = [tokenizer.decode(ids[attn[-width:].bool()]) for ids, attn in
                     zip(out.batch["responses"], out.batch["attention_mask"], strict=True)]
        scores = [reward_fn(data_source=r["data_source"], solution_str=text, ground_truth=r["reward_model"]["ground_truth"],
                            extra_info=r["extra_info"]) for r, text in zip(rows, responses, strict=True)]
        report[agent] = {
            "samples": len(responses),
            "model_tokens": [int(m.sum()) for m in out.batch["response_mask"]],
            "response_tokens": [int(a[-width:].sum()) for a in out.batch["attention_mask"]],
            "rm_scores": [float(s.sum()) for s in out.batch["rm_scores"]] if "rm_scores" in out.batch.keys() else None,
            "reward_fn": [s["score"] for s in scores],
            "tool_responses": [t.count("<tool_response>") for t in responses],
            "gold_calls": [len(envs[r["extra_info"]["env_id"]].calls) for r in rows],
            "requests": len(client.requests),
            "logprobs_requested": all(req.get("logprobs") for req in client.requests),
        }
    return report


def _plain(value: Any) -> Any:
    """numpy/Arrow leftovers -> JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


if __name__ == "__main__":
    os.environ.setdefault("ARENAFORGE_SANDBOX__BACKEND", "process")
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
