"""SFT: assistant-only loss masks, loss going down, checkpoints and resume."""

from __future__ import annotations

import json

import pytest
import torch

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.kinds_training import Checkpoint, TrainStep
from arenaforge.tracks.train.params import SftParams
from arenaforge.tracks.train.sft import SftConfig, encode, load_examples, train_sft
from tests.support.rl import tiny_model_path

TOOLS = [{"type": "function", "function": {"name": "get_capital", "description": "Capital of a country.",
                                           "parameters": {"type": "object", "properties": {"country": {"type": "string"}}}}}]


def _example(country: str, capital: str) -> dict:
    return {"tools": TOOLS, "messages": [
        {"role": "user", "content": f"What is the capital of {country}?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_capital", "arguments": json.dumps({"country": country})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": capital},
        {"role": "assistant", "content": f"The capital is {capital}."},
    ]}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text("\n".join(json.dumps(_example(c, k)) for c, k in
                              [("Freedonia", "Quaxton"), ("Sylvania", "Ostia"), ("Latveria", "Doomstadt")]))
    return path


def test_only_assistant_tokens_are_trained(data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    ids, mask = encode(tok, load_examples(data)[0], 4096)
    trained = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == ('<tool_call>\n{"name": "get_capital", "arguments": {"country": "Freedonia"}}\n</tool_call>'
                       "<|im_end|>The capital is Quaxton.<|im_end|>")
    assert encode(tok, load_examples(data)[0], 10) is None  # truncated before any assistant token


def test_sft_lowers_loss_checkpoints_and_resumes(tmp_path, data, tmp_warehouse):
    cfg = SftConfig.from_params(SftParams(epochs=4, batch_size=3, lr=5e-3, checkpoint_every=2),
                                out_dir=str(tmp_path / "sft"))
    first = train_sft(cfg, tiny_model_path(), data, tmp_warehouse, "run_sft")
    assert first.last_step == 4 and first.metrics[-1]["loss"] < first.metrics[0]["loss"]
    assert [c.step for c in tmp_warehouse.load(Checkpoint)] == [2, 4]
    more = SftConfig(**{**cfg.__dict__, "epochs": 5})
    second = train_sft(more, tiny_model_path(), data, tmp_warehouse, "run_sft2")
    assert (second.first_step, second.last_step) == (5, 5) and second.resumed_from.endswith("step-000004")
    assert [s.step for s in tmp_warehouse.load(TrainStep) if s.algorithm == "sft"] == [1, 2, 3, 4, 5]


def test_bad_sft_file_is_an_input_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(InputError, match="messages"):
        load_examples(bad)


def test_bf16_mixed_precision_lowers_loss_and_keeps_fp32_weights(tmp_path, data):
    import torch
    from safetensors.torch import load_file

    cfg = SftConfig.from_params(SftParams(epochs=4, batch_size=3, lr=5e-3, checkpoint_every=4, precision="bf16"),
                                out_dir=str(tmp_path / "bf16"))
    summary = train_sft(cfg, tiny_model_path(), data)
    assert summary.metrics[-1]["loss"] < summary.metrics[0]["loss"]
    plain = train_sft(SftConfig(**{**cfg.__dict__, "out_dir": str(tmp_path / "fp32"), "precision": "fp32",
                                   "max_steps": 1}), tiny_model_path(), data)
    first_bf16, first_fp32 = summary.metrics[0]["loss"], plain.metrics[0]["loss"]
    assert first_bf16 != first_fp32 and abs(first_bf16 - first_fp32) < 0.05 * first_fp32  # same step, bf16 matmuls
    weights = load_file(str(next((tmp_path / "bf16").rglob("model.safetensors"))))
    assert {t.dtype for t in weights.values()} == {torch.float32}  # the master weights, not bf16 copies


def test_lora_trains_adapters_saves_a_merged_model_and_resumes(tmp_path, data):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cfg = SftConfig.from_params(SftParams(epochs=4, batch_size=3, lr=5e-3, checkpoint_every=2, lora_rank=4),
                                out_dir=str(tmp_path / "lora"))
    first = train_sft(cfg, tiny_model_path(), data)
    assert first.last_step == 4 and first.metrics[-1]["loss"] < first.metrics[0]["loss"]
    ckpt = tmp_path / "lora" / "step-000004"
    weights, base = load_file(str(ckpt / "model.safetensors")), load_file(str(tiny_model_path() / "model.safetensors"))
    assert weights.keys() == base.keys()  # a plain model: no adapter keys, loadable by anything
    changed = [k for k in base if not torch.equal(weights[k], base[k])]
    assert changed and all(k.endswith(".weight") and ("proj" in k or "lm_head" in k) for k in changed)
    assert not any("norm" in k or "embed" in k for k in changed)  # only linear layers moved: adapters, merged
    AutoModelForCausalLM.from_pretrained(str(ckpt))
    more = train_sft(SftConfig(**{**cfg.__dict__, "epochs": 5}), tiny_model_path(), data)
    assert (more.first_step, more.last_step) == (5, 5) and more.resumed_from.endswith("step-000004")
    assert more.metrics[0]["loss"] < first.metrics[0]["loss"]  # resumed with its adapters, not from scratch
