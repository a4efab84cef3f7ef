"""Configuration precedence: defaults < arenaforge.toml < environment < flags."""

from __future__ import annotations

import pytest

from arenaforge.schemas.config import load_config
from arenaforge.schemas.errors import ConfigError


def test_defaults_when_nothing_is_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(environ={})
    assert cfg.warehouse.path == "./arenaforge.lake"
    assert cfg.model.backend == "offline"


def test_precedence_file_env_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arenaforge.toml").write_text(
        '[model]\nbackend = "openai"\nbase_url = "http://file/v1"\nmodel = "from-file"\ntemperature = 0.3\n'
        '[warehouse]\npath = "file.duckdb"\n'
    )
    env = {"ARENAFORGE_MODEL__MODEL": "from-env", "ARENAFORGE_MODEL__TEMPERATURE": "0.9", "ARENAFORGE_DB": "env.duckdb"}
    cfg = load_config(environ=env, overrides={"model.model": "from-flag"})
    assert cfg.model.base_url == "http://file/v1"  # file only
    assert cfg.model.temperature == 0.9  # env beats file
    assert cfg.warehouse.path == "env.duckdb"
    assert cfg.model.model == "from-flag"  # flag beats env


def test_openai_api_key_fallback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(environ={"OPENAI_API_KEY": "sk-x"}).model.api_key == "sk-x"
    assert load_config(environ={"OPENAI_API_KEY": "sk-x", "ARENAFORGE_MODEL__API_KEY": "own"}).model.api_key == "own"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[model\nbackend = 1", "malformed TOML"),
        ('[model]\nbackend = 7', "model.backend"),
        ("[model]\nunknown_key = 1", "model.unknown_key"),
        ("[sandbox]\npool_size = -1", "sandbox.pool_size"),
    ],
)
def test_malformed_config_is_one_clear_line(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arenaforge.toml").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(environ={})
    assert "\n" not in str(info.value)


def test_unknown_model_backend_is_one_clear_line_when_the_model_is_built():
    import asyncio

    from arenaforge.schemas.config import ModelConfig
    from arenaforge.services.models import open_chat_model

    async def build():
        async with open_chat_model(ModelConfig(backend="gpt")):
            pass

    with pytest.raises(ConfigError, match="unknown model backend 'gpt'; known: offline, openai") as info:
        asyncio.run(build())
    assert "\n" not in str(info.value)


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_every_config_field_is_described():
    """The descriptions are the documentation of arenaforge.toml and the help of the Prefect forms."""
    from arenaforge.schemas.config import Config

    missing = []

    def walk(model, prefix=""):
        for name, f in model.model_fields.items():
            if hasattr(f.annotation, "model_fields"):
                walk(f.annotation, f"{prefix}{name}.")
            elif not f.description:
                missing.append(prefix + name)

    walk(Config)
    assert missing == []
