"""`compute_score` for verl's reward manager (`custom_reward_function.path` = this file).

The agent loop already sets `reward_score` (the F1 over observations it received), which verl
uses as is. This function is the fallback when a sample reaches the reward manager without
one: it scores the decoded response, whose tool responses are part of the text, with the same
`f1_reward` and counts `<tool_call>` blocks as calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

from arenaforge.environments.reward import f1_reward

_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> dict:
    gold = json.loads(ground_truth) if isinstance(ground_truth, str) else list(ground_truth)
    observations = _RESPONSE.findall(solution_str)
    r = f1_reward(gold, observations, solution_str.count("<tool_call>"))
    return {"score": r.f1, "recall": r.recall, "precision": r.precision, "calls": r.calls}
