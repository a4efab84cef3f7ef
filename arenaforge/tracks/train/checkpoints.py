"""Checkpoint policy shared by the trainers (ASTRA's SFT infrastructure, METHOD.md §1c).

Weights (save_pretrained + tokenizer) are written every `every` steps and at the end, under
`out/step-NNNNNN/`; optimizer + scheduler + trainer state go with each save but are deleted
from all but the newest `keep_optimizer` checkpoints, so disk grows by weights only. Resume
picks the newest checkpoint that still has its optimizer state.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step-(\d{6,})$")
STATE_FILE = "trainer_state.pt"
META_FILE = "trainer_meta.json"


@dataclass(frozen=True)
class Saved:
    step: int
    path: Path
    has_optimizer: bool


class CheckpointManager:
    def __init__(self, out_dir: str | Path, every: int = 1, keep_optimizer: int = 2) -> None:
        if keep_optimizer < 1:
            raise ValueError("keep_optimizer must be at least 1 (resume needs one)")
        self.out = Path(out_dir)
        self.every = max(1, every)
        self.keep_optimizer = keep_optimizer

    def due(self, step: int, last: bool) -> bool:
        return last or step % self.every == 0

    def save(self, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
             meta: dict[str, Any]) -> Saved:
        path = self.out / f"step-{step:06d}"
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps({"step": step, **meta}, indent=2, default=str))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)  # a killed save leaves only a .tmp dir, never a half checkpoint
        self._prune()
        return Saved(step, path, True)

    def checkpoints(self) -> list[Saved]:
        found = []
        if self.out.exists():
            for child in self.out.iterdir():
                match = _STEP_DIR.match(child.name)
                if match and child.is_dir():
                    found.append(Saved(int(match.group(1)), child, (child / STATE_FILE).exists()))
        return sorted(found, key=lambda s: s.step)

    def latest_resumable(self) -> Saved | None:
        return next((s for s in reversed(self.checkpoints()) if s.has_optimizer), None)

    def _prune(self) -> None:
        with_state = [s for s in self.checkpoints() if s.has_optimizer]
        for old in with_state[: -self.keep_optimizer]:
            (old.path / STATE_FILE).unlink(missing_ok=True)

    @staticmethod
    def load_state(saved: Saved) -> tuple[dict[str, Any], dict[str, Any]]:
        state = torch.load(saved.path / STATE_FILE, weights_only=False)
        meta = json.loads((saved.path / META_FILE).read_text())
        return state, meta
