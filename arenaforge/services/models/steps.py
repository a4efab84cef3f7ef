"""A model step: one object, declared beside the stage code that asks it.

A `Step` carries what the model layer needs to know about one kind of request: its name (the `llm_calls`
label), its prompt file (`tracks/<track>/prompts/<prompt>.txt`), its answer schema, its answer budget
(`max_tokens`: an endpoint never reserves the `model.max_tokens` cap for an answer a few fields long, and an
abandoned one holds a slot for less) and the offline provider's rule. The model layer keeps no table of
step names: constructing a `Step` declares it, and the offline provider finds a request's rule through
`declared(name)`.

A stage's offline rule reads the stage's own types, so the stage module cannot import it at its top; `offline`
is a function that imports the rule, called when the offline provider opens (`import_offline_rules`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arenaforge.services.models.base import ChatRequest
    from arenaforge.services.models.providers.offline import OfflineModel

OfflineRule = Callable[["ChatRequest", "OfflineModel"], Any]
_DECLARED: dict[str, Step] = {}


@dataclass(frozen=True, eq=False)
class Step:
    name: str  # the label of its requests in `llm_calls` (never part of a request's cache key)
    prompt: str  # its prompt file, tracks/<track>/prompts/<prompt>.txt
    schema: dict[str, Any] | None = field(repr=False)  # its answer's schema (None: each call gives one)
    max_tokens: int  # its answer budget; `model.max_tokens` caps it
    offline: Callable[[], OfflineRule] = field(repr=False)  # imports the offline provider's rule

    def __post_init__(self) -> None:
        if _DECLARED.setdefault(self.name, self) is not self:
            raise ValueError(f"two steps named {self.name!r}")


def declared(name: str) -> Step | None:
    """The step of that name, once the stage module declaring it is imported (a request's step always is)."""
    return _DECLARED.get(name)


@functools.cache
def offline_rule(step: Step) -> OfflineRule:
    """The step's offline rule, imported once."""
    return step.offline()


def import_offline_rules() -> None:
    """Import the rules of every step declared so far: the offline provider does it when a run opens the model, so
    the first request a stage times does not pay for it."""
    for step in list(_DECLARED.values()):
        offline_rule(step)
