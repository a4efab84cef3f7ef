"""Steps are declared beside their stages (services.models.steps.Step); the offline provider finds each rule through
them."""

from __future__ import annotations

import asyncio
import importlib
import sys

import pytest

from arenaforge.schemas.errors import ProviderError
from arenaforge.services.models import ChatRequest, Step, complete_json
from arenaforge.services.models.steps import declared, offline_rule
from arenaforge.tracks.envs import pipeline, stepwise_qa
from arenaforge.tracks.sft import stages
from tests.support.models import offline_model

PIPELINES = (pipeline, stepwise_qa, stages)  # between them they import every stage module of both tracks


def _stage_steps() -> list[Step]:
    """Every Step the two tracks' stage modules declare."""
    return [value for name, module in list(sys.modules.items())
            if name.startswith(("arenaforge.tracks.envs.", "arenaforge.tracks.sft.")) and module is not None
            for value in vars(module).values() if isinstance(value, Step)]


def test_every_stage_step_has_its_prompt_its_budget_and_an_offline_rule():
    steps = {s.name: s for s in _stage_steps()}
    assert len(steps) == 18 and all(name.startswith(("envs.", "sft.")) for name in steps)
    for step in steps.values():
        track = step.name.split(".")[0]  # its prompt and its offline rule live in its own track
        assert declared(step.name) is step
        assert importlib.import_module(f"arenaforge.tracks.{track}.prompts").load_prompt(step.prompt).text, step.name
        assert 0 < step.max_tokens <= 1200, step.name
        assert offline_rule(step).__module__.startswith(f"arenaforge.tracks.{track}.offline_"), step.name


def test_two_steps_with_one_name_are_refused():
    Step("test.once", prompt="", schema=None, max_tokens=10, offline=lambda: lambda request, model: {})
    with pytest.raises(ValueError, match="two steps named 'test.once'"):
        Step("test.once", prompt="", schema=None, max_tokens=10, offline=lambda: lambda request, model: {})


def test_the_offline_provider_answers_by_the_steps_rule():
    echo = Step("test.echo", prompt="", schema={"type": "object"}, max_tokens=10,
                offline=lambda: lambda request, model: {"seen": request.inputs})
    assert asyncio.run(complete_json(offline_model(), echo, [], inputs=3)) == {"seen": 3}
    with pytest.raises(ProviderError, match="knows no step 'test.undeclared'"):
        asyncio.run(offline_model().complete(ChatRequest(step="test.undeclared", messages=[])))
