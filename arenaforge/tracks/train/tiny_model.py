"""A tiny Qwen3-style causal LM built entirely offline, for tests and CPU smoke runs.

No weights can be downloaded here, so the model is a random-initialised `Qwen3ForCausalLM`
(2 layers, hidden 64) and its tokenizer is a byte-level BPE trained with `tokenizers` on the
project's own source and docs. The chat template is Qwen/hermes style: tools are listed in
the system turn inside `<tools>`, the model calls them with `<tool_call>{json}</tool_call>`,
and results come back in a user turn inside `<tool_response>`. Assistant turns are wrapped in
`{% generation %}` so SFT can ask transformers for an assistant-token mask.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CACHE_ROOT = Path.home() / ".cache" / "arenaforge"
# v2: compact tool block, tokenizer trained with the bundled sample data too. A new directory, not
# an in-place rebuild: other checkouts on the machine may still read the v1 model.
DEFAULT_CACHE = CACHE_ROOT / "tiny-model-v2"
BUILD_VERSION = 2

# Assistant turns and tool results, shared by both templates: hermes/Qwen style, assistant turns inside
# `{% generation %}` (transformers' assistant mask for SFT), a missing `content` is empty (never an error).
_MESSAGES = (
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content or '' }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}"
    "{% if tc.function is defined %}{% set tc = tc.function %}{% endif %}"
    "{% if message.content or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tc.name }}\", \"arguments\": "
    "{% if tc.arguments is string %}{{ tc.arguments }}{% else %}{{ tc.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>"
    "{% endgeneration %}{{ '\\n' }}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content or '' }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SYSTEM_ONLY = "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"

# Qwen2.5/hermes tool prompt: every tool's full JSON schema. For pretrained models that know this format.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    + _SYSTEM_ONLY + _MESSAGES
)

# Models trained from scratch here read a short tool block: one line per tool, `name(arg, optional?): description`.
# About a third of the tokens of the JSON schemas, and a sequence's cost grows with its length.
COMPACT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>"
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{% set props = (f.parameters or {}).properties or {} %}{% set required = (f.parameters or {}).required or [] %}"
    "{{ '\\n' }}{{ f.name }}({% for name in props %}{{ name }}{% if name not in required %}?{% endif %}"
    "{% if not loop.last %}, {% endif %}{% endfor %}): {{ f.description or '' }}"
    "{% endfor %}{{ '\\n' }}</tools><|im_end|>\n"
    + _SYSTEM_ONLY + _MESSAGES
)
CHAT_TEMPLATE = COMPACT_TEMPLATE


def _corpus(root: Path) -> list[str]:
    texts = []
    # code and docs, plus the bundled sample data, so ids and field names of the sample source get merges
    for pattern in ("**/*.py", "**/*.md", "**/*.sql", "**/*.csv", "**/*.jsonl", "**/*.txt"):
        for path in sorted(root.glob(pattern)):
            if ".venv" in path.parts or "node_modules" in path.parts:
                continue
            try:
                texts.append(path.read_text(errors="ignore"))
            except OSError:
                continue
    # JSON-ish tool-call text so the vocabulary has merges for the call syntax.
    texts.append(json.dumps({"name": "lookup", "arguments": {"key": "value", "n": 1}}) * 50)
    return texts


def build_tokenizer(root: Path, vocab_size: int = 2048):
    """A byte-level BPE trained on the project's source and sample data, wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one: ids and numbers are copied from prompts and observations token by token, and a
    # learned merge like "009" | "8" would make every id its own pattern (as Llama and Qwen tokenizers do).
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(root), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out: str | Path, *, layers: int = 2, hidden: int = 64, seed: int = 0, vocab_size: int = 2048,
                     heads: int = 4, source_root: str | Path | None = None) -> Path:
    """Write a random-weight Qwen3 model and its trained tokenizer to `out` (save_pretrained)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the package's own text (code, prompts, sample data): present in a wheel as in a checkout
    root = Path(source_root) if source_root else Path(str(resources.files("arenaforge")))
    tokenizer = build_tokenizer(root, vocab_size)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2 if hidden <= 64 else hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"layers": layers, "hidden": hidden, "heads": heads, "vocab_size": vocab_size, "seed": seed,
            "version": BUILD_VERSION}
    (out / "arenaforge.json").write_text(json.dumps(meta))
    return out


def ensure_built(target: Path, build: Callable[[Path], Path]) -> Path:
    """`target`, built by `build(tmp_dir)` on first use (marker: arenaforge.json).

    Built in a sibling temp directory and renamed into place, so concurrent test processes
    never read a half-written model.
    """
    import shutil
    import tempfile

    if not (target / "arenaforge.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp)
            try:
                tmp.rename(target)
            except OSError:  # another process finished first (or a stale partial dir is in the way)
                if not (target / "arenaforge.json").exists():
                    shutil.rmtree(target, ignore_errors=True)
                    tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_tiny_model(path: str | Path | None = None) -> Path:
    """The test-sized model (2 layers, hidden 64) at `path` (default ~/.cache/arenaforge/tiny-model-v2)."""
    return ensure_built(Path(path) if path else DEFAULT_CACHE, build_tiny_model)
