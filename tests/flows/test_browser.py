"""The Prefect UI in real headless Chromium: every deployment listed, a `train-sft` run started
from the "Run > Custom run" form with custom parameters completes and its training steps land
in DuckDB, and a wrong value in the form is refused before any run exists.

Set ARENAFORGE_UPDATE_SCREENSHOT=1 to refresh docs/ui-deployments.png (the README's screenshot).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.requirements import REPO, require_chromium, skip_or_fail
from tests.support.served import served_flows

pytestmark = [pytest.mark.browser, pytest.mark.prefect_server]

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Any:
    executable = require_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright Python package is not installed (pip install playwright)")
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)  # a loaded 2-core CI box renders the UI slowly; waits end on the condition
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _field(page: Any, label: str, union: str | None = None) -> Any:
    """The input of the schema-form field labelled `label` (innermost match); for an optional
    field shown as a str/None switch, pick `union` first."""
    prop = page.locator(".schema-form-property").filter(
        has=page.locator(".schema-form-property__label").get_by_text(label, exact=True)
    ).last
    if union:
        prop.get_by_role("button", name=union, exact=True).click()
    return prop.locator("input, textarea").first


def _labels(run: Any) -> set[str]:
    params = run.parameters.get("params") or {}
    return {str(params.get("tag")), str(params.get("experiment"))}


def _runs_of(client: Any, deployment: str, tag: str) -> list[Any]:
    """Every run of `deployment` labelled `tag`, page by page: a read returns 200 runs at most, in random-id
    order, and every flow test of this worker reports to the same server."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    runs: list[Any] = []
    while page := client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
                                        limit=200, offset=len(runs)):
        runs += page
    return [r for r in runs if tag in _labels(r)]


def _wait_for_runs(served: Any, tag: str, n: int, timeout_s: float = 30, deployment: str = "train-sft") -> list[Any]:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with served.client_settings(), get_client(sync_client=True) as client:
        while True:
            runs = _runs_of(client, deployment, tag)
            if len(runs) >= n or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)  # polling the API with a deadline


def _wait_final(served: Any, flow_run_id: Any, timeout_s: float = 120) -> Any:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with served.client_settings(), get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if (run.state and run.state.is_final()) or time.monotonic() > deadline:
                return run
            time.sleep(0.2)  # polling the API with a deadline


UI_ERROR = "Oops. Something went wrong"  # the UI's page when one of its API calls failed (seen at load ~12)


def _visit(page: Any, url: str, ready: Any, timeout_s: float = 240) -> None:
    """Open `url` until `ready` (a locator factory) is visible; the UI's error page means an API call of the
    page failed on a loaded machine, so load it again (the server's state is what the test waits on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.goto(url)
        target = ready(page)
        try:
            target.or_(page.get_by_text(UI_ERROR)).first.wait_for(state="visible",
                                                                  timeout=max(1.0, deadline - time.monotonic()) * 1000)
        except Exception:  # playwright's TimeoutError: fall through to the deadline check
            pass
        if target.first.is_visible():
            return
        assert time.monotonic() < deadline, f"{url} never showed what the test waits for: " + page.inner_text("body")[-600:]


def _open_custom_run(page: Any, served: Any, deployment: str) -> None:
    """The deployment's page (its link may be past the list's first page of 10), then Run > Custom run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with served.client_settings(), get_client(sync_client=True) as client:
        (found,) = client.read_deployments(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])))
    _visit(page, f"{served.ui_url()}/deployments/deployment/{found.id}",
           lambda p: p.get_by_role("button", name="Run", exact=True))
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run").click()
    page.wait_for_url(re.compile(r"/run(\?|$)"))
    _visit(page, page.url, lambda p: p.get_by_role("button", name="Submit"))


def _answers_submit(response: Any) -> bool:
    """The answer that decides a Submit: create_flow_run's, or a 5xx from the parameter check before it (after
    which the UI sends no create). Not the pages' polls, whose 5xx says nothing about the form."""
    if response.request.method != "POST":
        return False
    return response.url.endswith("/create_flow_run") or (response.url.endswith("/ui/schemas/validate")
                                                          and response.status >= 500)


def _submit(page: Any, timeout_s: float = 240) -> None:
    """Click Submit until the server takes the form: the UI leaves the form for the deployment's page once
    create_flow_run answers 2xx. A 5xx (CI saw one on a loaded machine: "Oops. Something went wrong." over a
    form still open, and no run) creates nothing, so a user clicks again, and so does this. Any other answer
    (a 422: the form is wrong) ends the loop with the page as it is."""
    deadline = time.monotonic() + timeout_s
    failed: list[str] = []
    while True:
        with page.expect_response(_answers_submit) as answer:
            page.get_by_role("button", name="Submit").click()
        if answer.value.status < 500:
            return
        failed.append(f"{answer.value.url} -> {answer.value.status}: {answer.value.text()[:200]}")
        assert time.monotonic() < deadline, f"the server kept failing the form: {failed}"


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: Any) -> Path:
    data = tmp_path_factory.mktemp("ui-sft") / "sft.jsonl"
    example = {"messages": [{"role": "user", "content": "weather in Oslo?"}, {"role": "assistant", "content": "sunny"}]}
    data.write_text(json.dumps(example) + "\n")
    return data


def _fill_train_sft(page: Any, data: Path, experiment: str, epochs: str) -> None:
    _field(page, "Data (Optional)", union="str").fill(str(data))
    _field(page, "Experiment (Optional)").fill(experiment)
    _field(page, "Out Dir (Optional)", union="str").fill(str(data.parent / "out"))
    _field(page, "Epochs (Optional)").fill(epochs)


def test_ui_lists_deployments_and_starts_a_custom_training_run(served: Any, browser: Any, sft_data: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect
    from prefect.client.orchestration import get_client

    from arenaforge.schemas.kinds_training import TrainStep

    ui = served.ui_url()
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.set_default_timeout(60_000)

    # every deployment is listed (the count; names on the first page of 10)
    _visit(page, f"{ui}/deployments", lambda p: p.get_by_text(f"{len(served_flows())} Deployments", exact=True))
    for name in sorted(served_flows())[:10]:
        expect(page.get_by_role("link", name=name, exact=True).first).to_be_visible()

    # train-sft from Run > Custom run, with non-default parameters
    _open_custom_run(page, served, "train-sft")
    _fill_train_sft(page, sft_data, "ui-sft", "2")
    _submit(page)
    runs = _wait_for_runs(served, "ui-sft", 1, timeout_s=120)
    assert len(runs) == 1, "one Submit, one run; the page says: " + page.inner_text("body")[-600:]
    (run,) = runs
    run = _wait_final(served, run.id, timeout_s=600)  # the server's state, not what the page shows meanwhile
    assert run.state.is_completed(), run.state
    assert len(_wait_for_runs(served, "ui-sft", 2, timeout_s=0)) == 1, "one Submit, one run"
    _visit(page, f"{ui}/runs/flow-run/{run.id}", lambda p: p.locator(".state-badge", has_text="Completed"))
    assert run.parameters["params"]["epochs"] == 2 and run.parameters["params"]["data"] == str(sft_data)

    # its rows are in DuckDB: two optimisation steps of experiment ui-sft, under a completed warehouse run
    steps = [s for s in served.warehouse.load(TrainStep) if s.experiment == "ui-sft"]
    assert sorted(s.step for s in steps) == [1, 2] and {s.algorithm for s in steps} == {"sft"}
    _, runs = served.warehouse.query("SELECT status FROM v_runs WHERE id = ?", [steps[0].run_id])
    assert runs == [("completed",)]
    # and its artifacts: the summary table and the loss curve
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with served.client_settings(), get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    by_key = {a.key: a.data for a in found}
    assert "| experiment | ui-sft |" in by_key["train-sft-summary"]  # stable keys: <flow>-summary, <flow>-curves
    assert "data:image/png;base64," in by_key["train-sft-curves"]

    # the README screenshot: the deployments page, with the run's activity
    _visit(page, f"{ui}/deployments", lambda p: p.get_by_text(f"{len(served_flows())} Deployments", exact=True))
    shot = tmp_path / "ui-deployments.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("ARENAFORGE_UPDATE_SCREENSHOT"):
        shutil.copy(shot, REPO / "docs" / "ui-deployments.png")


def test_ui_refuses_a_wrong_parameter_before_any_run(served: Any, browser: Any, sft_data: Path) -> None:
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.set_default_timeout(60_000)
    _open_custom_run(page, served, "train-sft")
    _fill_train_sft(page, sft_data, "ui-bad", "0")
    _submit(page)
    expect(page.get_by_text("Validation failed for field 'params.epochs'").first).to_be_visible()
    assert re.search(r"/run(\?|$)", page.url), "the form must stay open"
    assert _wait_for_runs(served, "ui-bad", 1, timeout_s=0) == []  # the message is the server's 422: no run exists
