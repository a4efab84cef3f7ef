"""The image of a task that brings its own container (`Environment.container`, an imported Harbor task), built offline.

No registry is reachable, so every image a Dockerfile starts FROM must already be present locally: `base_images`
reads them (ARG defaults and build arguments substituted, earlier stages skipped) and `build_task_image` refuses a
missing one with `TaskImageError("base_image_missing", ...)` before Docker would try to pull it. The tag is a hash
of the Dockerfile, its context and build arguments, so each task version is built once and reused by every session.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import ContainerTask

TAG_PREFIX = "arenaforge-task"
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.IGNORECASE)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class TaskImageError(Exception):
    """The task's image cannot be had; `reason` is its rejection code (base_image_missing, image_build_failed)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def image_tag(task: ContainerTask) -> str:
    recipe = {"dockerfile": task.dockerfile, "context": task.context, "build_args": task.build_args}
    return f"{TAG_PREFIX}:{hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]}"


def base_images(task: ContainerTask) -> list[str]:
    """The images the Dockerfile's FROM lines name (after ARG substitution), other than its own earlier stages."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []

    def substitute(text: str) -> str:
        return _VAR.sub(lambda m: task.build_args.get(m.group(1) or m.group(3), args.get(m.group(1) or m.group(3))
                                                      or m.group(2) or ""), text)

    for line in task.dockerfile.replace("\\\n", " ").splitlines():
        if arg := _ARG.match(line):
            args[arg.group(1)] = task.build_args.get(arg.group(1), arg.group(2) or "")
        elif head := _FROM.match(line):
            image = substitute(head.group(1))
            if image not in stages and image != "scratch":
                images.append(image)
            if head.group(2):
                stages.add(head.group(2))
    return images


def missing_base_images(client: Any, task: ContainerTask) -> list[str]:
    import docker.errors

    missing = []
    for image in base_images(task):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing.append(image)
    return missing


def build_task_image(client: Any, task: ContainerTask) -> str:
    """The task's image tag, built now unless it exists; TaskImageError when it cannot be built offline."""
    import docker.errors

    tag = image_tag(task)
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    missing = missing_base_images(client, task)
    if missing:
        raise TaskImageError("base_image_missing", f"FROM image {', '.join(missing)} is not present locally and no "
                                                   "registry is reachable (docker load it, or pass --build-arg to "
                                                   "name a local image)")
    with tempfile.TemporaryDirectory(prefix="arenaforge-task-") as tmp:
        root = Path(tmp)
        for name, text in task.context.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
        (root / "Dockerfile").write_text(task.dockerfile, encoding="utf-8")
        try:
            client.images.build(path=tmp, tag=tag, buildargs=task.build_args, rm=True, forcerm=True, pull=False,
                                network_mode="none")
        except docker.errors.BuildError as err:
            last = next((str(c.get("stream") or c.get("error") or "").strip() for c in reversed(list(err.build_log))
                         if str(c.get("stream") or c.get("error") or "").strip()), str(err))
            raise TaskImageError("image_build_failed", f"docker build failed: {last[:300]}") from None
        except docker.errors.APIError as err:
            raise TaskImageError("image_build_failed", f"docker build failed: {str(err)[:300]}") from None
    return tag
