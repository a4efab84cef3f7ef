"""BFCL single-turn evaluation: simple, multiple and parallel, scored by AST match against the possible answers.

An external yardstick the policy never trained on. Each BFCL question is one user turn and a
list of functions; the policy answers once (greedy) in the Hermes `<tool_call>` format its chat template
asks for. The answers are scored by bfcl-eval's own code when `scripts/setup-bfcl.sh` has installed it
(`bfcl_official_check.py`: its Qwen FC handler's `decode_ast`, then its `ast_checker`), and always also by
our matcher (`calls_match`: the same parser rollouts use, matched the way BFCL's checker does: the right
function names, no unknown parameter, every required parameter present, every value among the possible
answers; `parallel` needs every expected call exactly once, in any order). The result names its scorer and
how often the two agree.

Data, in order: the `bfcl-eval` package's own data (optional extra `bfcl`), else
`<shared data>/bfcl_single_turn` (the same files, `../shared/data` beside a clone); otherwise
`load_bfcl` raises `BfclUnavailable` with the reason, and callers report the category as skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import FunctionDoc
from arenaforge.services.policy.base import PolicyEngine, SamplingParams
from arenaforge.services.policy.constrained import tool_specs
from arenaforge.tracks.train.rollout.episodes import DEFAULT_SYSTEM, IM_END, ParsedCall, parse_tool_calls

CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel"}


class BfclUnavailable(Exception):
    """No BFCL data found; the message says where it was looked for."""


@dataclass(frozen=True)
class BfclItem:
    id: str
    category: str
    messages: list[dict[str, str]]
    functions: list[FunctionDoc]
    ground_truth: list[dict[str, dict[str, list[Any]]]]  # [{function name: {param: [possible values]}}]
    raw_functions: list[dict[str, Any]]  # as BFCL ships them: its own checker reads these


def data_dir(shared_data: str | Path | None = None) -> tuple[Path, str]:
    """(folder holding BFCL_v4_*.json and possible_answer/, where it came from)."""
    try:
        folder = Path(str(resources.files("bfcl_eval").joinpath("data")))
        if (folder / "BFCL_v4_simple_python.json").exists():
            return folder, "bfcl-eval package"
    except ModuleNotFoundError:
        pass
    from arenaforge.tracks.envs.knowledge import default_shared_data

    # ../shared/data beside the clone (CI), or two levels up (a git worktree under <root>/wt/<name>)
    candidates = [Path(shared_data)] if shared_data else [default_shared_data(), Path.cwd().parent.parent / "shared" / "data"]
    for base in candidates:
        folder = base / "bfcl_single_turn"
        if (folder / "BFCL_v4_simple_python.json").exists():
            return folder, str(folder)
    raise BfclUnavailable("no BFCL data: the bfcl-eval package is not installed and "
                          f"{' nor '.join(str(c / 'bfcl_single_turn') for c in candidates)} exists")


def _function(doc: dict[str, Any]) -> FunctionDoc | None:
    from arenaforge.tracks.sft.ingest_tools import SchemaProblem, normalise_schema

    try:
        params = normalise_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
        return FunctionDoc(name=doc["name"], description=doc.get("description", ""), parameters=params)
    except (SchemaProblem, ValueError, KeyError):
        return None


def load_bfcl(categories: Sequence[str] = tuple(CATEGORIES), limit: int | None = None,
              shared_data: str | Path | None = None) -> tuple[list[BfclItem], str]:
    """(items of `categories`, at most `limit` each in file order; the data's origin)."""
    folder, origin = data_dir(shared_data)
    items: list[BfclItem] = []
    for category in categories:
        name = f"BFCL_v4_{CATEGORIES[category]}.json"
        answers = {row["id"]: row["ground_truth"] for row in _jsonl(folder / "possible_answer" / name)}
        taken = 0
        for row in _jsonl(folder / name):
            functions = [_function(f) for f in row["function"]]
            if row["id"] not in answers or any(f is None for f in functions) or len(row["question"]) != 1:
                continue
            items.append(BfclItem(row["id"], category, list(row["question"][0]), functions,  # type: ignore[arg-type]
                                  answers[row["id"]], row["function"]))
            taken += 1
            if limit is not None and taken >= limit:
                break
    return items, origin


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- AST match
def _standardize(value: str) -> str:
    return re.sub(r"[ ,./\-_*^'\"]", "", value).lower()


def _value_matches(value: Any, possible: Sequence[Any]) -> bool:
    for option in possible:
        if option == "":
            continue
        if isinstance(option, str) and isinstance(value, str):
            if _standardize(option) == _standardize(value):
                return True
        elif isinstance(option, bool) or isinstance(value, bool):
            if option is value:
                return True
        elif isinstance(option, (int, float)) and isinstance(value, (int, float)):
            if float(option) == float(value):
                return True
        elif isinstance(option, list) and isinstance(value, list):
            if len(option) == len(value) and all(_value_matches(v, [o]) for v, o in zip(value, option, strict=True)):
                return True
        elif isinstance(option, dict) and isinstance(value, dict):
            if option.keys() == value.keys() and all(_value_matches(value[k], [option[k]]) for k in option):
                return True
        elif option == value:
            return True
    return False


def call_matches(call: ParsedCall, expected: dict[str, dict[str, list[Any]]], functions: Sequence[FunctionDoc]) -> bool:
    """One parsed call against one expected call `{name: {param: [possible values]}}`."""
    if call.error is not None or call.name not in expected:
        return False
    possible = expected[call.name]
    doc = next((f for f in functions if f.name == call.name), None)
    known = set((doc.parameters.get("properties") or {}) if doc else possible)
    if any(arg not in known or arg not in possible for arg in call.arguments):
        return False
    for param, options in possible.items():
        if param not in call.arguments:
            if "" not in options:
                return False
        elif not _value_matches(call.arguments[param], options):
            return False
    return True


def calls_match(calls: Sequence[ParsedCall], expected: Sequence[dict[str, dict[str, list[Any]]]],
                functions: Sequence[FunctionDoc]) -> bool:
    """Every expected call matched by exactly one call, in any order, nothing extra."""
    if len(calls) != len(expected):
        return False

    def assign(i: int, free: list[int]) -> bool:
        if i == len(calls):
            return True
        return any(call_matches(calls[i], expected[j], functions) and assign(i + 1, [k for k in free if k != j])
                   for j in free)

    return assign(0, list(range(len(expected))))


# --------------------------------------------------------------------------- evaluation
def prompt_ids(tokenizer: Any, item: BfclItem) -> list[int]:
    messages = list(item.messages)
    if not messages or messages[0].get("role") != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
    rendered = tokenizer.apply_chat_template(messages, tools=[f.as_openai_tool() for f in item.functions],
                                             add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


async def evaluate_bfcl(engine: PolicyEngine, tokenizer: Any, items: Sequence[BfclItem], *, max_tokens: int = 128,
                        max_prompt_tokens: int = 2048, constrain: bool = True,
                        ground: bool = True) -> dict[str, Any]:
    """Accuracy per category (and their mean) of `engine` answering each item once, greedily; `per_item` verdicts
    (None: the prompt is longer than `max_prompt_tokens`, counted apart) for paired comparisons."""

    async def one(item: BfclItem) -> str | None:
        ids = prompt_ids(tokenizer, item)
        if len(ids) > max_prompt_tokens:
            return None  # too long for this policy's context: counted apart, not as wrong
        tools = tool_specs(item.functions) if constrain else None  # calls decoded to this item's functions
        gen = await engine.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0, tools=tools,
                                                          ground_arguments=ground))
        return tokenizer.decode(gen.token_ids, skip_special_tokens=False).removesuffix(IM_END)

    texts = dict(zip((item.id for item in items), await asyncio.gather(*(one(item) for item in items)), strict=True))
    ours = {item.id: None if texts[item.id] is None else
            calls_match(parse_tool_calls(texts[item.id], [f.name for f in item.functions]), item.ground_truth,
                        item.functions) for item in items}
    python = official_checker()
    # a subprocess of a few seconds: off the event loop, which may be serving rollouts
    official = await asyncio.to_thread(score_official, python, items, texts) if python else None
    verdicts = official if official is not None else ours
    by_category: dict[str, dict[str, Any]] = {}
    for item in items:
        row = by_category.setdefault(item.category, {"items": 0, "correct": 0, "too_long": 0})
        if verdicts[item.id] is None:
            row["too_long"] += 1
            continue
        row["items"] += 1
        row["correct"] += int(bool(verdicts[item.id]))
    for row in by_category.values():
        row["accuracy"] = round(row["correct"] / row["items"], 4) if row["items"] else 0.0
    accuracies = [row["accuracy"] for row in by_category.values()]
    scored = [i for i, v in verdicts.items() if v is not None]
    return {"categories": by_category, "accuracy": round(sum(accuracies) / len(accuracies), 4) if accuracies else 0.0,
            "scorer": "bfcl-eval ast_checker" if official is not None else
            "arenaforge matcher (bfcl-eval's checker not installed: bash scripts/setup-bfcl.sh)",
            "matcher_agrees": sum(ours[i] == verdicts[i] for i in scored) if official is not None else None,
            "per_item": verdicts, "answers": texts}


def official_checker() -> str | None:
    """The Python of bfcl-eval's venv (`scripts/setup-bfcl.sh`; BFCL_PYTHON overrides), or None when absent."""
    given = os.environ.get("BFCL_PYTHON")
    if given:
        return given
    cache = Path(os.environ.get("ARENAFORGE_CACHE") or Path.home() / ".cache" / "arenaforge")
    python = cache / "bfcl-eval" / "venv" / "bin" / "python"
    return str(python) if python.is_file() else None


def score_official(python: str, items: Sequence[BfclItem], texts: dict[str, str | None]) -> dict[str, bool | None]:
    """{item id: valid} from bfcl-eval's own decoder and AST checker, run by `python` (None: not answered)."""
    rows = [json.dumps({"id": item.id, "category": CATEGORIES[item.category], "function": item.raw_functions,
                        "possible_answer": item.ground_truth, "result": texts[item.id]})
            for item in items if texts[item.id] is not None]
    script = Path(__file__).with_name("bfcl_official_check.py")
    done = subprocess.run([python, str(script)], input="\n".join(rows), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bfcl-eval's checker failed (exit {done.returncode}): {done.stderr[-2000:]}")
    verdicts = json.loads(done.stdout)
    return {item.id: None if texts[item.id] is None else verdicts[item.id]["valid"] for item in items}
