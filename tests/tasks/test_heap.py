"""The run's tenured heap (`services/heap.py`): survivors of a full collection are skipped by later ones while a
run lasts, and nothing stays uncollectable once the outermost scope ends."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from arenaforge.schemas.config import Config, WarehouseConfig
from arenaforge.services.heap import tenured_heap
from arenaforge.services.run_scope import open_run_scope
from arenaforge.warehouse import Warehouse


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_survivors_are_tenured_and_a_cycle_that_dies_among_them_is_freed_when_the_scope_ends() -> None:
    assert gc.get_freeze_count() == 0
    with tenured_heap():
        old = Node()
        gc.collect()  # a full collection: `old` survives it and is tenured
        assert gc.get_freeze_count() > 0
        dead_old = weakref.ref(old)
        del old
        young = Node()
        dead_young = weakref.ref(young)
        del young
        gc.collect()
        assert dead_young() is None  # newer than the last full collection: walked and freed as always
        assert dead_old() is not None  # tenured: the collector skips it while the scope lasts
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert dead_old() is None  # handed back and freed


def test_what_is_alive_when_the_outermost_scope_opens_is_tenured_at_once() -> None:
    before = Node()
    dead = weakref.ref(before)
    with tenured_heap():
        assert gc.get_freeze_count() > 0  # before any collection in the scope
        del before
        gc.collect()
        assert dead() is not None  # tenured as the scope opened: the collector skips it
    gc.collect()
    assert dead() is None  # handed back and freed


def test_scopes_nest_and_overlap_across_threads_and_the_last_to_end_hands_everything_back() -> None:
    inner_done, outer_may_end = threading.Event(), threading.Event()

    def other_thread() -> None:
        with tenured_heap():
            inner_done.wait()
        outer_may_end.set()

    with tenured_heap():
        thread = threading.Thread(target=other_thread)
        thread.start()
        with tenured_heap():
            gc.collect()
        assert gc.get_freeze_count() > 0  # an inner scope's end leaves the outer ones tenuring
        keep = Node()
        gc.collect()
        inner_done.set()
        outer_may_end.wait()
        thread.join()
        assert gc.get_freeze_count() > 0  # the other thread's scope ended; this one has not
        dead = weakref.ref(keep)
        del keep
    assert gc.get_freeze_count() == 0 and not any(cb.__module__ == "arenaforge.services.heap" for cb in gc.callbacks)
    gc.collect()
    assert dead() is None


def test_a_run_scope_tenures_its_heap_until_it_closes(tmp_path) -> None:
    cfg = Config(warehouse=WarehouseConfig(path=str(tmp_path / "wh")), out_dir=str(tmp_path / "out"))

    async def run() -> int:
        async with open_run_scope(cfg, Warehouse(cfg.warehouse.path), "r"):
            gc.collect()
            return gc.get_freeze_count()

    assert asyncio.run(run()) > 0
    assert gc.get_freeze_count() == 0


def test_a_training_scope_keeps_no_chat_model_and_no_tenured_heap(tmp_path) -> None:
    """Training runs in a scope too, but autograd's cycles must be freed as they die: nothing is frozen."""
    cfg = Config(warehouse=WarehouseConfig(path=str(tmp_path / "wh")), out_dir=str(tmp_path / "out"))

    async def run() -> tuple[int, object]:
        async with open_run_scope(cfg, Warehouse(cfg.warehouse.path), "r", training=True) as scope:
            gc.collect()
            return gc.get_freeze_count(), scope.model

    assert asyncio.run(run()) == (0, None)
