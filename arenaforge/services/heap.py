"""A run's tenured heap: what survived a full garbage collection is not walked again by the next ones.

CPython runs a full collection each time the objects that survived younger collections reach a quarter of
the old heap, and each one walks every tracked object. A run that holds large inputs (10,000 tools and
their graphs, a stage's loaded trajectories) walks them over and over: 3.2-3.5 of `bench sft`'s ~13 CPU
seconds. Inside `tenured_heap()` each full collection's survivors go to the permanent generation
(`gc.freeze`), so the next one walks only what is newer; so does what is alive when the outermost scope opens. Reference counting still frees acyclic garbage
at once; when the outermost scope ends `gc.unfreeze` hands everything back to the collector, so a cycle
that died among tenured objects is freed then. Scopes nest and may overlap across threads: one count.

`open_run_scope` opens one per run (synthesis flows and their benchmarks); a training scope does not, so
autograd's cycles are never held back.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_scopes = 0


def _tenure(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()  # moves lists only: O(1)


@contextlib.contextmanager
def tenured_heap() -> Iterator[None]:
    """Full collections in this scope skip what an earlier one found alive; all is handed back at the end."""
    global _scopes
    with _lock:
        _scopes += 1
        if _scopes == 1:
            gc.callbacks.append(_tenure)
            # what is alive as the run opens (modules, a loaded embedding model, torch) is tenured now: a dead cycle
            # among it waits for the scope's end, and the run's first full collection, often set off by its start's
            # burst of allocations (4,096 decomposition tasks), does not walk it (0.3 s at `bench envs`' stream start)
            gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _scopes -= 1
            if _scopes == 0:
                gc.callbacks.remove(_tenure)
                gc.unfreeze()
