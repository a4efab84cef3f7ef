"""`arenaforge bench learning_pretrained`: a pretrained policy's SFT on the project's export, GRPO, and BFCL around them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from arenaforge.benchmarks.learning_pretrained import paired, split_export
from arenaforge.schemas.models import Environment
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.splits import read_splits
from tests.support.requirements import require_bfcl_checker

CLI = [sys.executable, "-m", "arenaforge.flows.cli", "bench", "learning_pretrained"]


def test_paired_difference_and_interval_use_only_items_both_scored() -> None:
    before = {"a": False, "b": False, "c": True, "d": None}
    after = {"a": True, "b": True, "c": True, "d": True, "e": True}
    got = paired(before, after)
    assert got["items"] == 3 and got["difference"] == round(2 / 3, 4)
    assert 0 <= got["ci95_paired"][0] <= got["difference"] <= got["ci95_paired"][1] <= 1
    assert paired({"a": 1.0}, {"a": 1.0}) == {"difference": 0.0, "ci95_paired": [0.0, 0.0], "items": 1}


def test_the_validation_rows_are_carved_from_the_export_and_never_trained_on(tmp_path: Path) -> None:
    export = tmp_path / "sft.jsonl"
    rows = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(20)]
    export.write_text("\n".join(rows) + "\n")
    train, validation, n_train, n_validation = split_export(export, 0.1, seed=3)
    held, kept = validation.read_text().splitlines(), train.read_text().splitlines()
    assert (n_train, n_validation) == (18, 2) and len(kept) == 18 and len(held) == 2
    assert not set(held) & set(kept) and sorted(held + kept) == sorted(rows)
    assert split_export(export, 0.1, seed=3)[2:] == (18, 2) and validation.read_text().splitlines() == held


def test_one_command_trains_and_measures_a_pretrained_policy(tmp_path: Path) -> None:
    """The whole recipe on the tiny policy (the real one takes an hour): data -> export -> SFT chosen on validation
    loss -> SFT on train environments' gold-call replays -> GRPO from there -> BFCL by bfcl-eval's own checker at each
    stage; summary.json and a model card."""
    require_bfcl_checker()
    out = tmp_path / "run"
    done = subprocess.run([*CLI, "--out", str(out), "--policy", "tiny", "--n", "20", "--chains-per-server", "2",
                           "--sft-epochs", "2", "--lora-rank", "0", "--sft-replays", "3", "--grpo-steps", "1",
                           "--group-size", "2", "--batch-groups", "1", "--eval-limit", "2", "--bfcl-limit", "1",
                           "--bfcl-constrained", "--bfcl-multi-turn-limit", "1"],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert json.loads((out / "summary.json").read_text()) == got
    data, sft, replays, grpo, bfcl = got["data"], got["sft"], got["replay_sft"], got["grpo"], got["bfcl"]
    export = Path(data["sft_export"]).read_text().splitlines()
    assert len(export) == data["sft_rows"] == data["sft_train_rows"] + data["sft_validation_rows"] > 0
    assert len(sft["validation_loss"]) == 2  # one checkpoint per epoch
    assert sft["chosen_checkpoint"] == min(sft["validation_loss"], key=sft["validation_loss"].get)
    # the replay stage starts from the chosen SFT checkpoint, learns train environments only, and GRPO starts from it
    assert replays["examples"] == 3 and replays["steps"] >= 1 and Path(replays["checkpoint"]).is_dir()
    splits = {env_id: row.split for env_id, row in read_splits(Warehouse(got["warehouse"])).items()}
    replayed = [json.loads(line)["env_id"] for line in Path(replays["data"]).read_text().splitlines()]
    assert len(replayed) == 3 and {splits[e] for e in replayed} == {"train"}
    assert set(grpo["test_f1"]) == {"sft + replays", "sft + grpo"} and grpo["grpo_minus_sft"]["items"] == 2
    assert grpo["steps"] == 1
    assert Path(grpo["final_checkpoint"]).is_dir()
    assert bfcl["scorer"] == "bfcl-eval ast_checker" and bfcl["decoding"] == "free (greedy)"
    stages = {"untrained", "sft", "sft + replays", "sft + grpo"}
    assert all(bfcl[stage]["items"] == 3 for stage in stages)
    assert all(bfcl[key]["items"] == 3 for key in ("sft_minus_untrained", "replays_minus_sft", "grpo_minus_sft"))
    assert set(bfcl["constrained_and_grounded"]) == stages  # beside free, never instead
    # BFCL multi-turn base: the untrained and the final policy, free decoding, BFCL's own checks; its tasks live in a
    # warehouse of their own, never among the environments GRPO trains on
    multi = got["bfcl_multi_turn_base"]
    assert multi["suite"] == "bfcl_multi_turn_base" and multi["environments"] == 1 and multi["decoding"] == "free (greedy)"
    assert set(multi) >= {"untrained", "sft + grpo"}
    assert all(multi[label]["episodes"] == 1 and 0.0 <= multi[label]["native"] <= 1.0 for label in ("untrained", "sft + grpo"))
    assert not any(e.native for e in Warehouse(got["warehouse"]).load(Environment))
    card = (out / "MODEL_CARD.md").read_text()
    assert "| sft + grpo |" in card and sft["chosen_checkpoint"] in card and "BFCL multi-turn base (1 task" in card


def test_a_policy_that_is_not_a_model_is_one_line_before_any_work(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "--out", str(tmp_path / "run"), "--policy", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--policy" in done.stderr and not (tmp_path / "run" / "learning.duckdb").exists()
