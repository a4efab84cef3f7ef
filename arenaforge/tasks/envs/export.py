"""Exports of accepted environments: verl Parquet, Harbor task directories, JSON-lines.

(a) verl: the rows of `arenaforge.tasks.verl.dataset` (prompt, agent_name, reward_model.ground_truth,
    extra_info.tools_kwargs with the env) plus a `tools` column (OpenAI tool list as JSON).
(b) Harbor: one directory per environment —

        instruction.md              the question, the tools, how to call them
        task.toml                   metadata and time limits
        environment/Dockerfile      FROM the sandbox image; copies env/ to /env
        environment/env/tools.py    the tool code; state.json its initial state; call.py the runner
        solution/solve.sh           replays the gold calls through call.py
        tests/test.sh               runs grade.py: F1 over the logged calls -> $LOGS_DIR/verifier/reward.json
        tests/gold.json             the gold sub-answers

    `call.py` logs every call (tool, arguments, observation) to $LOGS_DIR/agent/calls.jsonl;
    `grade.py` scores that log with the project's own reward code (`arenaforge.environments.reward`,
    copied in by source, not rewritten), so Harbor's verifier and training agree.
    ENV_DIR (default /env) and LOGS_DIR (default /logs) let test.sh run on a host too.
(c) JSONL: one Environment record per line.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

from arenaforge.environments import reward as reward_module
from arenaforge.schemas.models import Environment

_CALL_PY = '''"""Call one tool of this environment: python3 call.py TOOL '{"arg": "value"}'."""
import importlib.util, json, os, sys, traceback

ENV_DIR = os.environ.get("ENV_DIR", os.path.dirname(os.path.abspath(__file__)))
LOGS_DIR = os.environ.get("LOGS_DIR", "/logs")


def main():
    tool, args = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    with open(os.path.join(ENV_DIR, "env.json")) as fh:
        meta = json.load(fh)
    spec = importlib.util.spec_from_file_location("tools", os.path.join(ENV_DIR, "tools.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state_path = os.path.join(ENV_DIR, "state.json")
    if meta.get("data_var") and os.path.exists(state_path):
        with open(state_path) as fh:
            setattr(module, meta["data_var"], json.load(fh))
    if tool not in meta["tools"]:
        out, ok = "Error: unknown tool " + repr(tool), False
    else:
        try:
            value = getattr(module, tool)(**args)
            out, ok = (value if isinstance(value, str) else json.dumps(value)), True
        except Exception as err:  # the agent observes tool errors
            out, ok = "Error: " + "".join(traceback.format_exception_only(type(err), err)).strip(), False
    os.makedirs(os.path.join(LOGS_DIR, "agent"), exist_ok=True)
    with open(os.path.join(LOGS_DIR, "agent", "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"tool": tool, "arguments": args, "ok": ok, "observation": out}) + "\\n")
    print(out)


if __name__ == "__main__":
    main()
'''

_GRADE_TAIL = '''

class RewardBreakdown:  # the record type without pydantic: same fields
    def __init__(self, **fields):
        self.__dict__.update(fields)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    logs = os.environ.get("LOGS_DIR", "/logs")
    with open(os.path.join(here, "gold.json")) as fh:
        gold = json.load(fh)
    observations, calls = [], 0
    log = os.path.join(logs, "agent", "calls.jsonl")
    if os.path.exists(log):
        with open(log) as fh:
            for line in fh:
                if line.strip():
                    calls += 1
                    observations.append(json.loads(line).get("observation", ""))
    r = f1_reward(gold, observations, calls)
    os.makedirs(os.path.join(logs, "verifier"), exist_ok=True)
    result = {"reward": r.f1, "recall": r.recall, "precision": r.precision, "solved": r.solved,
              "subtasks": r.subtasks, "calls": r.calls}
    with open(os.path.join(logs, "verifier", "reward.json"), "w") as fh:
        json.dump(result, fh)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
'''


def grade_source() -> str:
    """grade.py: the reward functions of arenaforge/environments/reward.py, by source, plus a log reader."""
    parts = [inspect.getsource(getattr(reward_module, name)) for name in
             ("normalise", "_numbers", "_as_number", "answer_matches", "solved_subtasks", "f1_reward")]
    consts = (f"EPSILON = {reward_module.EPSILON!r}\n_NUMBER = re.compile({reward_module._NUMBER.pattern!r})\n"
              f"_PUNCT = re.compile({reward_module._PUNCT.pattern!r})\n")
    head = ('"""Harbor verifier: F1 reward (copied from arenaforge/environments/reward.py) over the call log."""\n'
            "from __future__ import annotations\n\n"
            "import json, math, os, re, unicodedata\nfrom collections.abc import Iterable, Sequence\n\n")
    return head + consts + "\n\n" + "\n\n".join(parts) + _GRADE_TAIL


def write_jsonl(envs: Sequence[Environment], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        for env in envs:
            fh.write(env.model_dump_json() + "\n")
    tmp.replace(path)
    return path


def write_verl(envs: Sequence[Environment], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from arenaforge.tasks.verl.dataset import dataset_rows

    rows = dataset_rows(envs)
    for row, env in zip(rows, envs, strict=True):
        row["tools"] = json.dumps([t.as_openai_tool() for t in env.tools])
        row["data_source"] = f"arenaforge/{env.name.rsplit('-', 1)[0]}"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path


def _instruction(env: Environment) -> str:
    lines = [f"# {env.name}", "", env.question or "", "", "## Tools", "",
             "Call a tool with `python3 /env/call.py TOOL '<JSON arguments>'`; it prints the observation.", ""]
    for t in env.tools:
        lines.append(f"- `{t.name}`: {t.description}")
        lines.append(f"  parameters: `{json.dumps(t.parameters)}`")
    lines += ["", "Use as few calls as you need: the reward is the F1 of solved sub-tasks and call precision.", ""]
    return "\n".join(lines)


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def write_harbor(envs: Sequence[Environment], root: str | Path, image: str = "arenaforge-sandbox:latest") -> list[Path]:
    root = Path(root)
    out = []
    for env in envs:
        d = root / env.name
        for sub in ("environment/env", "solution", "tests"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "instruction.md").write_text(_instruction(env))
        (d / "task.toml").write_text(textwrap.dedent(f'''\
            version = "1.0"

            [metadata]
            id = "{env.id}"
            name = "{env.name}"
            qa_id = "{env.qa_id or ''}"
            category = "tool-use"
            tags = ["arenaforge", "astra-rl"]

            [verifier]
            timeout_sec = 120.0

            [agent]
            timeout_sec = 600.0

            [environment]
            build_timeout_sec = 600.0
            '''))
        (d / "environment" / "Dockerfile").write_text(
            f"FROM {image}\nCOPY env/ /env/\nENV ENV_DIR=/env LOGS_DIR=/logs\nWORKDIR /env\n")
        envdir = d / "environment" / "env"
        (envdir / "tools.py").write_text(env.code)
        (envdir / "state.json").write_text(json.dumps(env.initial_state or {}))
        (envdir / "env.json").write_text(json.dumps({"data_var": env.data_var, "tools": [t.name for t in env.tools],
                                                    "env_id": env.id}))
        (envdir / "call.py").write_text(_CALL_PY)
        solve = ["#!/bin/sh", "# Replays the gold calls.", "set -e", 'ENV_DIR="${ENV_DIR:-/env}"']
        solve += [f'python3 "$ENV_DIR/call.py" {c.tool} {_shell_quote(json.dumps(c.arguments))}' for c in env.calls]
        (d / "solution" / "solve.sh").write_text("\n".join(solve) + "\n")
        (d / "tests" / "test.sh").write_text('#!/bin/sh\nset -e\npython3 "$(dirname "$0")/grade.py"\n')
        (d / "tests" / "grade.py").write_text(grade_source())
        (d / "tests" / "gold.json").write_text(json.dumps(env.gold_answers))
        for script in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
            script.chmod(0o755)
        out.append(d)
    return out
