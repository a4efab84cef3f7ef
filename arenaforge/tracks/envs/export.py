"""Exports of accepted environments: verl's files, Harbor task directories, JSON-lines.

(a) verl 0.9.1: train/val Parquet, environments.jsonl, agent_loops.yaml and tool_config.yaml in one
    directory, written by the train track's `write_verl` (the caller passes it: verl's rows name the train
    track's agent loop, which this track does not import); val is the warehouse's test split.
(b) Harbor (task.toml schema 1.4, `harbor lint` clean): one task directory per environment, built from a public
    base image (python:3.11-slim):

        instruction.md                  the question, the tools, `call-tool TOOL '<JSON>'`
        task.toml                       metadata, time limits, the non-root agent user, the separate verifier and
                                        the call log as an artifact of the tools service
        environment/Dockerfile          the agent's container: only the `call-tool` client and the user `agent`
        environment/docker-compose.yaml adds the `tools` service (Harbor's docker environment)
        environment/tools/              the tools service: tool code, initial state, server, and arena_runtime/
                                        (the sandbox worker's loader: format 1 and 2 run alike)
        solution/solve.sh               replays the gold calls through call-tool
        tests/Dockerfile                the verifier's own image: test.sh, grade.py, gold.json, environment.json
        tests/test.sh, grade.py         F1 over the tools service's call log -> /logs/verifier/reward.json
                                        (`reward` only; recall, precision, counts in details.json)
        tests/gold.json                 the gold sub-answers
        tests/environment.json          the record itself (`envs import harbor` reads it back, same id)

    Nothing the agent can read holds an answer (the state and tool code live in the tools service, the gold
    only in the verifier's image), and nothing the agent can write reaches the verifier: the tools service
    writes every call it executed to CALL_LOG in its own filesystem; after the agent's turn Harbor stops the
    agent's container, collects that file from the tools service (`[[artifacts]] service = "tools"`) and
    hands it to the verifier, which runs in a container of its own (`environment_mode = "separate"`).
    `grade.py` scores it with the project's own reward code (`arenaforge.environments.reward`, copied in by
    source), so Harbor's verifier and training agree. LOGS_DIR (default /logs) and CALL_LOG let the scripts
    run on a host.
(c) JSONL: one Environment record per line.
(d) OpenEnv (`--format openenv`, not in the default set): one OpenEnv server directory per environment
    (`write_openenv`): tools run in-process by the sandbox worker's loader, reward = the project's F1.
(e) verifiers (`--format verifiers`, not in the default set): one pip-installable verifiers 0.4 (`verifiers.v1`)
    environment package over all the environments (`write_verifiers`): a taskset with one task per environment,
    a tool server per rollout running the tools in-process with the sandbox worker's loader, reward = the project's
    F1 (by source); `arenaforge_envs.load_environment()` or `vf-eval arenaforge-envs`.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from collections.abc import Callable, Collection, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.environments import reward as reward_module
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.graders import grader_for
from arenaforge.warehouse import Warehouse


def _harbor_file(name: str) -> str:
    return resources.files("arenaforge.tracks.envs").joinpath("harbor").joinpath(name).read_text()


def grade_source() -> str:
    """grade.py: the reward functions of arenaforge/environments/reward.py, by source, plus the log check."""
    parts = [inspect.getsource(getattr(reward_module, name)) for name in
             ("normalise", "_normalise_cached", "_normalise", "_numbers", "_numbers_cached", "_find_numbers",
              "_as_number", "answer_matches", "_whole_words", "solved_subtasks", "f1_reward")]
    consts = (f"EPSILON = {reward_module.EPSILON!r}\n_NUMBER = re.compile({reward_module._NUMBER.pattern!r})\n"
              f"_PUNCT = re.compile({reward_module._PUNCT.pattern!r})\n_CACHED_LEN = {reward_module._CACHED_LEN!r}\n")
    head = ('"""Harbor verifier: F1 reward (copied from arenaforge/environments/reward.py) over the tools '
            'service\'s call log."""\n'
            "from __future__ import annotations\n\n"
            "import functools, json, math, os, re, sys, unicodedata\n"
            "from collections.abc import Iterable, Sequence\n\n")
    consts += f"CALL_LOG = {CALL_LOG!r}\n"
    return head + consts + "\n\n" + "\n\n".join(parts) + _harbor_file("grade_main.py.tmpl")


def write_jsonl(envs: Sequence[Environment], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        for env in envs:
            fh.write(env.model_dump_json() + "\n")
    tmp.replace(path)
    return path


BASE_IMAGE = "python:3.11-slim"  # public; any image with python3 on PATH works (`--image`)
TOOLS_PORT = 8000
CALL_LOG = "/var/lib/arena-tools/calls.jsonl"  # in the tools service; Harbor collects it for the verifier
AGENT_USER = "agent"  # Harbor runs the agent as this user (`harbor lint`: root-agent)
TASK_SCHEMA = "1.4"  # Harbor's task.toml schema_version


def _task_json(env: Environment) -> str:
    """task.json of an OpenEnv server or a verifiers task: the question (every user turn), gold answers, tools."""
    return json.dumps({
        "name": env.name, "id": env.id, "question": "\n\n".join(grader_for(env).user_turns(env)),
        "gold_answers": env.gold_answers,
        "tools": [{"type": "function", "function": t.model_dump(mode="json")} for t in env.tools]})


def _instruction(env: Environment) -> str:
    # a multi-turn suite's requests, in order; tools revealed later are announced in them
    turns = grader_for(env).user_turns(env)
    task = turns[0] if len(turns) == 1 else "\n\n".join(f"## Request {k + 1}\n\n{text}" for k, text in enumerate(turns))
    lines = [f"# {env.name}", "", task, "", "## Tools", "",
             "Call a tool with `call-tool TOOL '<JSON arguments>'`; it prints what the tool returns.", ""]
    for t in env.visible_tools(0):
        lines.append(f"- `{t.name}`: {t.description}")
        lines.append(f"  parameters: `{json.dumps(t.parameters)}`")
    lines += ["", "Use as few calls as you need: the reward is the F1 of solved sub-tasks and call precision.", ""]
    return "\n".join(lines)


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _dockerfile(base_image: str, body: str) -> str:
    return f"ARG BASE_IMAGE={base_image}\nFROM ${{BASE_IMAGE}}\n{body}"


_COMPOSE = f"""\
# Harbor's docker environment merges this over its own compose file: `main` is the agent's
# container; `tools` runs the environment's tools and writes the call log the verifier reads.
# init: a real PID 1 that passes SIGTERM on, so `docker compose stop` does not wait out its grace period.
# Both start at once: Harbor's `up --wait` holds the agent back until `tools` is healthy.
services:
  main:
    init: true
    build:
      network: none
    environment:
      TOOLS_URL: http://tools:{TOOLS_PORT}
  tools:
    init: true
    build:
      context: ./tools
      network: none
    expose:
      - "{TOOLS_PORT}"
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{TOOLS_PORT}/health')"]
      interval: 500ms  # the first check comes one interval after the start (start_interval needs Docker 25+)
      timeout: 5s
      retries: 60
"""


# The verifier's own environment (tests/): Harbor keeps its `main` alive with `sleep infinity`; init ends it at
# once. It reads only files Harbor copies in, so it gets no network.
_VERIFIER_COMPOSE = """\
services:
  main:
    init: true
    network_mode: none
"""


def _task_toml(env: Environment) -> str:
    made = "\n".join(f"{k} = {json.dumps(v)}" for k, v in env.lineage().items() if k != "record_id")
    return textwrap.dedent(f'''\
        schema_version = "{TASK_SCHEMA}"

        [metadata]
        id = "{env.id}"
        name = "{env.name}"
        qa_id = "{env.qa_id or ''}"
        category = "tool-use"
        tags = ["arenaforge", "astra-rl"]

        # environment/docker-compose.yaml adds the `tools` service: run with Harbor's docker environment

        [agent]
        timeout_sec = 600.0
        user = "{AGENT_USER}"

        [verifier]
        timeout_sec = 120.0
        environment_mode = "separate"  # tests/Dockerfile: the grader never runs where the agent ran

        # the tools service's own record of the calls it executed, taken after the agent's container stopped
        [[artifacts]]
        source = "{CALL_LOG}"
        service = "tools"

        [environment]
        build_timeout_sec = 600.0
        ''') + f"\n[metadata.provenance]\n{made}\n"


RUNTIME_PACKAGE = "arena_runtime"  # the sandbox worker's tool loader and renderer, copied by source
RUNTIME_FILES = ("execution.py", "protocol.py")


def _tools_template(env: Environment) -> dict[str, Any]:
    """What the tools service loads (the sandbox worker's template, its state in state.json): format 1 or 2."""
    template = {"code": env.code, "style": env.style, "class_name": env.class_name, "data_var": env.data_var,
                "tools": [t.name for t in env.tools], "env_id": env.id}
    if env.modules:
        template["modules"] = [m.model_dump(mode="json") for m in env.modules]
    return template


def _write_runtime(folder: Path) -> None:
    """The worker's execution.py and protocol.py (standard library only): the tools service runs tool code exactly
    as the sandbox does (several modules, constructor and loader arguments, rendering)."""
    folder.mkdir(exist_ok=True)
    (folder / "__init__.py").write_text('"""Copied from arenaforge/environments/runtime/worker by envs export."""\n')
    source = resources.files("arenaforge.environments.runtime").joinpath("worker")
    for name in RUNTIME_FILES:
        (folder / name).write_text(source.joinpath(name).read_text())


def write_harbor(envs: Sequence[Environment], root: str | Path, base_image: str = BASE_IMAGE) -> list[Path]:
    """One Harbor task directory per environment under `root` (see the module docstring)."""
    root = Path(root)
    out = []
    for env in envs:
        d = root / env.name
        for sub in ("environment/tools", "solution", "tests"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "instruction.md").write_text(_instruction(env))
        (d / "task.toml").write_text(_task_toml(env))
        environment, tools, tests = d / "environment", d / "environment" / "tools", d / "tests"
        (environment / "Dockerfile").write_text(_dockerfile(base_image, (
            "COPY call_tool.py /usr/local/bin/call-tool\n"
            f"RUN chmod 755 /usr/local/bin/call-tool && useradd --create-home {AGENT_USER} "
            f"&& mkdir -p /app && chown {AGENT_USER} /app\n"
            f"ENV TOOLS_URL=http://tools:{TOOLS_PORT}\nWORKDIR /app\n")))
        (environment / "call_tool.py").write_text("#!/usr/bin/env python3\n" + _harbor_file("call_tool.py.tmpl"))
        (environment / "docker-compose.yaml").write_text(_COMPOSE)
        (tools / "Dockerfile").write_text(_dockerfile(base_image, (
            "COPY server.py tools.py state.json env.json /srv/tools/\n"
            f"COPY {RUNTIME_PACKAGE} /srv/tools/{RUNTIME_PACKAGE}\n"
            f"ENV PORT={TOOLS_PORT} CALL_LOG={CALL_LOG}\nEXPOSE {TOOLS_PORT}\n"
            "CMD [\"python3\", \"/srv/tools/server.py\"]\n")))
        (tools / "server.py").write_text(_harbor_file("tools_server.py.tmpl"))
        (tools / "tools.py").write_text(env.code)
        (tools / "state.json").write_text(json.dumps(env.initial_state))
        (tools / "env.json").write_text(json.dumps(_tools_template(env)))
        _write_runtime(tools / RUNTIME_PACKAGE)
        solve = ["#!/bin/sh", "# Replays the gold calls.", "set -e"]
        solve += [f"call-tool {c.tool} {_shell_quote(json.dumps(c.arguments))}" for c in env.calls]
        (d / "solution" / "solve.sh").write_text("\n".join(solve) + "\n")
        # the verifier's image holds the grader and the gold (Harbor runs /tests/test.sh in it: tests bundled)
        (tests / "Dockerfile").write_text(_dockerfile(base_image, (
            "COPY test.sh grade.py gold.json environment.json /tests/\n")))
        (tests / "docker-compose.yaml").write_text(_VERIFIER_COMPOSE)
        # -I: isolated (no script dir, cwd, user site or PYTHON* variables on the path): only grade.py's own code
        (tests / "test.sh").write_text('#!/bin/sh\nset -e\npython3 -I "$(dirname "$0")/grade.py"\n')
        (tests / "grade.py").write_text(grade_source())
        (tests / "gold.json").write_text(json.dumps(env.gold_answers))
        (tests / "environment.json").write_text(env.model_dump_json())  # `envs import harbor` reads it back
        for script in (d / "solution" / "solve.sh", tests / "test.sh", environment / "call_tool.py"):
            script.chmod(0o755)
        out.append(d)
    return out


def write_openenv(envs: Sequence[Environment], root: str | Path) -> list[Path]:
    """One OpenEnv server directory per environment under `root`: server.py (an OpenEnv app: `python server.py
    --port P` in a venv with openenv), the tool code run in-process by arena_runtime/ (the sandbox worker's loader),
    reward.py (the project's F1, by source), and the task (question, tools, gold answers)."""
    root = Path(root)
    out = []
    for env in envs:
        d = root / env.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "server.py").write_text(resources.files("arenaforge.tracks.envs").joinpath("openenv")
                                     .joinpath("server.py.tmpl").read_text())
        (d / "reward.py").write_text(grade_source())
        (d / "env.json").write_text(json.dumps(_tools_template(env)))
        (d / "state.json").write_text(json.dumps(env.initial_state))
        (d / "task.json").write_text(_task_json(env))
        _write_runtime(d / RUNTIME_PACKAGE)
        out.append(d)
    return out


VERIFIERS_PACKAGE = "arenaforge_envs"  # the module; the distribution and taskset id are "arenaforge-envs"
VERIFIERS_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "arenaforge-envs"
version = "0.1.0"
description = "Arenaforge environments as a verifiers environment (tools in-process, reward = Arenaforge's F1)"
requires-python = ">=3.10"
dependencies = ["verifiers>=0.4.0,<0.5"]

[tool.setuptools]
packages = ["arenaforge_envs", "arenaforge_envs.arena_runtime"]

[tool.setuptools.package-data]
arenaforge_envs = ["envs/*.json", "envs/*/*.json"]
"""


def write_verifiers(envs: Sequence[Environment], root: str | Path) -> Path:
    """One verifiers environment package under `root` (pyproject.toml + arenaforge_envs/): `pip install ROOT`, then
    `arenaforge_envs.load_environment()` or `vf-eval arenaforge-envs`. Per environment, envs/<name>/ holds what the
    tool server loads (env.json, state.json) and the task (question, tools as OpenAI function documents, gold)."""
    root = Path(root)
    pkg = root / VERIFIERS_PACKAGE
    (pkg / "envs").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(VERIFIERS_PYPROJECT)
    templates = resources.files("arenaforge.tracks.envs").joinpath("verifiers")
    for target, name in (("__init__.py", "init.py.tmpl"), ("taskset.py", "taskset.py.tmpl"),
                         ("toolset.py", "toolset.py.tmpl")):
        (pkg / target).write_text(templates.joinpath(name).read_text())
    (pkg / "reward.py").write_text(grade_source())
    _write_runtime(pkg / RUNTIME_PACKAGE)
    for env in envs:
        d = pkg / "envs" / env.name
        d.mkdir(exist_ok=True)
        (d / "env.json").write_text(json.dumps(_tools_template(env)))
        (d / "state.json").write_text(json.dumps(env.initial_state))
        (d / "task.json").write_text(_task_json(env))
    (pkg / "envs" / "index.json").write_text(json.dumps([env.name for env in envs]))
    return root


FORMATS = ("verl", "harbor", "jsonl")  # the default set
ALL_FORMATS = (*FORMATS, "openenv", "verifiers")


def verified_environments(wh: Warehouse, where: str = "", limit: int | None = None) -> list[Environment]:
    """Environments that passed verification, optionally filtered (SQL over the environments table)."""
    cond = "CAST((record->'verification'->>'passed') AS BOOLEAN)" + (f" AND ({where})" if where else "")
    return wh.load(Environment, where=cond, limit=limit)


def export_environments(envs: Sequence[Environment], root: str | Path, formats: Sequence[str] = FORMATS,
                        base_image: str = BASE_IMAGE, held_out: Collection[str] = (),
                        write_verl: Callable[[Sequence[Environment], Path, Collection[str]], Any] | None = None,
                        ) -> dict[str, Any]:
    """Write `envs` in each format under `root`; what was written where (absolute paths, row counts).

    The verl format is the train track's (`write_verl` in its verl dataset module), passed in by the caller."""
    import pyarrow.parquet as pq

    unknown = set(formats) - set(ALL_FORMATS)
    if unknown:
        raise InputError(f"unknown export formats {sorted(unknown)}; use {', '.join(ALL_FORMATS)}")
    if not envs:
        raise InputError("no verified environments to export (run `arenaforge envs synth` first)")
    root = Path(root).expanduser().resolve()
    written: dict[str, Any] = {"environments": len(envs)}
    jsonl_envs = envs
    envs = [e for e in envs if e.container is None]  # imported Harbor tasks stay in their own format (the source)
    if len(envs) < len(jsonl_envs):
        written["container_tasks_not_in_verl_or_harbor"] = len(jsonl_envs) - len(envs)
    if "verl" in formats and envs:
        if write_verl is None:
            raise TypeError("export_environments: the verl format needs the train track's write_verl")
        files = write_verl(envs, root / "verl", held_out)
        written["verl"] = {"dir": str(files.train.parent), "train_rows": pq.ParquetFile(files.train).metadata.num_rows,
                           "val_rows": pq.ParquetFile(files.val).metadata.num_rows}
    if "jsonl" in formats:
        written["jsonl"] = str(write_jsonl(jsonl_envs, root / "environments.jsonl"))
    if "harbor" in formats and envs:
        written["harbor"] = str(root / "harbor")
        written["harbor_tasks"] = len(write_harbor(envs, root / "harbor", base_image=base_image))
    if "openenv" in formats and envs:
        written["openenv"] = str(root / "openenv")
        written["openenv_servers"] = len(write_openenv(envs, root / "openenv"))
    if "verifiers" in formats and envs:
        written["verifiers"] = str(write_verifiers(envs, root / "verifiers"))
        written["verifiers_environments"] = len(envs)
    return written
