"""GRPO math and trainer: agreement with TRL, masking, direction of the update, batching, checkpoints."""

from __future__ import annotations

import random
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import RewardBreakdown, Rollout
from arenaforge.tracks.train.batching import AdaptiveBatcher, penalty, repair_group, resample_on_correct
from arenaforge.tracks.train.checkpoints import CheckpointManager
from arenaforge.tracks.train.grpo import (
    GrpoConfig,
    GrpoTrainer,
    first_loss_position,
    group_advantages,
    pack,
    policy_loss,
    token_logprobs,
)
from arenaforge.tracks.train.params import GrpoParams
from tests.support.rl import tiny_model_path


def trainer_params(**settings: object) -> GrpoParams:
    """The trainer's settings; these tests were written for micro-batches of 4 with every token in the loss, so those
    stay unless a test sets them."""
    return GrpoParams(**{"micro_batch_size": 4, "skip_forced_tokens": False, **settings})


def grpo_config(**settings: object) -> GrpoConfig:
    """A trainer config from `trainer_params`."""
    return GrpoConfig.from_params(trainer_params(**settings))


def run_config(out_dir: str, trainer: GrpoParams, rollout: object, in_flight_groups: int, **settings: object):
    """A run's loop from GrpoParams; these tests were written for a checkpoint after every step."""
    from arenaforge.tracks.train.run_grpo import GrpoRunConfig

    return GrpoRunConfig.from_params(GrpoParams(**{"checkpoint_every": 1, **settings}), out_dir=out_dir,
                                     trainer=trainer, rollout=rollout, in_flight_groups=in_flight_groups)


def _reward(f1: float, calls: int = 2) -> RewardBreakdown:
    return RewardBreakdown(recall=f1, precision=f1, f1=f1, solved=int(f1 > 0), subtasks=1, calls=calls)


def _rollout(response: list[int], mask: list[int], f1: float, sample: int = 0, status: str = "finished",
             tool_errors: int = 0, format_errors: int = 0, calls: int = 2, prompt: list[int] | None = None) -> Rollout:
    return Rollout(env_id="env_x", engine="scripted", policy="tiny", group="g", sample=sample,
                   prompt_ids=prompt or [11, 12, 13, 14], response_ids=response, response_mask=mask,
                   logprobs=[-1.0] * len(response), reward=_reward(f1, calls), status=status,
                   tool_errors=tool_errors, format_errors=format_errors)


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_advantages_match_trl():
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.25], [0.3, 0.3, 0.3, 0.3], [0.0, 1.0, 1.0, 0.0]])
    g = rewards.shape[1]
    flat = rewards.view(-1)
    mean = torch.nanmean(flat.view(-1, g), dim=1).repeat_interleave(g)
    std = nanstd(flat.view(-1, g), dim=1).repeat_interleave(g)
    trl_adv = (flat - mean) / (std + 1e-4)  # GRPOTrainer._generate_and_score_completions, scale_rewards="group"
    assert torch.allclose(group_advantages(rewards).view(-1), trl_adv, atol=1e-6)
    assert torch.all(group_advantages(rewards)[1] == 0)


def test_loss_matches_trl_compute_loss_dapo(tiny):
    """Same batch, same per-token log-probs: our loss == GRPOTrainer._compute_loss(loss_type='dapo')."""
    from trl import GRPOTrainer

    torch.manual_seed(0)
    b, t = 4, 7
    logp = (torch.randn(b, t) * 0.3 - 2).requires_grad_(True)
    old = logp.detach() + torch.randn(b, t) * 0.2  # off-policy, so clipping on both sides triggers
    mask = (torch.rand(b, t) > 0.3).float()
    adv = torch.tensor([1.2, -0.7, 0.4, -1.1])
    ours, stats = policy_loss(logp, old, adv, mask, 0.2, 0.28)

    class _Acc:
        num_processes = 1
        sync_gradients = True

        def gather(self, x):
            return x

        def reduce(self, x, reduction="sum"):
            return x

    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros(b, t), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=0.0, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28,
        args=SimpleNamespace(delta=None, steps_per_generation=1), use_vllm=False, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, model=SimpleNamespace(training=True), accelerator=_Acc(),
        current_gradient_accumulation_steps=1, _metrics={"train": defaultdict(list)},
    )
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2),
              "completion_ids": torch.ones(b, t, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    theirs = GRPOTrainer._compute_loss(fake, None, inputs)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert stats["clip_low"] == pytest.approx(fake._metrics["train"]["clip_ratio/low_mean"][0], abs=1e-6)
    assert stats["clip_high"] == pytest.approx(fake._metrics["train"]["clip_ratio/high_mean"][0], abs=1e-6)
    g_ours = torch.autograd.grad(ours, logp, retain_graph=True)[0]
    g_theirs = torch.autograd.grad(theirs, logp)[0]
    assert torch.allclose(g_ours, g_theirs, atol=1e-7)


def test_tool_tokens_get_no_gradient(tiny):
    model, tok = tiny
    r = _rollout([30, 31, 32, 33, 34, 35], [1, 1, 0, 0, 1, 1], 1.0)
    batch = pack([r], [1.0], tok.pad_token_id)
    # prediction positions: prompt(4) -> response starts at position 3
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    logp = token_logprobs(model, batch.input_ids, batch.attention_mask).detach().requires_grad_(True)
    loss, _ = policy_loss(logp, logp.detach() - 0.1, batch.advantages, batch.loss_mask, 0.2, 0.28)
    grad = torch.autograd.grad(loss, logp)[0][0]
    assert torch.all(grad[batch.loss_mask[0] == 0] == 0)
    assert torch.all(grad[batch.loss_mask[0] == 1] != 0)


def test_logprobs_from_the_first_loss_position_equal_the_full_ones_there(tiny):
    """The trainer computes vocabulary-wide logits only where a loss reads them (memory); same values and gradient."""
    model, tok = tiny
    rows = [_rollout([30, 31, 32, 33, 34, 35], [1, 1, 0, 0, 1, 1], 1.0),
            _rollout([36, 37], [1, 1], 0.0, 1, prompt=[1, 2, 3, 4, 5, 6, 7])]
    batch = pack(rows, [1.0, -1.0], tok.pad_token_id)
    first = first_loss_position(batch.loss_mask)
    assert first == 3 and batch.loss_mask[:, :first].sum() == 0 and batch.loss_mask[:, first].sum() > 0
    full = token_logprobs(model, batch.input_ids, batch.attention_mask)
    cut = token_logprobs(model, batch.input_ids, batch.attention_mask, first)
    assert cut.shape == full.shape and torch.all(cut[:, :first] == 0)
    assert torch.allclose(cut[:, first:], full[:, first:], atol=1e-5)
    grads = []
    for logp in (full, cut):
        model.zero_grad(set_to_none=True)
        (logp * batch.loss_mask).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads, strict=True))
    assert first_loss_position(torch.zeros(2, 5)) == 0


def test_forced_tokens_get_no_gradient_when_skipped(tiny):
    """A token sampled with probability 1 (log-prob 0: constrained decoding forced it) made no choice: with
    `skip_forced_tokens` it leaves the loss, and a group whose model tokens were all forced moves no weight."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny
    r = _rollout([30, 31, 32, 33, 34, 35], [1, 1, 0, 0, 1, 1], 1.0).model_copy(
        update={"logprobs": [-0.7, 0.0, 0.0, 0.0, 0.0, -1.2]})
    assert pack([r], [1.0], tok.pad_token_id).loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert pack([r], [1.0], tok.pad_token_id, skip_forced_tokens=True).loss_mask[0].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1]

    forced = [_rollout([40, 41, 42], [1, 1, 1], f1, i).model_copy(update={"logprobs": [0.0] * 3})
              for i, f1 in enumerate([1.0, 0.0, 1.0, 0.0])]
    moved = {}
    for skip in (False, True):
        fresh = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        before = [p.detach().clone() for p in fresh.parameters()]
        metrics = GrpoTrainer(fresh, tok, grpo_config(lr=1e-2, skip_forced_tokens=skip)).step([forced])
        moved[skip] = not all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))
        assert metrics.get("skipped", 0.0) == (1.0 if skip else 0.0)
    assert moved == {False: True, True: False}


def test_step_raises_rewarded_and_lowers_unrewarded(tiny):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    good, bad = [40, 41, 42, 43, 44], [50, 51, 52, 53, 54]
    tool = [60, 61]
    group = [
        _rollout(good + tool + good, [1] * 5 + [0, 0] + [1] * 5, 1.0, 0),
        _rollout(bad + tool + bad, [1] * 5 + [0, 0] + [1] * 5, 0.0, 1),
        _rollout(good + tool + good, [1] * 5 + [0, 0] + [1] * 5, 1.0, 2),
        _rollout(bad + tool + bad, [1] * 5 + [0, 0] + [1] * 5, 0.0, 3),
    ]

    def seq_logp(r):
        batch = pack([r], [0.0], tok.pad_token_id)
        with torch.no_grad():
            return float((token_logprobs(model, batch.input_ids, batch.attention_mask) * batch.loss_mask).sum())

    before = [seq_logp(group[0]), seq_logp(group[1])]
    trainer = GrpoTrainer(model, tok, grpo_config(lr=1e-2, micro_batch_size=3))
    metrics = trainer.step([group])
    after = [seq_logp(group[0]), seq_logp(group[1])]
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["loss"] == pytest.approx(0.0, abs=1e-5)  # ratio 1 and zero-mean advantages on equal lengths
    assert metrics["grad_norm"] > 0 and metrics["train_tokens"] == 4 * 16


def test_zero_variance_group_does_not_move_weights(tiny):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    before = [p.detach().clone() for p in model.parameters()]
    group = [_rollout([40, 41, 42], [1, 1, 1], 0.5, i) for i in range(3)]
    GrpoTrainer(model, tok, grpo_config(lr=1e-2)).step([group])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_repair_group_refills_or_drops():
    ok = [_rollout([1], [1], f, i) for i, f in enumerate([1.0, 0.0, 0.5])]
    failed = _rollout([1], [1], 0.0, 3, status="env_failure")
    repaired = repair_group(ok + [failed])
    assert len(repaired) == 4 and all(r.status != "env_failure" for r in repaired)
    assert repair_group(ok[:2] + [failed, failed]) is None


def test_resample_on_correct_prefers_clean_positives():
    rng = random.Random(0)
    pos_clean = _rollout([1], [1], 1.0, 0)
    pos_errs = _rollout([1], [1], 1.0, 1, tool_errors=2)
    pos_fmt = _rollout([1], [1], 0.8, 2, format_errors=1)
    pos_nocall = _rollout([1], [1], 0.9, 3, calls=0)
    negs = [_rollout([1], [1], 0.0, 4 + i) for i in range(4)]
    kept = resample_on_correct([pos_errs, pos_fmt, pos_clean, pos_nocall, *negs], 4, rng)
    assert len(kept) == 4
    assert kept[:2] == [pos_clean, pos_nocall]  # penalties 0.0, 0.5 beat 1.0 and 1.5
    assert sum(r.reward.f1 == 0 for r in kept) == 2
    assert penalty(pos_nocall) == 0.5 and penalty(pos_fmt) == 0.5


def test_adaptive_batcher_buffers_only_informative_groups():
    b = AdaptiveBatcher(delta=0.0, group_size=2)
    assert not b.offer([_rollout([1], [1], 0.0), _rollout([1], [1], 0.0, 1)])
    assert b.offer([_rollout([1], [1], 1.0), _rollout([1], [1], 0.0, 1)])
    assert not b.offer([_rollout([1], [1], 1.0), _rollout([1], [1], 0.0, 1, status="env_failure")])
    assert b.ready(1) and not b.ready(2)
    stats = b.reset_stats()
    assert (stats.generated, stats.zero_variance, stats.env_dropped, stats.env_failed_samples) == (3, 1, 1, 1)
    assert len(b.take(2)) == 1


def test_checkpoints_keep_optimizer_state_for_newest_only(tmp_path, tiny):
    model, tok = tiny
    manager = CheckpointManager(tmp_path / "exp", every=2, keep_optimizer=2)
    assert [s for s in range(1, 6) if manager.due(s, last=s == 5)] == [2, 4, 5]
    for step in (2, 4, 5):
        manager.save(step, model, tok, {"x": step}, {"groups_launched": step})
    saved = manager.checkpoints()
    assert [(s.step, s.has_optimizer) for s in saved] == [(2, False), (4, True), (5, True)]
    assert all((s.path / "config.json").exists() for s in saved)
    latest = manager.latest_resumable()
    state, meta = CheckpointManager.load_state(latest)
    assert latest.step == 5 and state == {"x": 5} and meta["groups_launched"] == 5


def test_grpo_loop_writes_metrics_checkpoints_and_resumes(tmp_path, tmp_warehouse, tiny, monkeypatch):
    import asyncio

    from arenaforge.schemas.kinds_training import Checkpoint, TrainStep
    from arenaforge.testing.scripted_policy import ScriptedEngine
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.run_grpo import GrpoRunConfig, train_grpo
    from tests.support.rl import solving_policy, tiny_env, with_pool

    envs = [tiny_env(), tiny_env(country="Sylvania", capital="Ostia", population=5150)]

    def factory(_model, tokenizer):
        # Odd samples solve the task, even ones answer at once: every group has reward variance.
        def respond(prompt, index):
            env = next(e for e in envs if e.question in prompt)
            sample = engine.params.seed // 1000
            return solving_policy(env)(prompt, index) if sample % 2 else "no idea"
        engine = ScriptedEngine(tokenizer, respond)
        return engine

    on_the_loop: list[bool] = []
    real_step = GrpoTrainer.step

    def step(self, groups):
        try:
            asyncio.get_running_loop()
            on_the_loop.append(True)
        except RuntimeError:
            on_the_loop.append(False)
        return real_step(self, groups)

    monkeypatch.setattr(GrpoTrainer, "step", step)
    cfg = run_config(out_dir=str(tmp_path / "exp"), steps=2, batch_groups=1, group_size=2,
                     rollout=EpisodeParams(max_turns=4).rollout_config(), trainer=trainer_params(lr=1e-3), in_flight_groups=1)
    first = with_pool(lambda pool: train_grpo(cfg, tiny_model_path(), factory, pool, envs, tmp_warehouse, "run_a"))
    assert on_the_loop == [False, False]  # each update in a thread: the loop keeps reading the sandbox's replies
    assert (first.first_step, first.last_step, first.resumed_from) == (1, 2, None)
    steps = tmp_warehouse.load(TrainStep)
    assert [s.step for s in steps] == [1, 2] and all(s.metrics["skipped"] == 0 for s in steps)
    assert all(0 < s.metrics["reward"] < 1 and s.metrics["grad_norm"] > 0 for s in steps)
    assert len(tmp_warehouse.load(Checkpoint)) == 2
    assert tmp_warehouse.query("SELECT count(*) FROM rollouts")[1][0][0] >= 4

    resumed = GrpoRunConfig(**{**cfg.__dict__, "steps": 3})
    second = with_pool(lambda pool: train_grpo(resumed, tiny_model_path(), factory, pool, envs, tmp_warehouse, "run_b"))
    assert (second.first_step, second.last_step) == (3, 3) and second.resumed_from.endswith("step-000002")
    assert [s.step for s in tmp_warehouse.load(TrainStep)] == [1, 2, 3]


def test_grpo_with_lora_in_bf16_moves_only_adapters_saves_merged_weights_and_resumes(tmp_path, tmp_warehouse):
    """`train grpo --lora-rank R --precision bf16`: the rollouts are generated by the adapted model itself, the
    checkpoint is a plain model (adapters merged into the linear layers), and a resumed run takes its adapters and
    their optimizer state from the trainer state."""
    from safetensors.torch import load_file

    from arenaforge.testing.scripted_policy import ScriptedEngine
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.run_grpo import GrpoRunConfig, train_grpo
    from tests.support.rl import solving_policy, tiny_env, with_pool

    envs = [tiny_env()]
    seen = []

    def factory(model, tokenizer):
        seen.append(type(model).__name__)

        def respond(prompt, index):
            return solving_policy(envs[0])(prompt, index) if (engine.params.seed // 1000) % 2 else "no idea"
        engine = ScriptedEngine(tokenizer, respond)
        return engine

    cfg = run_config(out_dir=str(tmp_path / "lora"), steps=2, batch_groups=1, group_size=2,
                     rollout=EpisodeParams(max_turns=4).rollout_config(), in_flight_groups=1,
                     trainer=trainer_params(lr=1e-2, lora_rank=4, precision="bf16"))
    first = with_pool(lambda pool: train_grpo(cfg, tiny_model_path(), factory, pool, envs, tmp_warehouse, "run_a"))
    assert first.last_step == 2 and all(m["grad_norm"] > 0 and m["skipped"] == 0 for m in first.metrics)
    assert seen == ["PeftModel"]  # the engine samples from the adapted model
    base = load_file(str(tiny_model_path() / "model.safetensors"))
    weights = load_file(str(tmp_path / "lora" / "step-000002" / "model.safetensors"))
    assert weights.keys() == base.keys()  # merged: no adapter keys
    changed = [k for k in base if not torch.equal(weights[k], base[k])]
    assert changed and not any("norm" in k or "embed" in k for k in changed)  # only linear layers moved
    more = GrpoRunConfig(**{**cfg.__dict__, "steps": 3})
    second = with_pool(lambda pool: train_grpo(more, tiny_model_path(), factory, pool, envs, tmp_warehouse, "run_b"))
    assert (second.first_step, second.last_step) == (3, 3) and second.resumed_from.endswith("step-000002")
    full = GrpoRunConfig(**{**cfg.__dict__, "steps": 4, "trainer": trainer_params(lr=1e-2)})
    with pytest.raises(InputError, match="trained LoRA adapters; resume it with its --lora-rank"):  # as a full run
        with_pool(lambda pool: train_grpo(GrpoRunConfig(**{**full.__dict__, "out_dir": str(tmp_path / "lora")}),
                                          tiny_model_path(), factory, pool, envs, tmp_warehouse, "run_c"))


def test_every_training_flow_parameter_is_described():
    """The Prefect forms show these descriptions; placeholders that markdown eats (`<out_dir>`) are not used."""
    from pydantic import BaseModel

    from arenaforge.tracks.train import params

    seen: set[type] = set()

    def walk(model: type[BaseModel]) -> list[str]:
        seen.add(model)
        missing = []
        for name, field in model.model_fields.items():
            if not field.description or "<" in field.description:
                missing.append(f"{model.__name__}.{name}")
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in seen:
                missing += walk(kind)
        return missing

    models = (params.GrpoParams, params.EvalParams, params.RolloutParams, params.SftParams, params.WarmstartParams)
    assert [m for model in models for m in walk(model)] == []


def test_curves_mark_skipped_steps_and_never_overwrite(tmp_path):
    from arenaforge.schemas.kinds_training import TrainStep
    from arenaforge.tracks.train.curves import curves_figure, save_curves

    warm = [TrainStep(experiment="x-warmstart", algorithm="sft", step=i, metrics={"loss": 3.0 / i}) for i in (1, 2, 3)]
    grpo = [TrainStep(experiment="x", algorithm="grpo", step=1, metrics={"reward": 0.4, "zero_variance_share": 0.25,
                                                                         "loss": 0.01, "skipped": 0.0}),
            TrainStep(experiment="x", algorithm="grpo", step=2, metrics={"reward": 0.0, "zero_variance_share": 1.0,
                                                                         "loss": 0.0, "skipped": 1.0})]
    fig = curves_figure(warm, grpo, title="x")
    labels = [t.get_text() for ax in fig.axes for legend in [ax.get_legend()] if legend for t in legend.get_texts()]
    assert any("skipped step (1)" in label for label in labels) and "SFT loss" in labels
    first = save_curves(fig, tmp_path, "train-grpo-x", "run_a")
    second = save_curves(curves_figure(warm, grpo), tmp_path, "train-grpo-x", "run_b")  # a resumed run: new file
    assert first != second and first.exists() and second.exists() and first.stat().st_size > 5_000


def test_lora_and_bf16_are_refused_for_verl_in_one_line():
    """verl trains with its own actor config: a LoRA rank or precision set here would be silently ignored there."""
    from arenaforge.tracks.train.params import GrpoParams, VerlParams
    from arenaforge.tracks.train.verl_handoff import verl_job

    for extra in ({"lora_rank": 8}, {"precision": "bf16"}):
        with pytest.raises(InputError, match="--lora-rank and --precision are for training here"):
            verl_job(None, GrpoParams(verl=VerlParams(spec_only=True), **extra), [], None)
