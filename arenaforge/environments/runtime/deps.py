"""Declared Python dependencies of environments: local wheels -> a target directory -> a derived sandbox image.

An environment (format 2) declares `requirements` (`mpmath==1.3.0`). Per requirement set and target Python:
  1. pip installs it with `--no-index --find-links` from the wheel directory (`<cache>/wheels`, plus the
     find-links pip is configured with) into `<cache>/deps/<key>`, wheels only (`--only-binary=:all:`) and for
     the sandbox's Python (`--python-version`), so nothing is built or run on the host;
  2. only when a wheel is missing there, `pip download` fetches it into the wheel directory from whatever
     registry pip is configured with (none reachable: that step fails and the requirement is unavailable);
  3. Docker backend: a derived image `<image>-deps:<hash>` = the sandbox image plus that directory under
     /opt/arenaforge/deps, built once per machine (the tag hashes the base image and the requirement set).
The worker puts the directory on the session's sys.path (`Template.paths`; bound read-only into its private
mounts, so a hidden host path still works). A requirement no wheel satisfies raises `RequirementUnavailable`
naming it. Blocking (pip, docker): callers run these in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.environments.runtime.image import _image_exists, _remove_old_tags, cache_dir
from arenaforge.schemas.errors import SandboxError

DEPS_ROOT_IN_IMAGE = "/opt/arenaforge/deps"
PIP_TIMEOUT_S = 600
# pip's ways of saying a requirement has no usable distribution; the requirement is the last word
NOT_FOUND = re.compile(r"(?:No matching distribution found for|Could not find a version that satisfies the requirement)\s+(\S+)")


class Unavailable(SandboxError):
    """No wheel satisfies `requirement` (the pool re-raises it as the environment's RequirementUnavailable)."""

    def __init__(self, requirement: str, detail: str) -> None:
        super().__init__(f"requirement {requirement} is unavailable: {detail}")
        self.requirement, self.detail = requirement, detail


def requirement_key(requirements: Sequence[str], python: str) -> str:
    """The content address of a requirement set for one Python version (order and spacing do not matter)."""
    normal = sorted({re.sub(r"\s+", "", r).lower() for r in requirements})
    return hashlib.sha256(json.dumps({"requirements": normal, "python": python}).encode()).hexdigest()[:16]


def wheel_dir() -> Path:
    path = cache_dir() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def python_version(python: str) -> str:
    """`major.minor` of the interpreter at `python`."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = subprocess.run([python, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=30, env={})
    if out.returncode != 0:
        raise SandboxError(f"cannot tell the version of {python}: {out.stderr.strip()[-300:]}")
    return out.stdout.strip()


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--no-input", "--quiet"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"pip did not finish within {PIP_TIMEOUT_S} s")


def _unavailable(requirements: Sequence[str], python: str, proc: subprocess.CompletedProcess[str]) -> Unavailable:
    text = proc.stdout + proc.stderr
    found = NOT_FOUND.findall(text)
    requirement = found[-1] if found else ", ".join(requirements)
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR")]
    detail = lines[-1] if lines else (text.strip().splitlines() or ["pip failed"])[-1]
    return Unavailable(requirement, f"no wheel for Python {python} in {wheel_dir()} or a reachable registry ({detail})")


def install(requirements: Sequence[str], python: str) -> Path:
    """The directory holding `requirements` installed for Python `python` (`3.11`), made once per machine."""
    root = cache_dir() / "deps"
    root.mkdir(parents=True, exist_ok=True)
    target = root / requirement_key(requirements, python)
    if target.is_dir():
        return target
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other pools on this machine install the same set once
        if target.is_dir():
            return target
        wheels = str(wheel_dir())
        select = ["--only-binary=:all:", "--python-version", python]
        work = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=root))
        try:
            offline = ["install", "--no-index", "--find-links", wheels, *select, "--target", str(work / "site"),
                       "--no-compile", *requirements]
            proc = _pip(*offline)
            if proc.returncode != 0:  # a wheel is missing here: fetch it where pip is configured to, then again
                fetched = _pip("download", *select, "--retries", "1", "--timeout", "20", "--dest", wheels, *requirements)
                if fetched.returncode != 0:
                    raise _unavailable(requirements, python, fetched)
                shutil.rmtree(work / "site", ignore_errors=True)
                proc = _pip(*offline)
                if proc.returncode != 0:
                    raise _unavailable(requirements, python, proc)
            for path in (work / "site").rglob("*"):  # readable by every session uid
                path.chmod(0o755 if path.is_dir() else 0o644)
            (work / "site").chmod(0o755)
            (work / "site").rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def derived_image(client: Any, base_ref: str, requirements: Sequence[str], python: str) -> tuple[str, str]:
    """(image reference, directory inside it) of the sandbox image `base_ref` plus `requirements`, built if missing."""
    import docker.errors

    key = requirement_key(requirements, python)
    name, _, base_tag = base_ref.rpartition(":")
    ref = f"{name}-deps:{hashlib.sha256(f'{base_tag}/{key}'.encode()).hexdigest()[:16]}"
    inside = f"{DEPS_ROOT_IN_IMAGE}/{key}"
    if _image_exists(client, ref):
        return ref, inside
    site = install(requirements, python)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        dockerfile = f"FROM {base_ref}\nCOPY site {inside}\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(str(site), arcname="site", filter=_root_owned)
    context.seek(0)
    try:
        client.images.build(fileobj=context, custom_context=True, tag=ref, pull=False, rm=True, forcerm=True,
                            labels={"arenaforge.requirements": json.dumps(sorted(requirements))})
    except (docker.errors.BuildError, docker.errors.APIError) as err:
        raise SandboxError(f"building {ref} failed: {err}") from err
    _remove_old_tags(client, f"{name}-deps", ref)  # derived images of earlier recipes, once a day old
    return ref, inside


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
