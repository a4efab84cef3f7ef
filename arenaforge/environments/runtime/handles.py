"""What the sandbox pool hands out and reads back: a session's handle, an environment's payload, a reply as an
observation. No I/O here: the pool (`pool.py`) and its worker slots (`workers.py`) use these."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from arenaforge.environments.runtime.connection import WorkerConnection
from arenaforge.schemas.models import Environment, ToolObservation

OUTCOMES = ("ok", "no_output", "error", "timeout", "limit")
MODEL_FREE_BACKENDS = ("offline", "import")  # provenance backends whose code no model wrote


@dataclass(eq=False)
class Template:
    """An environment's payload as the workers load it: the bytes and their content address."""

    key: str
    blob: bytes
    env: Environment  # the object it was made from (the memo is keyed by env.id, checked by identity)
    image: str | None = None  # the derived image its declared requirements need (docker), else the pool's


@dataclass(eq=False)
class Session:
    """One episode's handle: the environment, its worker and its serialising lock."""

    id: str
    env: Environment
    template: Template
    opened_at: float
    worker: WorkerConnection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    calls: int = 0
    resets: int = 0
    turn: int = 0  # the episode's turn (0-based): which tools of a format-2 environment the agent may call

    @property
    def tools(self) -> list[str]:
        return [t.name for t in self.env.tools]


def payload(env: Environment, site: str | None = None) -> dict[str, Any]:
    payload = {"code": env.code, "style": env.style, "class_name": env.class_name, "data_var": env.data_var,
               "initial_state": env.initial_state, "tools": [t.name for t in env.tools]}
    if env.modules:  # format 2: each module in its own namespace (the key is absent for format 1: same address)
        payload["modules"] = [m.model_dump(mode="json") for m in env.modules]
    if site:  # declared requirements: the directory the sessions import them from
        payload["paths"] = [site]
    return payload


def model_written(env: Environment) -> bool:
    """Whether the environment's provenance says a model (not a person or the offline generator) wrote its code.
    A model may have written the rest (questions, tool documents) of an environment whose code the program
    assembled (`envs synth --tool-code evidence`): its `written_by` says so."""
    prov = env.provenance
    if prov is not None and prov.written_by and prov.written_by.get("tool_code") == "program":
        return False
    return prov is not None and prov.backend not in MODEL_FREE_BACKENDS


def observation(reply: dict[str, Any], duration: float) -> ToolObservation:
    """The reply as an observation; a malformed one is an error observation, never an exception."""
    texts = {k: reply.get(k) for k in ("output", "error", "traceback")}
    if reply.get("outcome") not in OUTCOMES or not all(v is None or isinstance(v, str) for v in texts.values()):
        return ToolObservation(outcome="error", error=f"the sandbox sent an invalid reply (outcome {reply.get('outcome')!r})",
                               duration_s=duration)
    try:
        return ToolObservation(outcome=reply["outcome"], output=texts["output"] or "", error=texts["error"],
                               traceback=texts["traceback"], truncated=reply.get("truncated") is True, duration_s=duration)
    except ValidationError as err:
        return ToolObservation(outcome="error", error=f"the sandbox sent an invalid reply: {err.errors()[0]['msg']}",
                               duration_s=duration)
