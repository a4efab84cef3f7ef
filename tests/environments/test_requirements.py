"""Declared Python dependencies (issue 15): an environment that declares `mpmath==1.3.0` imports it in its sessions on
both backends (docker: a derived image, built once and reused; process: a target directory bound into each session);
a requirement no wheel satisfies is a RequirementUnavailable naming it, and a rejection row from `envs import python`,
while the pool keeps serving other environments."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arenaforge.environments.package import read_package, write_package
from arenaforge.environments.runtime import EnvLoadError, RequirementUnavailable, create_pool, run_calls
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc, Rejection
from arenaforge.warehouse import Warehouse
from tests.support.requirements import require_docker

PI_CODE = '''\
import mpmath


def pi(digits: int) -> str:
    """Pi to `digits` significant digits."""
    mpmath.mp.dps = digits
    return str(mpmath.pi)
'''
PI_20 = "3.1415926535897932385"
MISSING = "arenaforge-no-such-package==9.9.9"
BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


def pi_env(requirements: list[str], name: str = "pi") -> Environment:
    doc = FunctionDoc(name="pi", description="Pi to some digits.",
                      parameters={"type": "object", "properties": {"digits": {"type": "integer"}}, "required": ["digits"]})
    return Environment(name=name, tools=[doc], code=PI_CODE, requirements=requirements)


def pool_config(backend: str) -> SandboxConfig:
    if backend == "docker":
        require_docker()
    return SandboxConfig(backend=backend, pool_size=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_declared_requirement_is_importable_in_sessions(backend: str) -> None:
    async def scenario() -> tuple:
        async with await create_pool(pool_config(backend)) as pool:
            first = await run_calls(pool, pi_env(["mpmath==1.3.0"]), [("pi", {"digits": 20})])
            again = await run_calls(pool, pi_env(["mpmath==1.3.0"], name="pi-again"), [("pi", {"digits": 5})])
            try:
                await run_calls(pool, pi_env([], name="pi-undeclared"), [("pi", {"digits": 20})])
                undeclared = None
            except EnvLoadError as err:
                undeclared = err
            return first, again, undeclared, list(pool.images)

    first, again, undeclared, images = asyncio.run(scenario())
    assert [o.outcome for o in first] == ["ok"] and first[0].output == PI_20
    assert again[0].output == "3.1416"
    # the same code without the declaration does not load: the sandbox has the standard library only
    assert undeclared is not None and "No module named 'mpmath'" in undeclared.detail
    if backend == "docker":  # one extra worker, in the derived image; the base worker stays for everything else
        assert images[0] is None and len(images) == 2 and "-deps:" in str(images[1])
    else:
        assert images == [None]


@pytest.mark.docker
def test_sessions_of_a_derived_image_spread_over_more_than_one_worker() -> None:
    """Issue 35: every session of an environment with requirements used to share one derived-image worker (one
    container). Sessions open at once now spread over up to `pool_size` workers of that image."""
    require_docker()

    async def scenario() -> tuple:
        async with await create_pool(SandboxConfig(backend="docker", pool_size=2)) as pool:
            env = pi_env(["mpmath==1.3.0"], name="pi-spread")
            first = await pool.open(env)  # the image's first worker
            second = await pool.open(env)  # that worker is busy: another starts
            while sum(1 for w, i in zip(pool.workers, pool.images) if i and w is not None and w.alive) < 2:
                await asyncio.sleep(0.05)  # it starts in the background; wait for it, not for a time
            sessions = [first, second] + [await pool.open(env) for _ in range(4)]
            outputs = [(await pool.call(s, "pi", {"digits": 5})).output for s in sessions]
            workers = {s.worker.index for s in sessions}
            for s in sessions:
                await pool.close(s)
            return outputs, workers, list(pool.images)

    outputs, workers, images = asyncio.run(scenario())
    assert outputs == ["3.1416"] * 6
    assert images[:2] == [None, None] and len(images) == 4 and len(set(images[2:])) == 1  # two of the derived image
    assert len(workers) == 2 and all(images[i] == images[2] for i in workers)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_wheel_names_the_requirement_and_nothing_else_fails(backend: str) -> None:
    async def scenario() -> tuple:
        async with await create_pool(pool_config(backend)) as pool:
            with pytest.raises(RequirementUnavailable) as caught:
                await run_calls(pool, pi_env(["mpmath==1.3.0", MISSING], name="broken"), [("pi", {"digits": 3})])
            plain = Environment(name="plain", tools=[FunctionDoc(name="echo", description="Echo.")],
                                code="def echo(text='hi'):\n    return text\n")
            after = await run_calls(pool, plain, [("echo", {"text": "still here"})])
            return caught.value, after

    err, after = asyncio.run(scenario())
    assert err.requirement == MISSING and len(str(err).splitlines()) == 1
    assert f"requirement {MISSING} is unavailable: no wheel for Python" in str(err)
    assert [o.output for o in after] == ["still here"]


def test_import_python_with_a_missing_wheel_is_a_rejection_row(tmp_path: Path) -> None:
    (tmp_path / "pi.py").write_text(PI_CODE)
    db = tmp_path / "wh.duckdb"
    argv = ["--db", str(db), "envs", "import", "python", str(tmp_path / "pi.py"), "--requirement", MISSING,
            "--backend", "process"]
    res = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", *argv], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=600)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and f"requirement {MISSING} is unavailable" in lines[0], res.stderr
    rows = Warehouse(db).load(Rejection)
    assert [(r.stage, r.reason, r.payload["requirement"]) for r in rows] == [("import_python", "missing_requirement", MISSING)]


def test_requirements_are_format_2_and_survive_the_package(tmp_path: Path) -> None:
    env = pi_env(["mpmath==1.3.0"])
    assert env.format_version == 2 and env.id != pi_env([]).id
    assert json.loads((write_package(env, tmp_path / "pkg") / "env.json").read_text())["requirements"] == ["mpmath==1.3.0"]
    assert read_package(tmp_path / "pkg") == env
    for bad in ("mpmath", "--index-url=http://evil", "mpmath @ https://x/y.whl", "mpmath==1.3; python_version<'3'"):
        with pytest.raises(ValueError, match="requirements must be a package name with version specifiers"):
            pi_env([bad])
