"""Prompt templates as files (`arenaforge/tasks/prompts/<name>.txt`), loaded by name and hashed.

Templates use `$name` placeholders (string.Template) so JSON examples in a prompt need no
escaping. The hash goes into each produced record's provenance.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from importlib import resources
from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.schemas.ids import sha256_hex


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str

    @property
    def hash(self) -> str:
        return sha256_hex(self.text)[:16]

    def render(self, **values: Any) -> str:
        try:
            return string.Template(self.text).substitute(**{k: str(v) for k, v in values.items()})
        except KeyError as err:
            raise ConfigError(f"prompt {self.name!r} needs a value for ${err.args[0]}") from None


@functools.lru_cache(maxsize=None)
def load_prompt(name: str) -> Prompt:
    path = resources.files("arenaforge.tasks.prompts").joinpath(f"{name}.txt")
    if not path.is_file():
        raise ConfigError(f"no prompt template named {name!r} (arenaforge/tasks/prompts/{name}.txt)")
    return Prompt(name=name, text=path.read_text())
