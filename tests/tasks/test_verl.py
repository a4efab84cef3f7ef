"""verl hand-off: the agent loop core with a scripted server manager, the tool, dataset, job spec; and the
export run through stock verl 0.9.1's own dataset, agent-loop worker and loops (in the verl venv)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow.parquet as pq
import pytest

from arenaforge.tracks.train.params import EpisodeParams, GrpoParams
from arenaforge.tracks.train.verl.agent_loop import ArenaAgentCore, environment_from_kwargs
from arenaforge.tracks.train.verl.dataset import AGENT_NAME, dataset_rows, verl_tool_names, write_dataset_dir
from arenaforge.tracks.train.verl.job import VerlJobSpec, write_job
from arenaforge.tracks.train.verl.reward import compute_score
from arenaforge.tracks.train.verl.tool import ArenaTool
from tests.support.rl import (
    call_text,
    dying_before,
    lose_sandbox_workers,
    solving_policy,
    tiny_env,
    tiny_model_path,
    with_pool,
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


@dataclass
class TokenOutput:  # verl 0.9's server-manager return type (token_ids, log_probs)
    token_ids: list[int]
    log_probs: list[float]


class ScriptedServerManager:
    """Stands in for verl's AsyncLLMServerManager: generate(request_id, *, prompt_ids, sampling_params)."""

    def __init__(self, tokenizer, respond, legacy=False):
        self.tokenizer, self.respond, self.legacy = tokenizer, respond, legacy
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        text = self.respond(self.tokenizer.decode(prompt_ids), len(self.calls) - 1)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return ids if self.legacy else TokenOutput(ids, [-0.3] * len(ids))


def _sample_kwargs(env):
    """What verl passes to run(): the dataset row's non-tensor fields (built like dataset.py does)."""
    row = dataset_rows([env], verl_tool_names([env])[0], "train")[0]
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "agent_name": row["agent_name"],
            "tools_kwargs": row["extra_info"]["tools_kwargs"]}


@pytest.fixture
def environments(tmp_path):
    """An environments.jsonl (what the export writes beside the Parquet) holding tiny_env()."""
    path = tmp_path / "environments.jsonl"
    path.write_text(tiny_env().model_dump_json() + "\n")
    return path


@pytest.mark.parametrize("legacy", [False, True])
def test_agent_core_runs_an_episode_through_the_server_manager(tokenizer, legacy, environments):
    env = tiny_env()
    manager = ScriptedServerManager(tokenizer, solving_policy(env), legacy=legacy)

    def run(pool):
        core = ArenaAgentCore(manager, tokenizer, pool, EpisodeParams(max_turns=5).rollout_config(), environments)
        return core.run({"temperature": 0.7, "top_p": 0.9}, request_id="req-1", **_sample_kwargs(env))

    out = with_pool(run)
    assert out["reward_score"] == 1.0 and out["extra_fields"]["calls"] == 2 and out["extra_fields"]["env_failure"] == 0
    assert len(out["response_ids"]) == len(out["response_mask"]) == len(out["response_logprobs"])
    assert 0 < sum(out["response_mask"]) < len(out["response_mask"])
    assert {c[0] for c in manager.calls} == {"req-1"}  # sticky request id: KV-cache affinity
    assert manager.calls[0][2]["temperature"] == 0.7 and manager.calls[0][2]["logprobs"] is True
    model_lp = {lp for lp, m in zip(out["response_logprobs"], out["response_mask"]) if m}
    assert model_lp == ({0.0} if legacy else {-0.3})
    # the full token stream is the prompt + what the server generated + observations, in order
    assert manager.calls[1][1] == out["prompt_ids"] + out["response_ids"][: len(manager.calls[1][1]) - len(out["prompt_ids"])]


def test_agent_core_neutralises_environment_failures(tokenizer, environments):
    env = tiny_env()
    manager = ScriptedServerManager(tokenizer, dying_before(solving_policy(env), {"get_population"}))

    def run(pool):
        return ArenaAgentCore(manager, tokenizer, pool, EpisodeParams().rollout_config(), environments).run({}, request_id="r",
                                                                                          **_sample_kwargs(env))

    out = with_pool(run)
    assert out["extra_fields"]["env_failure"] == 1 and out["reward_score"] == 0.0
    assert sum(out["response_mask"]) == 0


def test_dataset_rows_carry_the_environment(tmp_path):
    envs = [tiny_env(), tiny_env(country="Sylvania", capital="Ostia")]
    files = write_dataset_dir(envs, envs[:1], tmp_path / "verl")
    rows = pq.read_table(files.train).to_pylist()
    assert [r["agent_name"] for r in rows] == [AGENT_NAME] * 2
    assert json.loads(rows[1]["reward_model"]["ground_truth"]) == ["Ostia", "81234"]
    assert rows[0]["prompt"][-1] == {"role": "user", "content": envs[0].question}
    assert environment_from_kwargs({"extra_info": rows[1]["extra_info"]}, files.environments) == envs[1]
    assert rows[1]["extra_info"]["tools_kwargs"]["get_population"]["create_kwargs"] == {
        "env_id": envs[1].id, "function": "get_population"}


def test_job_spec_has_grpo_without_kl_or_entropy_and_filters_groups(tmp_path):
    spec = VerlJobSpec.from_params(GrpoParams(group_size=4), model_path="/models/qwen3-8b",
                                   out_dir=str(tmp_path / "verl"))
    job = write_job(spec, [tiny_env()])
    o = dict(x.split("=", 1) for x in job.overrides)
    assert o["algorithm.adv_estimator"] == "grpo" and o["algorithm.filter_groups.enable"] == "True"
    assert o["algorithm.use_kl_in_reward"] == "False" and o["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert o["actor_rollout_ref.actor.entropy_coeff"] == "0.0" and o["actor_rollout_ref.actor.clip_ratio_high"] == "0.28"
    assert o["actor_rollout_ref.rollout.n"] == "4" and o["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert (tmp_path / "verl" / "train.parquet").exists() and (tmp_path / "verl" / "job.json").exists()
    agent_loops = (tmp_path / "verl" / "agent_loops.yaml").read_text()
    assert "arenaforge.tracks.train.verl.verl_adapter.ArenaAgentLoop" in agent_loops
    assert o["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == str(tmp_path / "verl" / "tool_config.yaml")
    assert job.entrypoint.startswith("python -m verl.trainer.main_ppo ")


def test_tool_lifecycle_and_reward():
    env = tiny_env()

    async def main(pool):
        tool = ArenaTool(pool, name="get_capital")
        iid, _ = await tool.open(env)
        text, _, info = await tool.execute(iid, {"country": "Freedonia"})
        population, _, _ = await tool.execute(iid, {"city": text}, tool_name="get_population")
        reward = await tool.calc_reward(iid)
        breakdown = tool.breakdown(iid)
        await tool.release(iid)
        return text, population, info, reward, breakdown, pool.stats()

    text, population, info, reward, breakdown, stats = with_pool(main)
    assert (text, population, info["outcome"], reward) == ("Quaxton", "81234", "ok", 1.0)
    assert breakdown.calls == 2 and stats["sessions"] == 0  # released: the session is closed


def test_a_sandbox_failure_is_not_charged_to_the_agent():
    env = tiny_env()

    async def main(pool):
        tool = ArenaTool(pool, name="get_capital")
        iid, _ = await tool.open(env)
        text, _, _ = await tool.execute(iid, {"country": "Freedonia"})
        await lose_sandbox_workers(pool)  # the worker dies between the calls: its session's state is lost
        failed, _, info = await tool.execute(iid, {"city": text}, tool_name="get_population")
        return failed, info, await tool.calc_reward(iid), tool._instances[iid]

    failed, info, reward, instance = with_pool(main)
    assert info == {"outcome": "env_failure"} and "not your doing" in failed and "state_lost" in failed
    assert reward == 0.0 and instance.env_failure and instance.errors == 0, "the sandbox failed, not the agent"


def test_compute_score_fallback_reads_tool_responses():
    text = call_text("get_capital", country="F") + "<|im_end|>\n<|im_start|>user\n<tool_response>\nQuaxton\n</tool_response>"
    score = compute_score("arenaforge", text, json.dumps(["Quaxton", "81234"]))
    assert score["recall"] == 0.5 and score["calls"] == 1 and score["score"] == pytest.approx(2 / 3)


def test_export_runs_through_stock_verl(tmp_path):
    """The export (train/val Parquet, agent_loops.yaml, tool_config.yaml) through verl 0.9.1's own code, in the
    verl venv: the trainer config composed with our overrides, RLHFDataset, AgentLoopWorker with our
    `arena_agent` loop and verl's stock `tool_agent` loop (our tools), verl's loading of our reward function;
    a scripted LLM replays the gold calls, so every sample must score 1 under both loops."""
    import subprocess

    from arenaforge.tracks.train.verl.dataset import write_verl
    from tests.support.requirements import REPO, require_verl_venv

    python = require_verl_venv()
    envs = [tiny_env(), tiny_env(country="Sylvania", capital="Ostia"), tiny_env(country="Borduria", capital="Szohod")]
    files = write_verl(envs, tmp_path / "verl")
    proc = subprocess.run([str(python), "-m", "tests.support.verl_stock_check", str(files.train.parent),
                           str(tiny_model_path())], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "ARENAFORGE_SANDBOX__BACKEND": "process"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rows"] == 3 and report["splits"] == ["train", "val"]
    first = report["first_row"]
    assert first["agent_name"] == AGENT_NAME and sorted(first["tools_kwargs"]) == sorted(first["tool_selection"])
    for agent in ("arena_agent", "tool_agent"):
        out = report[agent]
        assert out["reward_fn"] == [1.0] * 3 and out["tool_responses"] == out["gold_calls"] == [2, 2, 2], (agent, out)
        assert all(0 < m < r for m, r in zip(out["model_tokens"], out["response_tokens"], strict=True)), out
        assert out["logprobs_requested"] and out["requests"] == 9  # two calls and an answer per sample
    assert report["arena_agent"]["rm_scores"] == [1.0] * 3  # our loop scores the episode itself


@pytest.mark.slow
def test_configured_ray_address_submits_the_verl_job(tmp_path):
    """train.ray_address in config -> grpo_job writes the job and submits it to a real Ray head on loopback
    (started from the verl venv); Ray holds the job with our entrypoint and runtime env."""
    import subprocess

    from tests.support.requirements import REPO, require_verl_venv

    python = require_verl_venv()
    proc = subprocess.run([str(python), "-m", "tests.support.ray_submit_check", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["job_id"].startswith("ray-check-") and report["jobs_on_head"] == [report["job_id"]]
    assert report["entrypoint"].startswith("python -m verl.trainer.main_ppo ")
    assert "verl==0.9.1" in json.dumps(report["pip"])


def _trainer_check(tmp_path, logical_gpus: int) -> dict:
    import subprocess

    from tests.support.requirements import REPO, require_verl_venv

    python = require_verl_venv()
    proc = subprocess.run([str(python), "-m", "tests.support.verl_trainer_check", str(tmp_path), str(logical_gpus)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
                               "ARENAFORGE_SANDBOX__BACKEND": "process"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # every step before the first GPU need ran: verl accepted our overrides, the driver joined the Ray head, and the
    # trainer (a Ray actor on it) loaded the tokenizer, read our Parquet with RLHFDataset and built its dataloaders
    assert report["config_valid"] and report["connected_to_head"], report
    assert report["dataset_lengths"] == [4, 1] and report["dataloaders"], report
    return report


@pytest.mark.slow
def test_stock_verl_trainer_runs_on_a_ray_head_until_it_asks_ray_for_gpus(tmp_path):
    """`python -m verl.trainer.main_ppo` with our job's overrides on a real Ray head with no GPU: everything up to
    the workers runs; it stops where verl's ResourcePoolManager asks Ray for GPU bundles (it always does)."""
    report = _trainer_check(tmp_path, logical_gpus=0)
    assert report["returncode"] != 0
    assert report["error"] == ["ValueError", "Total available GPUs 0 is less than total desired GPUs 1"], report
    assert report["verl_frames"][-2:] == ["verl/single_controller/ray/base.py:create_resource_pool",
                                          "verl/single_controller/ray/base.py:_check_resource_available"], report


@pytest.mark.slow
def test_stock_verl_trainer_with_a_logical_gpu_stops_at_the_nccl_process_group(tmp_path):
    """The same on a head that advertises one GPU to Ray's scheduler (no device behind it): Ray places verl's
    actor/rollout worker, whose first act is a torch.distributed group with NCCL for the accelerator, which a CPU
    build of torch does not have."""
    report = _trainer_check(tmp_path, logical_gpus=1)
    assert report["returncode"] != 0
    assert report["error"] == ["RuntimeError", "Distributed package doesn't have NCCL built in"], report
    assert "verl/workers/engine_workers.py:init_model" in report["verl_frames"], report
    assert report["verl_frames"][-1] == "verl/utils/distributed.py:initialize_global_process_group_ray", report
