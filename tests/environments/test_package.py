"""The environment package directory round-trips every field, for both tool-code shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arenaforge.environments.package import read_package, write_package
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from tests.environments.toolsets import message_api_env, retail_class_env, retail_functions_env


@pytest.mark.parametrize("make", [retail_functions_env, retail_class_env, message_api_env])
def test_round_trip(tmp_path: Path, make) -> None:
    env = make()
    write_package(env, tmp_path / "pkg")
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["env.json", "initial_state.json", "tools.json", "tools.py"]
    back = read_package(tmp_path / "pkg")
    assert back == env
    assert back.id == env.id
    assert (tmp_path / "pkg" / "tools.py").read_text() == env.code
    assert json.loads((tmp_path / "pkg" / "tools.json").read_text())[0]["name"] == env.tools[0].name


def test_no_initial_state_writes_no_state_file(tmp_path: Path) -> None:
    env = retail_functions_env().model_copy(update={"initial_state": None, "id": ""})
    env = Environment.model_validate(env.model_dump())
    write_package(retail_functions_env(), tmp_path)  # an old state file is removed on rewrite
    write_package(env, tmp_path)
    assert not (tmp_path / "initial_state.json").exists()
    assert read_package(tmp_path).initial_state is None


def test_not_a_package(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="env.json is missing"):
        read_package(tmp_path)


def test_hand_edited_code_is_caught_by_the_id(tmp_path: Path) -> None:
    write_package(retail_functions_env(), tmp_path)
    (tmp_path / "tools.py").write_text("def noop():\n    return 1\n")
    with pytest.raises(InputError, match="does not match its id"):
        read_package(tmp_path)
    meta = json.loads((tmp_path / "env.json").read_text())
    meta.pop("id")
    (tmp_path / "env.json").write_text(json.dumps(meta))
    assert read_package(tmp_path).code == "def noop():\n    return 1\n"
