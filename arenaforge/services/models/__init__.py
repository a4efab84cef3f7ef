"""The model seam: every model-driven step talks to one `ChatModel`, built once per run.

`open_chat_model(cfg.model, warehouse, run_id)` picks the provider named by `model.backend`
(`providers/`: `offline`, the deterministic generators; `openai`, any OpenAI-compatible endpoint)
and closes it when the run ends. Steps receive the model in their constructor and send
`ChatRequest`s; `complete_json` is the structured-answer shortcut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arenaforge.schemas.errors import ParseError
from arenaforge.services.models.accounted import Accounted
from arenaforge.services.models.answers import parse_json_answer
from arenaforge.services.models.base import ChatModel, ChatRequest, ChatResponse, NoAnswer, graded_by, reads_prompts
from arenaforge.services.models.providers import open_chat_model
from arenaforge.services.models.providers.openai_compatible import OpenAICompatibleModel
from arenaforge.services.models.steps import Step


async def complete_json(
    model: ChatModel,
    step: Step,
    messages: list[dict[str, Any]] | Callable[[], str],
    schema: dict[str, Any] | None = None,
    **params: Any,
) -> Any:
    """The validated JSON answer of a structured step; ParseError when it never validates.

    `schema` narrows the step's own schema for this call (e.g. to the tool names of one server); the answer
    budget is the step's.

    `messages` may be a function that renders the user prompt: it runs only for a model that reads prompts
    (`reads_prompts`); rules answer from `inputs` and never pay for the text (chain verification alone
    renders ~55,000 prompts per bench run).
    """
    if callable(messages):
        messages = [{"role": "user", "content": messages()}] if reads_prompts(model) else []
    schema = step.schema if schema is None else schema
    assert schema is not None, f"{step.name} declares no answer schema: give complete_json one"
    params.setdefault("max_tokens", step.max_tokens)
    response = await model.complete(ChatRequest(step=step.name, messages=messages, response_schema=schema, **params))
    if response.parsed is None and schema.get("type") != "null":
        raise ParseError(f"{step.name}: the model returned no structured answer")
    return response.parsed


__all__ = [
    "Accounted",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "NoAnswer",
    "OpenAICompatibleModel",
    "Step",
    "complete_json",
    "graded_by",
    "open_chat_model",
    "parse_json_answer",
    "reads_prompts",
]
