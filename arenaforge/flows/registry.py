"""Every Prefect flow the project deploys, by deployment name.

Each capability appends its flows here; `arenaforge serve` registers one deployment per
entry, and the CLI runs the same flow objects locally. Entries are import paths so that
importing this module stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

# deployment name -> "module:flow_function"
FLOWS: dict[str, str] = {
    "ingest": "arenaforge.flows.sft_flows:ingest",
    "graph": "arenaforge.flows.sft_flows:graph",
    "sft": "arenaforge.flows.sft_flows:sft",
    "envs": "arenaforge.flows.envs_flows:envs",
    "envs-import-python": "arenaforge.flows.envs_import_flows:import_python",
    "envs-import-bfcl": "arenaforge.flows.envs_import_flows:import_bfcl",
    "envs-import-harbor": "arenaforge.flows.envs_import_flows:import_harbor",
    "rollout": "arenaforge.flows.train_flows:rollout",
    "train-grpo": "arenaforge.flows.train_flows:train_grpo",
    "train-sft": "arenaforge.flows.train_flows:train_sft",
    "warmstart": "arenaforge.flows.train_flows:warmstart",
    "eval": "arenaforge.flows.train_flows:evaluate",
}


def load_flow(name: str) -> Any:
    module, attr = FLOWS[name].split(":")
    return getattr(importlib.import_module(module), attr)
