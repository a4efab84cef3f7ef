"""The sandbox image, built offline: debootstrap a minimal Debian, `docker import` it, add the worker.

No registry is reachable, so the base is a `debootstrap --variant=minbase` root filesystem of
Debian bookworm with python3, made from the apt mirror the machine already uses. The rootfs
tarball is cached under `~/.cache/arenaforge` (or `$ARENAFORGE_CACHE`) keyed by its recipe, so
a rebuild after a worker change takes seconds. The image tag is a hash of the whole recipe
(debootstrap parameters, Dockerfile, worker source): an image is rebuilt only when it changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import SandboxError

log = logging.getLogger("arenaforge.sandbox")

WORKER_DIR = Path(__file__).with_name("worker")  # the worker package (standard library only)
WORKER_ROOT_IN_IMAGE = "/opt/arenaforge"
# -I keeps the script's directory off sys.path, so the boot line puts the package's parent there
BOOT = "import sys; sys.path.insert(0, {root!r}); from worker.server import main; main()"


def worker_argv(python: str, root: str | Path = WORKER_DIR.parent) -> list[str]:
    """The command that starts a worker with `python` from the package under `root`."""
    return [python, "-I", "-S", "-c", BOOT.format(root=str(root))]


def worker_sources() -> dict[str, bytes]:
    """The worker package's files, by name (what the image holds and its tag hashes)."""
    return {p.name: p.read_bytes() for p in sorted(WORKER_DIR.glob("*.py"))}


WORKER_COMMAND = worker_argv("/usr/bin/python3", WORKER_ROOT_IN_IMAGE)
ROOTFS_RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3-minimal", "python3"],
    # paths emptied after debootstrap: caches and docs nobody reads in a sandbox
    "trim": ["var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"],
    "version": 1,
}
DOCKERFILE = f"""\
FROM {{base}}
COPY worker {WORKER_ROOT_IN_IMAGE}/worker
ENV PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
CMD {json.dumps(WORKER_COMMAND)}
"""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PYTHON_VERSION = "3.11"  # bookworm's python3: declared requirements are installed for it (runtime/deps.py)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_hash() -> str:
    return _digest(ROOTFS_RECIPE)


def image_tag() -> str:
    """Hash of the recipe: rootfs parameters, Dockerfile and worker source."""
    worker = {name: hashlib.sha256(data).hexdigest() for name, data in worker_sources().items()}
    return _digest({"rootfs": ROOTFS_RECIPE, "dockerfile": DOCKERFILE, "worker": worker})


def image_ref(name: str) -> str:
    return f"{name}:{image_tag()}"


def cache_dir() -> Path:
    root = os.environ.get("ARENAFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "arenaforge")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def apt_mirror() -> str:
    """The Debian mirror apt is configured with (deb822 or one-line sources), for debootstrap."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for file in files:
        try:
            text = file.read_text()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and ROOTFS_RECIPE["suite"] in suites.group(1).split():
                return uris.group(1)
        for line in text.splitlines():
            match = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if match and match.group(2) == ROOTFS_RECIPE["suite"]:
                return match.group(1)
    return DEFAULT_MIRROR


def rootfs_tarball(force: bool = False) -> Path:
    """The cached debootstrap root filesystem as a tar file, made if missing (about a minute)."""
    dest = cache_dir() / f"rootfs-{ROOTFS_RECIPE['suite']}-{rootfs_hash()}.tar"
    if dest.exists() and not force:
        return dest
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed (scripts/start-docker.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir()))
    try:
        rootfs = work / "rootfs"
        mirror = apt_mirror()
        cmd = [
            "debootstrap",
            f"--variant={ROOTFS_RECIPE['variant']}",
            f"--include={','.join(ROOTFS_RECIPE['include'])}",
            ROOTFS_RECIPE["suite"],
            str(rootfs),
            mirror,
        ]
        log.info("debootstrap %s from %s (cached afterwards in %s)", ROOTFS_RECIPE["suite"], mirror, dest)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SandboxError(f"debootstrap failed (exit {proc.returncode}): {tail}")
        tar_rootfs(rootfs, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def tar_rootfs(rootfs: Path, dest: Path) -> None:
    """Trim a root filesystem and write it as a tar (atomically)."""
    for rel in ROOTFS_RECIPE["trim"]:
        target = rootfs / rel
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    tmp = dest.with_suffix(".tar.part")
    proc = subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp), "."], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"tar of the rootfs failed: {proc.stderr[-1000:]}")
    tmp.replace(dest)


def _image_exists(client: Any, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(client: Any, name: str, force: bool = False) -> str:
    """Make `name:<recipe hash>` if missing; returns the reference. `client` is a docker SDK client."""
    import docker.errors

    ref = image_ref(name)
    if not force and _image_exists(client, ref):
        return ref
    base = f"{name}-base:{rootfs_hash()}"
    if force or not _image_exists(client, base):
        tarball = rootfs_tarball()
        log.info("importing %s as %s", tarball, base)
        repo, tag = base.rsplit(":", 1)
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag)
        if not _image_exists(client, base):
            raise SandboxError(f"docker import of {tarball} did not produce {base}")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        files = {"Dockerfile": DOCKERFILE.format(base=base).encode()}
        files.update({f"worker/{name}": data for name, data in worker_sources().items()})
        for arcname, data in files.items():
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    try:
        client.images.build(fileobj=context, custom_context=True, tag=ref, pull=False, rm=True, forcerm=True)
    except (docker.errors.BuildError, docker.errors.APIError) as err:
        raise SandboxError(f"building {ref} failed: {err}") from err
    log.info("built sandbox image %s", ref)
    _remove_old_tags(client, name, ref)
    return ref


def _remove_old_tags(client: Any, name: str, keep: str) -> None:
    """Drop images of earlier recipes once they are a day old (other checkouts on this engine may still use a
    recent one; best effort: one still used by a container stays)."""
    import docker.errors

    cutoff = time.time() - 86400
    for image in client.images.list(name=name):
        created = str(image.attrs.get("Created", ""))[:19]
        try:
            old = time.mktime(time.strptime(created, "%Y-%m-%dT%H:%M:%S")) - time.timezone < cutoff
        except ValueError:
            old = False
        for tag in image.tags:
            if old and tag.startswith(f"{name}:") and tag != keep:
                try:
                    client.images.remove(tag, noprune=False)
                except docker.errors.APIError:
                    pass
