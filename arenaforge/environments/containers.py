"""Sessions in a task's own container (`Environment.container`, an imported Harbor task), and the pool that routes.

A session is one container of the task's image (no network), kept alive with `sleep infinity`; its tools run in
it through `docker exec`: `run_shell` (bash, under coreutils' `timeout`), `read_file` and `write_file`. The
container is the state: nothing is snapshotted. `verdict` is the task's own scorer, as Harbor runs it after the
agent's turn: tests/ is copied to /tests, `bash /tests/test.sh` runs, and the reward it writes to
/logs/verifier/reward.txt (a number) or reward.json (`{"reward": x}`) decides; a reward of at least 1 passes.

`RoutedPool` puts these sessions beside a sandbox pool behind the one `SandboxPool` protocol rollouts use: an
environment with a `container` opens here, any other in the sandbox.
"""

from __future__ import annotations

import asyncio
import io
import json
import posixpath
import tarfile
import time
from dataclasses import dataclass
from typing import Any

from arenaforge.environments.native import NativeVerdict
from arenaforge.environments.task_image import TaskImageError, build_task_image
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment, FunctionDoc, ToolObservation

SHELL_TOOLS = [
    FunctionDoc(name="run_shell", description="Run a bash command in the task's container; returns its output "
                                             "(stdout and stderr) and, when it fails, its exit code.",
                parameters={"type": "object", "properties": {"command": {"type": "string", "description": "The command."}},
                            "required": ["command"]}),
    FunctionDoc(name="read_file", description="Read a text file in the task's container.",
                parameters={"type": "object", "properties": {"path": {"type": "string", "description": "Absolute path."}},
                            "required": ["path"]}),
    FunctionDoc(name="write_file", description="Write a text file in the task's container (parents are created).",
                parameters={"type": "object", "properties": {"path": {"type": "string", "description": "Absolute path."},
                                                             "content": {"type": "string", "description": "The text."}},
                            "required": ["path", "content"]}),
]
REWARD_TXT, REWARD_JSON = "/logs/verifier/reward.txt", "/logs/verifier/reward.json"
TIMED_OUT = 124  # coreutils timeout's exit status


@dataclass
class ContainerSession:
    env: Environment
    container: Any
    workdir: str | None
    turn: int = 0  # (read by rollouts; every tool of a container task is visible from the start)


def _tar(files: dict[str, str], root: str) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, text in files.items():
            blob = text.encode("utf-8")
            info = tarfile.TarInfo(posixpath.join(root.strip("/"), name))
            info.size, info.mode, info.mtime = len(blob), 0o755 if name.endswith(".sh") else 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(blob))
    return data.getvalue()


def parse_reward(txt: str | None, js: str | None) -> float | None:
    """Harbor's reward: reward.txt's number, else reward.json's "reward" (or its one number)."""
    if txt is not None and txt.strip():
        try:
            return float(txt.strip().split()[0])
        except ValueError:
            return None
    if js is not None:
        try:
            value = json.loads(js)
        except json.JSONDecodeError:
            return None
        if isinstance(value, dict):
            numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            value = value.get("reward", numbers[0] if len(numbers) == 1 else None)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


class TaskContainers:
    """Sessions of container tasks: one container each, removed at close (and at shutdown, any left)."""

    def __init__(self, call_timeout_s: float | None = None, output_limit_chars: int = 64_000, client: Any = None) -> None:
        self.call_timeout_s = call_timeout_s  # None: the task's own agent budget (task.toml [agent] timeout_sec)
        self.output_limit_chars = output_limit_chars
        self._client = client
        self._open: set[int] = set()
        self._containers: dict[int, Any] = {}
        self._building: dict[str, asyncio.Task[str]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from arenaforge.environments.runtime.docker_backend import docker_client

            self._client = docker_client(timeout=600)
        return self._client

    async def image(self, env: Environment) -> str:
        """The task's image, built once per task version even when many sessions open at once."""
        assert env.container is not None
        task = env.container
        key = json.dumps(task.model_dump(exclude={"tests"}), sort_keys=True)
        if key not in self._building:
            self._building[key] = asyncio.ensure_future(asyncio.to_thread(build_task_image, self.client, task))
        try:
            return await asyncio.shield(self._building[key])
        except TaskImageError:
            self._building.pop(key, None)
            raise

    async def open(self, env: Environment) -> ContainerSession:
        import docker.errors

        if env.container is None:
            raise SandboxError(f"environment {env.name!r} has no container")
        try:
            tag = await self.image(env)
        except TaskImageError as err:
            raise SandboxError(f"environment {env.name!r}: {err.detail}") from None
        try:
            container = await asyncio.to_thread(
                self.client.containers.run, tag, entrypoint=["sleep"], command=["infinity"], detach=True,
                network_mode="none", working_dir=env.container.workdir or None, labels={"arenaforge": "task"})
        except docker.errors.DockerException as err:
            raise SandboxError(f"environment {env.name!r}: could not start its container: {err}") from None
        self._containers[id(container)] = container
        return ContainerSession(env=env, container=container, workdir=env.container.workdir)

    async def _exec(self, session: ContainerSession, argv: list[str]) -> tuple[int, str]:
        import docker.errors

        try:
            result = await asyncio.to_thread(session.container.exec_run, argv, workdir=session.workdir)
        except docker.errors.DockerException as err:
            raise SandboxError(f"the task's container failed: {err}") from None
        return result.exit_code, (result.output or b"").decode("utf-8", "replace")

    async def call(self, session: ContainerSession, tool: str, args: dict[str, Any]) -> ToolObservation:
        started = time.perf_counter()
        assert session.env.container is not None
        limit = str(max(1, int(self.call_timeout_s or session.env.container.agent_timeout_s)))
        text = {k: v for k, v in args.items() if isinstance(v, str)}
        if tool == "run_shell" and "command" in text:
            code, out = await self._exec(session, ["timeout", "-k", "5", limit, "bash", "-c", text["command"]])
        elif tool == "read_file" and "path" in text:
            code, out = await self._exec(session, ["cat", "--", text["path"]])
        elif tool == "write_file" and {"path", "content"} <= text.keys():
            path = text["path"] if text["path"].startswith("/") else posixpath.join(session.workdir or "/", text["path"])
            code, out = await self._exec(session, ["mkdir", "-p", posixpath.dirname(path)])
            if code == 0:
                done = await asyncio.to_thread(session.container.put_archive, "/", _tar({path.lstrip("/"): text["content"]}, "/"))
                code, out = (0, f"wrote {len(text['content'])} characters to {path}") if done else (1, "write failed")
        else:
            known = [t.name for t in SHELL_TOOLS]
            error = f"unknown tool {tool!r}; available: {', '.join(known)}" if tool not in known else \
                f"{tool} needs string arguments {', '.join(SHELL_TOOLS[known.index(tool)].parameters['required'])}"
            return ToolObservation(outcome="error", error=error, duration_s=time.perf_counter() - started)
        truncated = len(out) > self.output_limit_chars
        out = out[: self.output_limit_chars] + ("\n[output truncated]" if truncated else "")
        duration = time.perf_counter() - started
        if tool == "run_shell" and code == TIMED_OUT:
            return ToolObservation(outcome="timeout", error=f"the command ran past {limit} s", output=out, duration_s=duration)
        if code != 0:
            return ToolObservation(outcome="error", error=f"{out.rstrip()}\n(exit code {code})".lstrip(), truncated=truncated,
                                   duration_s=duration)
        return ToolObservation(outcome="ok" if out else "no_output", output=out, truncated=truncated, duration_s=duration)

    async def verdict(self, session: ContainerSession) -> NativeVerdict:
        """The task's own tests, run in the session's container as Harbor runs them after the agent's turn."""
        task = session.env.container
        assert task is not None
        await self._exec(session, ["mkdir", "-p", "/logs/verifier", "/tests"])
        await asyncio.to_thread(session.container.put_archive, "/", _tar(task.tests, "/tests"))
        limit = str(max(1, int(task.verifier_timeout_s)))
        code, out = await self._exec(session, ["timeout", "-k", "5", limit, "bash", "/tests/test.sh"])
        txt_code, txt = await self._exec(session, ["cat", REWARD_TXT])
        js_code, js = await self._exec(session, ["cat", REWARD_JSON])
        reward = parse_reward(txt if txt_code == 0 else None, js if js_code == 0 else None)
        if reward is None:
            tail = out.strip().splitlines()[-1:] or [""]
            return NativeVerdict(False, f"tests/test.sh wrote no reward (exit code {code}): {tail[0][:160]}")
        return NativeVerdict(reward >= 1.0, None if reward >= 1.0 else f"reward {reward:g}")

    async def close(self, session: ContainerSession) -> None:
        self._containers.pop(id(session.container), None)
        await asyncio.to_thread(_remove, session.container)

    async def shutdown(self) -> None:
        left = list(self._containers.values())
        self._containers.clear()
        await asyncio.gather(*(asyncio.to_thread(_remove, c) for c in left))


def _remove(container: Any) -> None:
    import docker.errors

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


class RoutedPool:
    """A sandbox pool plus container-task sessions, as one `SandboxPool` (open routes on `env.container`)."""

    def __init__(self, pool: Any, containers: TaskContainers | None = None) -> None:
        self.pool = pool
        self.containers = containers or TaskContainers()

    async def open(self, env: Environment) -> Any:
        return await (self.containers.open(env) if env.container is not None else self.pool.open(env))

    async def call(self, session: Any, tool_name: str, args: dict[str, Any]) -> ToolObservation:
        if isinstance(session, ContainerSession):
            return await self.containers.call(session, tool_name, args)
        return await self.pool.call(session, tool_name, args)

    async def state(self, session: Any) -> Any:
        if isinstance(session, ContainerSession):
            raise SandboxError("a container task's state is its container: it has no snapshot")
        return await self.pool.state(session)

    async def verdict(self, session: Any) -> NativeVerdict:
        if not isinstance(session, ContainerSession):
            raise SandboxError("only a container task has its own tests")
        return await self.containers.verdict(session)

    async def close(self, session: Any) -> None:
        await (self.containers.close(session) if isinstance(session, ContainerSession) else self.pool.close(session))

    async def shutdown(self) -> None:
        try:
            await self.containers.shutdown()
        finally:
            await self.pool.shutdown()

    async def __aenter__(self) -> RoutedPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
