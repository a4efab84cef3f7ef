"""An imported suite's own score of an episode (`Environment.native`), kept beside our F1.

- `state_hash`: the episode passes when the session's final state hashes to the gold calls' final state.
- `bfcl_multi_turn`, as BFCL's `multi_turn_checker` defines it, after every user turn whose gold calls are not
  empty: the agent made a call in that turn (else `empty_turn_model_response`); the state check (the classes' state
  hashes to the gold state after that turn, `instance_state_mismatch`); the response check (every gold result of that
  turn is among the results of the agent's calls so far, counted with multiplicity, `execution_response_mismatch`).
  The first failing turn decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arenaforge.environments.state import state_hash
from arenaforge.schemas.models import NativeCheck


@dataclass(frozen=True)
class NativeVerdict:
    passed: bool
    reason: str | None = None  # why it failed, in the suite's own terms


def result_text(obs: Any) -> str:
    """A call's result as the suites compare it: the output, or the error text of a call that failed."""
    return obs.output if obs.outcome in ("ok", "no_output") else (obs.error or "")


def state_hash_verdict(native: NativeCheck, final_state: Any) -> NativeVerdict:
    if state_hash(final_state) == native.gold_state_sha256:
        return NativeVerdict(True)
    return NativeVerdict(False, "final state differs from the gold calls' final state")


def bfcl_turn_verdict(native: NativeCheck, turn: int, state: Any, turn_results: Sequence[str],
                      all_results: Sequence[str]) -> NativeVerdict:
    """BFCL's checks after user turn `turn` (`turn_results`: this turn's call results; `all_results`: every turn's)."""
    gold = native.turns[turn]
    if not gold["gold_results"] and gold["calls"] == 0:
        return NativeVerdict(True)
    if not turn_results:
        return NativeVerdict(False, f"multi_turn:empty_turn_model_response (turn {turn})")
    if state_hash(state) != gold["state_sha256"]:
        return NativeVerdict(False, f"multi_turn:instance_state_mismatch (turn {turn})")
    remaining = list(all_results)
    for item in gold["gold_results"]:
        if item in remaining:
            remaining.remove(item)
        else:
            return NativeVerdict(False, f"multi_turn:execution_response_mismatch (turn {turn}): missing {item[:120]!r}")
    return NativeVerdict(True)
