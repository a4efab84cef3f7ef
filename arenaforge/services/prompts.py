"""Prompt templates as files (each track's `prompts/<name>.txt`), loaded by name and hashed.

Templates use `$name` placeholders (string.Template) so JSON examples in a prompt need no
escaping. The hash goes into each produced record's provenance.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
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
        """The text with each `$name` / `${name}` replaced by `str(value)` and `$$` by `$`, as string.Template
        substitutes it; the template is split once, so a render is one join (steps render on every request)."""
        out = []
        for literal, name in _parts(self.text):
            out.append(literal)
            if name is not None:
                if name not in values:
                    raise ConfigError(f"prompt {self.name!r} needs a value for ${name}")
                out.append(str(values[name]))
        return "".join(out)


@functools.lru_cache(maxsize=256)  # a handful of template files; bounded in case texts are built at run time
def _parts(text: str) -> tuple[tuple[str, str | None], ...]:
    """(literal text, placeholder name or None) pairs of a string.Template text, in order."""
    parts: list[tuple[str, str | None]] = []
    literal, last = [], 0
    for match in string.Template.pattern.finditer(text):
        literal.append(text[last:match.start()])
        last = match.end()
        if match["escaped"] is not None:
            literal.append("$")
            continue
        name = match["named"] or match["braced"]
        if name is None:
            raise ConfigError(f"invalid placeholder in a prompt template at offset {match.start()}: "
                              f"{text[match.start():match.start() + 20]!r}")
        parts.append(("".join(literal), name))
        literal = []
    literal.append(text[last:])
    parts.append(("".join(literal), None))
    return tuple(parts)


def prompt_loader(package: str) -> Callable[[str], Prompt]:
    """`load_prompt(name)` over one package's templates, `<name>.txt` (each track keeps its own beside its stages)."""

    @functools.lru_cache(maxsize=None)
    def load_prompt(name: str) -> Prompt:
        path = resources.files(package).joinpath(f"{name}.txt")
        if not path.is_file():
            raise ConfigError(f"no prompt template named {name!r} ({package.replace('.', '/')}/{name}.txt)")
        return Prompt(name=name, text=path.read_text())

    return load_prompt

