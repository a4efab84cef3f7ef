"""`arenaforge serve` against Postgres by URL: a real PostgreSQL server on loopback holds Prefect's state."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from arenaforge.schemas.config import Config, PrefectConfig, WarehouseConfig
from tests.support.postgres import PostgresCluster, postgres_cluster
from tests.support.prefect_server import free_port


@pytest.fixture
def postgres_url() -> Iterator[tuple[str, PostgresCluster]]:
    """A throwaway PostgreSQL cluster with an empty database `prefect`: Prefect's URL for it, and the cluster."""
    with postgres_cluster("prefect") as pg:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{pg.port}/prefect", pg


@pytest.mark.prefect_server
@pytest.mark.slow
def test_serve_keeps_prefect_state_in_postgres(postgres_url, tmp_path):
    from arenaforge.flows.serve import Stack

    url, pg = postgres_url
    cfg = Config(
        warehouse=WarehouseConfig(path=str(tmp_path / "w.duckdb")),
        prefect=PrefectConfig(database_url=url, port=free_port()),
    )
    flows = {"envs": "arenaforge.flows.envs_flows:envs", "train-sft": "arenaforge.flows.train_flows:train_sft"}
    before = os.environ.get("PREFECT_API_URL")
    with Stack(cfg, flows=flows, home=tmp_path / "prefect-home", worker=False, server_timeout_s=300) as stack:
        assert set(stack.deployments) == set(flows)
        psql = pg.run("psql", "-d", "prefect", "-tA",
                            "-c", "SELECT name FROM deployment ORDER BY name")
    # the stopped stack's server is gone: later clients in this process must not be sent to it
    assert os.environ.get("PREFECT_API_URL") == before
    assert psql.returncode == 0, psql.stderr
    assert psql.stdout.split() == sorted(flows), "the deployments must live in Postgres, not SQLite"
    assert not list((tmp_path / "prefect-home").glob("*.db")), "no SQLite database when a Postgres URL is set"
