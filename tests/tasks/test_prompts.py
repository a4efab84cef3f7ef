"""Prompt templates render exactly as string.Template substitutes them (the renderer splits each template
once), a missing value is a clear error, and `$$` stays a dollar sign."""

from __future__ import annotations

import string
from importlib import resources

import pytest

from arenaforge.schemas.errors import ConfigError
from arenaforge.services.prompts import Prompt, prompt_loader

TRACK_PROMPTS = ("arenaforge.tracks.sft.prompts", "arenaforge.tracks.envs.prompts")


def _names(text: str) -> set[str]:
    return {m["named"] or m["braced"] for m in string.Template.pattern.finditer(text) if m["named"] or m["braced"]}


def test_every_bundled_prompt_renders_as_string_template_does():
    names = [(package, p.name[:-4]) for package in TRACK_PROMPTS
             for p in resources.files(package).iterdir() if p.name.endswith(".txt")]
    assert len(names) >= 10
    for package, name in names:
        prompt = prompt_loader(package)(name)
        values = {key: f"<{key} with $dollar and {{braces}}>" for key in _names(prompt.text)}
        assert prompt.render(**values) == string.Template(prompt.text).substitute(**values), name


def test_escapes_braces_and_missing_values():
    prompt = Prompt(name="t", text="cost $$5 for ${item}s by $who; $who again")
    assert prompt.render(item="apple", who=7) == "cost $5 for apples by 7; 7 again"
    with pytest.raises(ConfigError, match=r"prompt 't' needs a value for \$who"):
        prompt.render(item="apple")
