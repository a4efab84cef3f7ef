"""`arenaforge envs import python` (issue 15): a user's own stateful class, imported from a file path, replays its gold
calls in the sandbox to the same state hash as running it in this process; schemas derived from typed signatures
and docstrings; bad input is a one-line error."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arenaforge.environments.state import namespace_state, state_hash
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.import_python import derive_tool_docs, read_source
from arenaforge.warehouse import Warehouse

BANK = '''\
"""A user's own bank: accounts, transfers and an audit log."""
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional


@dataclass
class Entry:
    kind: str
    amount: float
    tags: set = field(default_factory=set)


class Bank:
    """Accounts with balances."""

    def __init__(self, fee: float = 0.0):
        self.fee = fee
        self.accounts: Dict[str, float] = {}
        self.log: List[Entry] = []
        self._cache = {}

    def load_state(self, state: dict) -> None:
        self.accounts = dict(state["accounts"])

    def balance(self, account: str) -> float:
        """Read an account's balance.

        Args:
            account (str): The account id, e.g. "A1".
        """
        return self.accounts[account]

    def transfer(self, source: str, target: str, amount: float, memo: Optional[str] = None) -> Dict[str, float]:
        """Move money between two accounts; the fee is taken from the source.

        Args:
            source (str): Account to take the money from.
            target (str): Account to credit.
            amount (float): How much to move; must be positive
                and at most the source's balance.
            memo (str): A note kept in the log.

        Returns:
            balances (dict): Both accounts' new balances.
        """
        if amount <= 0 or amount + self.fee > self.accounts[source]:
            raise ValueError("invalid amount")
        self.accounts[source] -= amount + self.fee
        self.accounts[target] = self.accounts.get(target, 0.0) + amount
        self.log.append(Entry("transfer", amount, {memo} if memo else set()))
        return {source: self.accounts[source], target: self.accounts[target]}

    def freeze(self, account: str, mode: Literal["soft", "hard"] = "soft") -> None:
        """Freeze an account (returns nothing)."""
        self.log.append(Entry("freeze:" + mode, 0.0))

    def _internal(self) -> None:
        pass
'''
STATE = {"accounts": {"A1": 100.0, "A2": 5.0}}
CALLS = [{"tool": "transfer", "arguments": {"source": "A1", "target": "A2", "amount": 30, "memo": "rent"}},
         {"tool": "freeze", "arguments": {"account": "A2"}},
         {"name": "balance", "arguments": '{"account": "A1"}', "answer": "68.5"}]


@pytest.fixture()
def bank_files(tmp_path: Path) -> Path:
    (tmp_path / "bank.py").write_text(BANK)
    (tmp_path / "state.json").write_text(json.dumps(STATE))
    (tmp_path / "calls.json").write_text(json.dumps(CALLS))
    return tmp_path


def in_process_hash(path: Path) -> str:
    """The same class run here, without the sandbox: the reference."""
    spec = importlib.util.spec_from_file_location("users_bank", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bank = module.Bank(fee=1.5)
    bank.load_state(json.loads(json.dumps(STATE)))
    for call in CALLS:
        args = call["arguments"] if isinstance(call["arguments"], dict) else json.loads(call["arguments"])
        getattr(bank, call.get("tool") or call["name"])(**args)
    return state_hash({"Bank": namespace_state(bank)})


def test_imported_class_replays_to_the_in_process_state_hash(bank_files: Path, tmp_path: Path) -> None:
    from arenaforge.flows.cli import app

    db = tmp_path / "wh.duckdb"
    result = CliRunner().invoke(app, [
        "--db", str(db), "envs", "import", "python", f"{bank_files / 'bank.py'}:Bank", "--state", str(bank_files / "state.json"),
        "--calls", str(bank_files / "calls.json"), "--init-args", '{"fee": 1.5}', "--suite", "my-bank", "--backend", "process"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["gold_state_sha256"] == in_process_hash(bank_files / "bank.py")
    env = Warehouse(db).get(Environment, shown["id"])
    assert env is not None and env.native is not None and env.native.suite == "my-bank"
    assert env.native.gold_state_sha256 == shown["gold_state_sha256"] and env.provenance.backend == "import"
    assert str((bank_files / "bank.py").resolve()) in env.native.source and "sha256" in env.native.source
    assert env.verification.passed and [t.name for t in env.tools] == ["balance", "transfer", "freeze"]


def test_schemas_derived_from_signatures_and_docstrings(bank_files: Path) -> None:
    docs = {d.name: d for d in derive_tool_docs(read_source(f"{bank_files / 'bank.py'}:Bank"))}
    transfer = docs["transfer"]
    assert transfer.description == "Move money between two accounts; the fee is taken from the source."
    assert transfer.parameters["required"] == ["source", "target", "amount"]
    assert transfer.parameters["properties"]["amount"] == {
        "type": "number", "description": "How much to move; must be positive and at most the source's balance."}
    assert transfer.parameters["properties"]["memo"] == {"type": "string", "description": "A note kept in the log."}
    assert docs["freeze"].parameters["properties"]["mode"] == {"enum": ["soft", "hard"]}
    assert "_internal" not in docs and docs["balance"].parameters["required"] == ["account"]


@pytest.mark.parametrize(("args", "message"), [
    (["nope.py"], "nope.py: no such file"),
    (["{dir}/bank.py:Missing"], "no class 'Missing'"),
    (["{dir}/bank.py:Bank", "--calls", "{dir}/bad_calls.json"], "1 of 1 gold calls failed in the sandbox: balance: error"),
])
def test_bad_input_is_one_line_and_nonzero(bank_files: Path, tmp_path: Path, args: list[str], message: str) -> None:
    (bank_files / "bad_calls.json").write_text(json.dumps([{"tool": "balance", "arguments": {"account": "ZZ"}}]))
    argv = ["--db", str(tmp_path / "wh.duckdb"), "envs", "import", "python", *[a.format(dir=bank_files) for a in args],
            "--state", str(bank_files / "state.json"), "--backend", "process"]
    res = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and message in lines[0], res.stderr


def test_state_hash_is_canonical() -> None:
    assert state_hash({"b": [1.0, {"x": 2}], "a": "é"}) == state_hash({"a": "é", "b": [1, {"x": 2.0}]})
    assert state_hash({"a": 1.5}) != state_hash({"a": 1})
