"""arenaforge/flows/artifacts.py: helpers are no-ops outside a run and create real artifacts inside one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from arenaforge.flows import artifacts
from arenaforge.flows.artifacts import (
    SANDBOX,
    artifact_key,
    limit,
    markdown_table,
    plot_artifact,
    progress,
    run_summary,
    step_curves,
)


def test_keys_and_tables() -> None:
    assert artifact_key("Train GRPO", "run_AB.1") == "train-grpo-run-ab-1"
    assert artifact_key("", None) == "arenaforge"
    table = markdown_table([{"a": 1, "b": "x|y"}, {"a": 2}])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| 2 |  |"]
    assert markdown_table({"rows": 3}).splitlines()[2] == "| rows | 3 |"
    assert markdown_table([]) == "_(no rows)_"


def test_outside_a_run_nothing_is_sent_but_plots_are_written(tmp_path: Path) -> None:
    assert run_summary("sft", "run-1", {"tasks": 3}) is None
    bar = progress("p", total=4)
    bar.advance(2)
    assert bar.percent == 50.0
    with limit(SANDBOX):  # does not block or need a server
        pass
    png = plot_artifact({"loss": [3.0, 2.0, 1.5]}, key="Loss Curve", out_dir=tmp_path)
    assert png == tmp_path / "loss-curve.png" and png.read_bytes()[:4] == b"\x89PNG"
    steps = [SimpleNamespace(step=2, metrics={"loss": 1.0}), SimpleNamespace(step=1, metrics={"loss": 2.0, "reward": 0.5})]
    assert step_curves(steps, "curves", tmp_path) == tmp_path / "curves.png"
    assert step_curves([SimpleNamespace(step=1, metrics={})], "none", tmp_path) is None


@pytest.mark.prefect_server
def test_inside_a_flow_run_artifacts_are_created(prefect_server: Any, tmp_path: Path) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="artifact-probe")
    def probe() -> str:
        run_summary("artifact-probe", "run-xyz", {"environments": 4, "rejections": 1}, extra={"seed": 7})
        bar = progress("artifact-probe-progress", total=10)
        for _ in range(10):
            bar.advance()
        with limit(SANDBOX, timeout_s=30):
            plot_artifact({"reward": [0.1, 0.4, 0.7]}, key="artifact-probe-reward", out_dir=tmp_path)
        from prefect.context import FlowRunContext

        return str(FlowRunContext.get().flow_run.id)

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # prefect may have been imported before the server fixture exported PREFECT_API_URL: be explicit
    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        flow_run_id = probe()
        with get_client(sync_client=True) as client:
            assert str(client.api_url).startswith(prefect_server.api_url)
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            )
    by_key = {a.key: a for a in found}
    summary = by_key["artifact-probe-summary"]
    assert summary.type == "markdown" and "| environments | 4 |" in summary.data and "run-xyz" in summary.data
    assert "arenaforge db show runs" in summary.data and "| seed | 7 |" in summary.data
    assert by_key["artifact-probe-progress"].type == "progress" and by_key["artifact-probe-progress"].data == 100.0
    plot = by_key["artifact-probe-reward"]
    assert "data:image/png;base64," in plot.data and (tmp_path / "artifact-probe-reward.png").exists()
    assert artifacts.in_prefect_run() is False
