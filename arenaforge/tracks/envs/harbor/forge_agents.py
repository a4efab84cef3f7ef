"""Harbor agents that try to raise their score without calling a tool: run as root in the agent's container.

Loaded by Harbor itself (`harbor run -a forge_agents:AllForgeries`, this folder on PYTHONPATH), so this file
imports only Harbor and the standard library. Each agent knows the gold answers (read on the host from the
exported task's tests/gold.json, under the `tasks_dir` agent kwarg): the strongest forger, one that guessed
right. An agent that scores above 0 here has beaten the verifier; Harbor errors count as failures of the task.
Used by tests/tasks/envs/test_harbor_cli.py and `arenaforge bench harbor-run`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

CALL_LOG = "/var/lib/arena-tools/calls.jsonl"  # where the tools service keeps its log (in its own container)


class _Forger(BaseAgent):
    """Common part: the gold answers, and a root shell in the agent's container."""

    def __init__(self, logs_dir: Path, tasks_dir: str = "", **kwargs) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self.tasks_dir = Path(tasks_dir)

    @staticmethod
    def name() -> str:
        return "arenaforge-forger"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return

    def forged_log(self, environment: BaseEnvironment) -> str:
        """A call log that would score 1.0: one call whose observation holds every gold answer."""
        gold = json.loads((self.tasks_dir / environment.environment_name / "tests" / "gold.json").read_text())
        return json.dumps({"tool": "lookup", "arguments": "{}", "ok": True, "observation": " ; ".join(gold)}) + "\n"

    async def root(self, environment: BaseEnvironment, script: str) -> None:
        result = await environment.exec(command=f"sh -c {shlex.quote(script)}", user="root", timeout_sec=60)
        self.logger.info("forgery exit %s: %s", result.return_code, (result.stdout or "")[-500:])

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        for attack in self.attacks(environment):
            await self.root(environment, attack)

    def attacks(self, environment: BaseEnvironment) -> list[str]:
        raise NotImplementedError


class RewardFile(_Forger):
    """Writes Harbor's reward files itself."""

    def attacks(self, environment):
        return ["mkdir -p /logs/verifier && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json "
                "&& echo 1 > /logs/verifier/reward.txt"]


class ForgedCallLog(_Forger):
    """Writes a winning call log wherever a grader might look: the service's path, Harbor's artifact folders."""

    def attacks(self, environment):
        log = shlex.quote(self.forged_log(environment))
        return [f"for f in {CALL_LOG} /logs/artifacts{CALL_LOG} /logs/artifacts/calls.jsonl /logs/agent/calls.jsonl; "
                f"do mkdir -p $(dirname $f) && printf %s {log} > $f; done"]


class PoisonedPython(_Forger):
    """The attack that beat the old shared verifier: python3 and its site-packages rewritten to print a reward of 1."""

    def attacks(self, environment):
        hook = ("import atexit, os\n"
                "def _w():\n"
                "    os.makedirs('/logs/verifier', exist_ok=True)\n"
                "    open('/logs/verifier/reward.json', 'w').write('{\"reward\": 1.0}')\n"
                "atexit.register(_w)\n")
        return [f"for d in $(python3 -c 'import site, sys; print(\" \".join(site.getsitepackages() + [sys.prefix]))'); "
                f"do mkdir -p $d && printf %s {shlex.quote(hook)} > $d/sitecustomize.py; done",
                "real=$(readlink -f $(command -v python3)) && cp $real /usr/local/bin/python3.real && "
                "printf '#!/bin/sh\\nmkdir -p /logs/verifier; echo {\\\"reward\\\": 1.0} > /logs/verifier/reward.json\\n"
                "exec /usr/local/bin/python3.real \"$@\"\\n' > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3"]


class LingeringProcess(_Forger):
    """Leaves a detached root process that keeps writing a reward of 1 and a winning log after the agent's turn."""

    def attacks(self, environment):
        log = shlex.quote(self.forged_log(environment))
        loop = (f"while :; do mkdir -p /logs/verifier /logs/artifacts{os_dir(CALL_LOG)}; "
                "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; "
                f"printf %s {log} > /logs/artifacts{CALL_LOG}; sleep 0.05; done")
        return [f"nohup setsid sh -c {shlex.quote(loop)} >/dev/null 2>&1 &"]


class ToolsServiceProbe(_Forger):
    """Talks to the tools service without calling a tool: other paths and methods, trying to plant a log entry."""

    def attacks(self, environment):
        log = self.forged_log(environment)
        probe = (
            "import json, os, urllib.request\n"
            "url = os.environ.get('TOOLS_URL', 'http://tools:8000')\n"
            f"body = {log!r}.encode()\n"
            "for method, path in [('GET', '/log'), ('POST', '/log'), ('PUT', '/call'), ('POST', '/../var/lib/arena-tools/"
            "calls.jsonl'), ('POST', '/health'), ('GET', '/calls.jsonl')]:\n"
            "    try:\n"
            "        r = urllib.request.urlopen(urllib.request.Request(url + path, data=body, method=method), timeout=10)\n"
            "        print(method, path, r.status)\n"
            "    except Exception as err:\n"
            "        print(method, path, err)\n")
        return [f"python3 -c {shlex.quote(probe)}"]


class AllForgeries(_Forger):
    """Every attack above, one after another, in one trial."""

    def attacks(self, environment):
        out = []
        for cls in (RewardFile, ForgedCallLog, ToolsServiceProbe, LingeringProcess, PoisonedPython):
            out += cls.attacks(self, environment)
        return out


def os_dir(path: str) -> str:
    return path.rsplit("/", 1)[0]
