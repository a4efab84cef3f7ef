"""Reading /proc and cgroup files of processes that may exit while a test looks at them."""

from __future__ import annotations


def read_or_empty(path: str) -> str:
    """The file's text, stripped; "" where it is gone (its process exited) or cannot be read."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""
