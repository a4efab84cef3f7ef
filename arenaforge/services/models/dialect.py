"""What one OpenAI-compatible endpoint accepts, learned from its refusals and remembered for the run.

Servers differ: vLLM takes `response_format: json_schema` and native tool calls only when started for
them, llama.cpp answers an unknown response_format with a 500, OpenAI's reasoning models rename
`max_tokens` and refuse `temperature`. The first refusal moves this endpoint to the next structured
output mode (json_schema, then json_object with the schema in the prompt, then the prompt alone), to
tools described in the prompt, or to a renamed or dropped optional parameter; every later request is
written that way at once.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from arenaforge.schemas.config import ModelConfig
from arenaforge.services.models import prompted_tools
from arenaforge.services.models.base import ChatRequest
from arenaforge.services.models.http_errors import HTTPStatusError, short

log = logging.getLogger(__name__)

_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what OpenAI accepts in a json_schema name
# Words an endpoint uses when it refuses a response_format it does not support.
_FORMAT_REFUSAL = re.compile(r"response_format|json_schema|json_object|grammar", re.IGNORECASE)
# ... and when it cannot call tools (vLLM without --enable-auto-tool-choice --tool-call-parser).
_TOOLS_REFUSAL = re.compile(r"tool.choice|tool-call-parser|tools? param|tools? (?:are |is )?not supported|"
                            r"does not support tools", re.IGNORECASE)
# ... and a sampling parameter it does not take (OpenAI's reasoning models: max_completion_tokens, temperature 1).
_PARAM_RENAMED = re.compile(r"Unsupported parameter: '(\w+)'.*?Use '(\w+)' instead", re.IGNORECASE)
_PARAM_REFUSED = re.compile(r"Unsupported (?:parameter|value): '(\w+)'", re.IGNORECASE)
_OPTIONAL_PARAMS = frozenset({"temperature", "seed", "max_tokens"})  # a request still means the same without them
MODES = ("json_schema", "json_object", "prompt")


class Dialect:
    """The request body one endpoint accepts (see module docstring)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.url = cfg.base_url
        self.mode = "json_schema" if cfg.structured_output == "auto" else cfg.structured_output
        self.tool_mode = "prompt" if cfg.tool_calling == "prompt" else "native"
        self.renamed: dict[str, str] = {}  # parameter -> the name this endpoint takes instead
        self.dropped: set[str] = set()  # optional parameters this endpoint refuses

    def refuses_tools(self, err: HTTPStatusError) -> bool:
        return err.status in (400, 422, 500) and bool(_TOOLS_REFUSAL.search(err.detail))

    def body(self, model: str, messages: list[dict[str, Any]], request: ChatRequest) -> dict[str, Any]:
        wire = [wire_message(m) for m in messages]
        params: dict[str, Any] = {
            "model": model,
            "messages": wire,
            "temperature": self.cfg.temperature if request.temperature is None else request.temperature,
            "max_tokens": min(request.max_tokens or self.cfg.max_tokens, self.cfg.max_tokens),
            # a seed on every request: sampling is reproducible where the endpoint honours it
            "seed": request.seed if request.seed is not None else self.cfg.seed,
        }
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice is not None:  # only when the step needs it: vLLM refuses "auto" unless configured
                params["tool_choice"] = request.tool_choice
        for name in self.dropped:
            params.pop(name, None)
        for old, new in self.renamed.items():
            if old in params:
                params[new] = params.pop(old)
        schema = request.response_schema
        if schema is not None:
            if self.mode == "json_schema":
                params["response_format"] = {"type": "json_schema",
                                             "json_schema": {"name": _SCHEMA_NAME.sub("_", request.step)[:64],
                                                             "schema": schema}}
            else:  # the schema goes into the prompt; json_object still asks for JSON where it is supported
                # "json" in lower case: OpenAI's json_object mode wants the word in the messages
                hint = ("Answer in json: a single JSON value that satisfies this JSON Schema, and nothing else:\n"
                        + json.dumps(schema, ensure_ascii=False))
                params["messages"] = prompted_tools.add_instruction(wire, hint)
                if self.mode == "json_object":
                    params["response_format"] = {"type": "json_object"}
        return params

    def adapt_params(self, err: HTTPStatusError) -> bool:
        """Rename or leave out a parameter the endpoint refused (remembered); whether anything changed."""
        renamed = _PARAM_RENAMED.search(err.detail)
        if renamed and renamed[1] not in self.renamed:
            self.renamed[renamed[1]] = renamed[2]
        elif (refused := _PARAM_REFUSED.search(err.detail)) and refused[1] in _OPTIONAL_PARAMS - self.dropped:
            self.dropped.add(refused[1])
        else:
            return False
        log.warning("%s: %s; adapted from now on", self.url, short(err))
        return True

    def downgrade(self, mode: str, err: HTTPStatusError) -> bool:
        """Move to the next structured-output mode when the endpoint refused this one; whether it did."""
        if self.cfg.structured_output != "auto" or not _FORMAT_REFUSAL.search(err.detail):
            return False
        if self.mode != mode:  # another request already negotiated past this mode
            return True
        index = MODES.index(mode)
        if index + 1 >= len(MODES):
            return False
        self.mode = MODES[index + 1]
        log.warning("%s refused response_format %s (%s); using %s from now on", self.url, mode,
                    short(err), self.mode)
        return True


def wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as every server accepts it: `content` always present (some chat templates index it)."""
    if message.get("content") is None:
        return {**message, "content": ""}
    return message
