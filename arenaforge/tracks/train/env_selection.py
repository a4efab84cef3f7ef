"""Which warehouse environments a job trains or evaluates on: the params' selection, restricted to the stored split."""

from __future__ import annotations

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from arenaforge.tracks.train.params import EnvSelection
from arenaforge.warehouse import Warehouse


def select_envs(wh: Warehouse, sel: EnvSelection) -> list[Environment]:
    """Environments from the warehouse, filtered and restricted to the stored split; an input error when none."""
    envs = matching_envs(wh, sel)
    if not envs:
        wanted = sel.model_dump(exclude_defaults=True) or "the selection"
        raise InputError(f"no environments in {wh.path} match {wanted} (run `arenaforge envs ...` first)")
    return envs


def matching_envs(wh: Warehouse, sel: EnvSelection) -> list[Environment]:
    """Environments from the warehouse, filtered and restricted to the stored split (assigned on first use)."""
    from arenaforge.tracks.train.splits import ensure_splits

    envs = wh.load(Environment)
    if sel.suite:
        envs = [e for e in envs if e.native is not None and e.native.suite == sel.suite]
    if sel.env_ids:
        wanted = set(sel.env_ids)
        envs = [e for e in envs if e.id in wanted or e.name in wanted]
    if sel.split != "all":
        split = "test" if sel.split == "eval" else sel.split
        rows = ensure_splits(wh, scheme=sel.scheme, test_share=sel.test_share, seed=sel.split_seed)
        envs = [e for e in envs if rows[e.id].split == split]
    return envs[: sel.limit] if sel.limit else envs
