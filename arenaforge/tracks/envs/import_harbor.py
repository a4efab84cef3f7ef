"""Import Harbor task directories as warehouse environments (`arenaforge envs import harbor DIR`).

A Harbor task is `instruction.md`, `task.toml`, `environment/Dockerfile` (plus its build context), `tests/test.sh`
and optionally `solution/solve.sh`. Two kinds arrive:

- ours (written by `envs export --format harbor`, which puts the whole record in tests/environment.json): read back
  as the very environment it was exported from, same id, checked against task.toml's id;
- others': a container task (`Environment.container`): the agent works in the task's own container through shell
  and file tools (`environments.containers.SHELL_TOOLS`); the native check (`harbor_tests`) is the task's own
  tests/test.sh reward, kept beside our F1; the gold call is solution/solve.sh, replayed through `run_shell`.

`verify_task` builds the image offline (a FROM image that is not present locally is a `base_image_missing`
rejection), replays the gold solution in a fresh container and runs the task's tests: the solution must pass
them. Lineage: the directory and the SHA-256 of its files (in `native.source` and the provenance); re-importing
the same directory yields the same ids, so it adds nothing.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

from arenaforge.environments.containers import SHELL_TOOLS, TaskContainers
from arenaforge.environments.task_image import TaskImageError
from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import InputError, SandboxError
from arenaforge.schemas.models import ContainerTask, Environment, GoldCall, NativeCheck, Rejection, Verification
from arenaforge.schemas.reasons import RejectReason

STAGE = "import_harbor"
RECORD_FILE = "tests/environment.json"  # where our export keeps the record (tests/ reaches the container only after the agent)
REQUIRED = ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh")
MAX_FILE_BYTES = 4 << 20


def task_dirs(root: str | Path) -> list[Path]:
    """`root` itself when it is a task directory, else its task subdirectories (sorted); InputError when none."""
    path = Path(root)
    if not path.is_dir():
        raise InputError(f"{root}: no such directory")
    if (path / "task.toml").is_file() or (path / "instruction.md").is_file():
        return [path]
    found = sorted(d for d in path.iterdir() if d.is_dir() and ((d / "task.toml").is_file() or (d / "instruction.md").is_file()))
    if not found:
        raise InputError(f"{root}: no Harbor task directories (a task has instruction.md and task.toml)")
    return found


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` as text, by relative path; ValueError for one that is not UTF-8 text or too big."""
    out = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        if file.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{file} is larger than {MAX_FILE_BYTES >> 20} MiB")
        try:
            out[file.relative_to(folder).as_posix()] = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{file} is not UTF-8 text (binary files are not supported)") from None
    return out


def _reject(path: Path, reason: RejectReason, detail: str) -> Rejection:
    return Rejection(stage=STAGE, subject=str(path.resolve()), reason=reason, detail=detail)


def read_task(path: Path, suite: str, build_args: dict[str, str] | None = None) -> Environment | Rejection:
    """The environment a task directory holds (ours: exactly the exported one; others': a container task, not yet
    verified), or a rejection saying which file is missing or malformed."""
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        return _reject(path, RejectReason.NOT_A_TASK, f"not a Harbor task: {', '.join(missing)} missing")
    try:
        meta = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
        files = _files(path)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as err:
        return _reject(path, RejectReason.NOT_A_TASK, f"not a Harbor task: {str(err).splitlines()[0]}")
    if RECORD_FILE in files:
        return _ours(path, meta, files[RECORD_FILE])
    try:
        return _theirs(path, meta, files, suite, build_args or {})
    except (TypeError, ValueError) as err:  # e.g. a timeout_sec that is not a positive number
        return _reject(path, RejectReason.NOT_A_TASK, f"not a Harbor task: task.toml: {str(err).splitlines()[0]}")


def _ours(path: Path, meta: dict[str, Any], record: str) -> Environment | Rejection:
    try:
        env = Environment.model_validate_json(record)
    except ValueError as err:
        return _reject(path, RejectReason.NOT_A_TASK, f"{RECORD_FILE} is not an environment: {str(err).splitlines()[0]}")
    exported_id = (meta.get("metadata") or {}).get("id")
    if env.compute_id() != env.id or exported_id != env.id:
        return _reject(path, RejectReason.NOT_A_TASK, f"{RECORD_FILE} does not match its id or task.toml's id "
                                                      f"{exported_id!r} (edited after export?)")
    return env


def _theirs(path: Path, meta: dict[str, Any], files: dict[str, str], suite: str,
            build_args: dict[str, str]) -> Environment:
    digest = hashlib.sha256("".join(f"{k}\0{v}\0" for k, v in sorted(files.items())).encode()).hexdigest()
    source = f"{path.resolve()} (sha256 {digest})"
    section = lambda name: meta.get(name) if isinstance(meta.get(name), dict) else {}  # noqa: E731
    timeout = lambda name: float(section(name).get("timeout_sec") or 600.0)  # noqa: E731
    under = lambda prefix: {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}  # noqa: E731
    context = under("environment/")
    task = ContainerTask(dockerfile=context.pop("Dockerfile"), context=context, build_args=build_args,
                         tests=under("tests/"), agent_timeout_s=timeout("agent"), verifier_timeout_s=timeout("verifier"))
    solution = under("solution/")
    calls = [GoldCall(tool="run_shell", arguments={"command": solve_command(solution)})] if "solve.sh" in solution else []
    name = str(section("metadata").get("name") or path.name)
    return Environment(name=name, tools=SHELL_TOOLS, code="", question=files["instruction.md"], calls=calls,
                       container=task, native=NativeCheck(suite=suite, kind="harbor_tests", source=source),
                       provenance=Provenance(backend="import", source=source))


def solve_command(solution: dict[str, str]) -> str:
    """One shell command that writes solution/ to /solution and runs solve.sh, as Harbor's oracle agent does."""
    lines = ["mkdir -p /solution"]
    for name, text in sorted(solution.items()):
        marker = "ARENAFORGE_EOF"
        while marker in text:
            marker += "_"
        lines.append(f"mkdir -p \"$(dirname '/solution/{name}')\" && cat > '/solution/{name}' <<'{marker}'\n"
                     f"{text}{'' if text.endswith(chr(10)) else chr(10)}{marker}")
    lines.append("bash /solution/solve.sh")
    return "\n".join(lines)


async def verify_task(containers: TaskContainers, env: Environment) -> Environment | Rejection:
    """A container task replayed: its image builds offline, its gold solution passes its own tests (when it has one)."""
    subject = env.native.source if env.native else env.name
    try:
        await containers.image(env)
    except TaskImageError as err:
        return Rejection(stage=STAGE, subject=subject, reason=RejectReason(err.reason), detail=err.detail)
    details = ["image builds offline"]
    if env.calls:
        try:
            session = await containers.open(env)
            try:
                observations = [await containers.call(session, c.tool, c.arguments) for c in env.calls]
                verdict = await containers.verdict(session)
            finally:
                await containers.close(session)
        except SandboxError as err:
            return Rejection(stage=STAGE, subject=subject, reason=RejectReason.SANDBOX_FAILURE, detail=str(err))
        if not verdict.passed:
            said = (observations[-1].error or observations[-1].output).strip().splitlines()[-1:] or [""]
            return Rejection(stage=STAGE, subject=subject, reason=RejectReason.SOLUTION_FAILED,
                             detail=f"solution/solve.sh does not pass tests/test.sh: {verdict.reason} "
                                    f"(solve.sh said: {said[0][:160]})")
        details.append("solution/solve.sh passes tests/test.sh (reward >= 1)")
    else:
        details.append("no solution/solve.sh: no gold replay")
    checks = {"image_builds": True, "gold_passes_tests": bool(env.calls)}
    verification = Verification(passed=True, checks=checks, details=details)
    return Environment.model_validate({**env.model_dump(), "id": "", "verification": verification.model_dump()})


async def import_tasks(containers: TaskContainers, root: str | Path, suite: str,
                       build_args: dict[str, str] | None = None) -> tuple[list[Environment], list[Rejection]]:
    """Every task under `root`: (environments, rejections). Ours come back as exported; others' are verified."""
    envs: list[Environment] = []
    rejections: list[Rejection] = []
    for path in task_dirs(root):
        read = read_task(path, suite, build_args)
        if isinstance(read, Environment) and read.container is not None:
            read = await verify_task(containers, read)
        (envs if isinstance(read, Environment) else rejections).append(read)
    return envs, rejections
