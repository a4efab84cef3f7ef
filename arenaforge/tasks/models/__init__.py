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
from arenaforge.tasks.models.accounted import Accounted
from arenaforge.tasks.models.answers import parse_json_answer
from arenaforge.tasks.models.base import ChatModel, ChatRequest, ChatResponse, NoAnswer, graded_by, reads_prompts
from arenaforge.tasks.models.providers import open_chat_model
from arenaforge.tasks.models.providers.openai_compatible import OpenAICompatibleModel

# Tokens a step's answer needs (an answer is cut there): a request never asks the endpoint to reserve
# `model.max_tokens` (the cap) for an answer that is a few fields long, and an abandoned one holds a slot for less.
ANSWER_TOKENS: dict[str, int] = {
    "envs.decompose": 900, "envs.verify_qa": 300, "envs.tool_doc": 400, "envs.augment_tool": 500,
    "envs.implement_tool": 1200, "envs.merge_cluster": 800, "envs.write_subqa": 120, "envs.write_main_question": 160,
    "sft.propose_chains": 300, "sft.verify_chain": 120, "sft.chain_to_query": 200, "sft.query_to_chain": 150,
    "sft.write_query": 250, "sft.augment_query": 250, "sft.score_query": 150, "sft.simulate_tool": 500,
    "sft.judge_trajectory": 300, "sft.agent": 400,
}


async def complete_json(
    model: ChatModel,
    step: str,
    messages: list[dict[str, Any]] | Callable[[], str],
    schema: dict[str, Any],
    **params: Any,
) -> Any:
    """The validated JSON answer of a structured step; ParseError when it never validates.

    `messages` may be a function that renders the user prompt: it runs only for a model that reads prompts
    (`reads_prompts`); rules answer from `inputs` and never pay for the text (chain verification alone
    renders ~55,000 prompts per bench run).
    """
    if callable(messages):
        messages = [{"role": "user", "content": messages()}] if reads_prompts(model) else []
    params.setdefault("max_tokens", ANSWER_TOKENS.get(step))
    response = await model.complete(ChatRequest(step=step, messages=messages, response_schema=schema, **params))
    if response.parsed is None and schema.get("type") != "null":
        raise ParseError(f"{step}: the model returned no structured answer")
    return response.parsed


__all__ = [
    "ANSWER_TOKENS",
    "Accounted",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "NoAnswer",
    "OpenAICompatibleModel",
    "complete_json",
    "graded_by",
    "open_chat_model",
    "parse_json_answer",
    "reads_prompts",
]
