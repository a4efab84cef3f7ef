"""`--model-path` as a model folder: a path, a named base policy or the default."""

from __future__ import annotations

from pathlib import Path

from arenaforge.schemas.errors import InputError

BASE_POLICIES = ("arena-small", "tiny", "smollm2-135m")


def model_path_for(path: str | None) -> str:
    """A model directory for `--model-path`: a path, a named policy (arena-small, tiny, smollm2-135m) or the default."""
    from arenaforge.tracks.train.base_models import policy_path

    return policy_path(path)


def local_model_path(path: str | None) -> str:
    """`model_path_for`, for a model loaded on this machine: a missing folder is the user's one-line error here,
    not transformers' traceback about repository ids. A Hugging Face id (`org/name`) passes when it is cached."""
    resolved = model_path_for(path)
    if Path(resolved).expanduser().is_dir():
        return resolved
    if resolved.count("/") == 1 and not resolved.startswith((".", "/", "~")):
        from huggingface_hub import try_to_load_from_cache

        try:
            if isinstance(try_to_load_from_cache(resolved, "config.json"), str):
                return resolved
        except ValueError:  # not a valid repository id either
            pass
    raise InputError(f"--model-path {path}: no model folder there (give a checkpoint folder, a cached Hugging Face "
                     "id, or arena-small, tiny, smollm2-135m)")
