"""The F1 trajectory reward (ASTRA, METHOD.md §1c): the one place it is defined.

Used by environment self-tests (arenaforge/tracks/envs/synthesize_env) and by RL rollouts and eval alike.

Definitions
-----------
n  : number of sub-tasks = gold sub-answers of the environment (one per tool-needing sub-QA).
n̂  : sub-tasks *solved*. Sub-task i is solved when its gold answer appears, after
     normalisation (`normalise`), in at least one tool observation the agent actually
     received. Each sub-task counts once, however many observations contain it; two
     sub-tasks with the same gold answer are both solved by one observation containing it.
c  : every tool call the agent issued, malformed ones (unparsable JSON, unknown tool,
     invalid arguments) included: they cost precision like any other call.

    r = n̂ / n          p = n̂ / (c + ε)          reward = 2pr / (p + r),  0 when n̂ = 0

Precision exceeds 1 only when one call's observation solves several sub-tasks (n̂ > c);
it is reported unclipped for transparency and the F1 is clipped to [0, 1].
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence

from arenaforge.schemas.models import RewardBreakdown

EPSILON = 1e-9
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_PUNCT = re.compile(r"[^\w\s.\-+/:]")


# answers and short observations recur (merging checks every pair of tools' gold answers, a rollout's gold answers
# meet every observation): those are normalised once; long texts would only fill the cache
_CACHED_LEN = 1024


def normalise(text: str) -> str:
    """Case-folded, accent-stripped, punctuation-light, whitespace-collapsed text."""
    text = str(text)
    return _normalise_cached(text) if len(text) <= _CACHED_LEN else _normalise(text)


@functools.lru_cache(maxsize=1 << 15)
def _normalise_cached(text: str) -> str:
    return _normalise(text)


def _normalise(text: str) -> str:
    if not text.isascii():  # ASCII has no decompositions or combining marks: skip the per-character pass
        text = unicodedata.normalize("NFKD", text)
        text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = text.casefold()
    text = _PUNCT.sub(" ", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)  # keep decimal points, drop sentence dots
    return " ".join(text.split())


def _numbers(text: str) -> tuple[float, ...]:
    return _numbers_cached(text) if len(text) <= _CACHED_LEN else _find_numbers(text)


@functools.lru_cache(maxsize=1 << 15)
def _numbers_cached(text: str) -> tuple[float, ...]:
    return _find_numbers(text)


def _find_numbers(text: str) -> tuple[float, ...]:
    out = []
    for match in _NUMBER.findall(text):
        try:
            out.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return tuple(out)


@functools.lru_cache(maxsize=1 << 15)  # only ever called on gold answers, which are short and recur
def _as_number(text: str) -> float | None:
    stripped = text.strip().replace(",", "")
    try:
        value = float(stripped)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_matches(gold: str, observation: str) -> bool:
    """Whether `gold` appears in `observation` after normalisation.

    Numbers compare numerically (12.5 == 12.50 == "12.5"); other answers must appear as a
    whole-word substring of the normalised observation.
    """
    number = _as_number(str(gold))
    if number is not None:
        return any(math.isclose(number, x, rel_tol=1e-6, abs_tol=1e-9) for x in _numbers(str(observation)))
    g = normalise(gold)
    if not g:
        return False
    return _whole_words(g).search(normalise(observation)) is not None


@functools.lru_cache(maxsize=1 << 14)
def _whole_words(normalised: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w]){re.escape(normalised)}(?![\w])")


def gold_call_passes(answer: str | None, outcome: str, output: str) -> bool:
    """Whether a replayed gold call did what the package says it must (the one rule every replay check uses).

    - `ok` passes when the call declares no answer (`answer` None), or its answer matches the output (`answer_matches`).
    - `no_output` (the tool returned None and printed nothing) passes only when the call declares no text:
      `answer` None or blank. A call that must return an answer and returned nothing fails.
    - `error`, `timeout` and `limit` always fail.
    """
    if outcome == "no_output":
        return answer is None or not normalise(answer)
    if outcome != "ok":
        return False
    return answer is None or not normalise(answer) or answer_matches(answer, output)


def solved_subtasks(gold_answers: Sequence[str], observations: Iterable[str]) -> list[bool]:
    """For each gold sub-answer, whether some received observation contains it."""
    obs = list(observations)
    return [any(answer_matches(gold, o) for o in obs) for gold in gold_answers]


def f1_reward(gold_answers: Sequence[str], observations: Iterable[str], calls: int) -> RewardBreakdown:
    """F1 of sub-task recall and tool-call precision; see the module docstring."""
    n = len(gold_answers)
    solved = sum(solved_subtasks(gold_answers, observations)) if n else 0
    recall = solved / n if n else 0.0
    # ε only guards c = 0 (then n̂ = 0 too: observations come from calls); dividing by c
    # itself keeps a perfect replay at exactly 1.0 instead of 1 - 1e-9.
    precision = solved / max(calls, EPSILON) if solved else 0.0
    f1 = 0.0 if solved == 0 else min(1.0, 2 * precision * recall / (precision + recall))
    return RewardBreakdown(
        recall=recall, precision=precision, f1=f1, solved=solved, subtasks=n, calls=calls
    )
