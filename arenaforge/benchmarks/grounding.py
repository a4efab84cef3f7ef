"""`arenaforge bench grounding`: grounded argument decoding vs free argument values, side by side in one run.

One checkpoint, the same test environments, greedy, training's episode limits, constrained decoding on in both
arms; the only difference is `EpisodeParams.ground_arguments`. Per arm: test F1 / recall / precision, calls and
format errors per episode, how many calls name a gold tool and how many of those carry exactly the gold arguments,
and the policy's generated tokens per second of evaluation wall clock (tool time included, as `eval run` spends
it), after a warm-up on two environments. Each arm is stored as an `eval` run in the warehouse. With `--bfcl-limit N`: BFCL single-turn accuracy
(the `bench learning` scorer) for both arms too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.models import Environment, Rollout
from arenaforge.warehouse import Warehouse


def _call_diagnostics(rollouts: Sequence[Rollout], envs: dict[str, Environment]) -> dict[str, Any]:
    """Calls that name a gold tool of their environment, and of those the ones with exactly a gold call's arguments."""
    calls = gold_tool = exact = 0
    for r in rollouts:
        gold = envs[r.env_id].calls
        for m in r.messages:
            for call in m.tool_calls or []:
                calls += 1
                if any(g.tool == call.function.name for g in gold):
                    gold_tool += 1
                    try:
                        args = json.loads(call.function.arguments)
                    except ValueError:
                        continue
                    exact += any(g.tool == call.function.name and g.arguments == args for g in gold)
    return {"calls": calls, "gold_tool_share": round(gold_tool / calls, 4) if calls else 0.0,
            "exact_args_share_of_gold_tool": round(exact / gold_tool, 4) if gold_tool else 0.0}


async def _arm(cfg: Any, wh: Warehouse, model_path: str, envs: list[Environment], ground: bool) -> dict[str, Any]:
    from arenaforge.tracks.train.evaluation import evaluate_as_run
    from arenaforge.tracks.train.params import TRAIN_EPISODE, PolicyParams

    episode = TRAIN_EPISODE.model_copy(update={"temperature": 0.0, "ground_arguments": ground})
    started = time.perf_counter()
    rollouts: list[Rollout] = []
    row = await evaluate_as_run(cfg, wh, PolicyParams(model_path=model_path), model_path, envs, episode,
                                label=f"grounding bench, ground_arguments={ground}", rollouts_out=rollouts,
                                samples=1, seed=0, concurrency=32)
    seconds = time.perf_counter() - started
    tokens = sum(sum(r.response_mask) for r in rollouts)
    return {"f1": round(row["f1"], 4), "recall": round(row["recall"], 4), "precision": round(row["precision"], 4),
            "calls_per_episode": round(row["calls_per_task"], 3),
            "format_errors_per_episode": round(row["format_errors_per_task"], 3), "episodes": row["episodes"],
            **_call_diagnostics(rollouts, {e.id: e for e in envs}), "model_tokens": tokens,
            "seconds": round(seconds, 1), "model_tokens_per_s": round(tokens / seconds, 1) if seconds else None,
            "eval_run_id": row["run_id"], "statuses": row["statuses"],
            "episode_f1": {r.env_id: r.reward.f1 for r in rollouts if r.status != "env_failure"}}


async def _bfcl(model_path: str, limit: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arenaforge.services.policy.hf import HfEngine
    from arenaforge.tracks.train.rollout.bfcl import BfclUnavailable, evaluate_bfcl, load_bfcl

    try:
        items, origin = load_bfcl(limit=limit)
    except BfclUnavailable as err:
        return {"skipped": str(err)}
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = HfEngine(AutoModelForCausalLM.from_pretrained(model_path), tokenizer, policy=model_path)
    out: dict[str, Any] = {"data": origin, "per_category_limit": limit}
    for label, ground in (("free", False), ("grounded", True)):
        started = time.perf_counter()
        result = await evaluate_bfcl(engine, tokenizer, items, ground=ground)
        out[label] = {"accuracy": result["accuracy"],
                      "by_category": {k: v["accuracy"] for k, v in result["categories"].items()},
                      "seconds": round(time.perf_counter() - started, 1)}
    return out


async def main(db: str = "", model_path: str = "", env_limit: int = 60, split: str = "test",
               bfcl_limit: int = 0, sandbox: str = "process") -> dict[str, Any]:
    """Free vs grounded argument values on one checkpoint: F1, call diagnostics, tokens/s (and BFCL).

    Args:
        db: The warehouse holding the environments (required; e.g. a `bench learning` run's learning.duckdb).
        model_path: The policy checkpoint (empty: the default policy, arena-small).
        env_limit: Evaluate on at most this many environments.
        split: Environment split: test, train or all.
        bfcl_limit: BFCL single-turn questions per category (0: skip BFCL).
        sandbox: Sandbox backend: process, docker or auto.
    """
    from arenaforge.benchmarks.learning import bootstrap_ci
    from arenaforge.schemas.config import load_config
    from arenaforge.schemas.errors import InputError
    from arenaforge.tracks.train.env_selection import select_envs
    from arenaforge.tracks.train.model_paths import model_path_for
    from arenaforge.tracks.train.params import EnvSelection

    if not db:
        raise InputError("--db: the warehouse holding the environments (e.g. a `bench learning` run's learning.duckdb)")
    os.environ["ARENAFORGE_SANDBOX__BACKEND"] = sandbox
    cfg = load_config(None, overrides={"warehouse.path": db, "sandbox.backend": sandbox})
    wh = Warehouse(db)
    envs = select_envs(wh, EnvSelection(limit=env_limit, split=split))
    path = model_path_for(model_path or None)
    await _arm(cfg, wh, path, envs[:2], True)  # warm-up (imports, first sandbox start), so neither arm pays it
    arms = {label: await _arm(cfg, wh, path, envs, ground) for label, ground in (("free", False), ("grounded", True))}
    f1 = {label: arm.pop("episode_f1") for label, arm in arms.items()}
    for label, arm in arms.items():
        arm["f1_ci95"] = bootstrap_ci(list(f1[label].values()))
    common = sorted(set(f1["free"]) & set(f1["grounded"]))
    diffs = [f1["grounded"][e] - f1["free"][e] for e in common]
    paired = {"grounded_minus_free": round(sum(diffs) / len(diffs), 4) if diffs else 0.0,
              "ci95_paired": bootstrap_ci(diffs), "environments": len(common)}
    bfcl = await _bfcl(path, bfcl_limit) if bfcl_limit else {"skipped": "bfcl_limit 0"}
    return {"model_path": path, "environments": len(envs), "split": split, **arms, "paired": paired, "bfcl": bfcl,
            "load_average_end": [round(x, 2) for x in os.getloadavg()]}
