"""`arenaforge bench train_speed` runs the SFT trainer's step in each precision and the hf engine, side by side."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from arenaforge.flows.cli import app


def test_bench_train_speed_reports_each_variant_and_generation() -> None:
    result = CliRunner().invoke(app, ["bench", "train_speed", "--policy", "tiny", "--seq", "32", "--steps", "1",
                                      "--variants", "full-fp32,full-bf16,lora-bf16", "--gen-batch", "2", "--gen-tokens", "3",
                                      "--group-prompt-tokens", "64"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    full_fp32, full_bf16, lora = got["train"]
    assert [full_fp32["variant"], full_bf16["variant"], lora["variant"]] == ["full-fp32", "full-bf16", "lora-bf16"]
    assert all(t["tokens_per_s"] > 0 for t in got["train"])
    assert full_fp32["trained_parameters"] == full_bf16["trained_parameters"] == full_fp32["parameters"]
    assert 0 < lora["trained_parameters"] < lora["parameters"]  # adapters only
    assert got["train"][0]["vs_full_fp32"] == 1.0 and "vs_full_fp32" in got["train"][1]
    assert got["generate"]["requests"] == 2 and 2 <= got["generate"]["tokens"] <= 6
    group = got["generate_group"]
    assert group["requests"] == 2 and group["prompt_tokens"] >= 64
    assert group["tokens_per_s_prompt_shared"] > 0 and group["tokens_per_s_each_prompt_whole"] > 0


def test_an_unknown_variant_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "bench", "train_speed", "--policy", "tiny",
                           "--variants", "full-fp8"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("error: bench train_speed: --variants: unknown variants ['full-fp8']; choose from "
                                   "full-fp32, full-bf16, lora-fp32, lora-bf16")
