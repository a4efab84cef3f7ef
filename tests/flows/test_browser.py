"""The Prefect UI in real headless Chromium: every deployment listed, a custom training run
started from the "Run > Custom run" form completes and its rows land in DuckDB, and a wrong
value in the form is refused before any run exists.

Set ARENAFORGE_UPDATE_SCREENSHOT=1 to refresh docs/ui-deployments.png (the README's screenshot).
"""

from __future__ import annotations

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
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _field(page: Any, label: str) -> Any:
    """The input of the schema-form field whose label is `label` (innermost match)."""
    prop = page.locator(".schema-form-property").filter(
        has=page.locator(".schema-form-property__label").get_by_text(label, exact=True)
    )
    return prop.last.locator("input, textarea").first


def _wait_for_runs(served: Any, tag: str, n: int, timeout_s: float = 30) -> list[Any]:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with served.client_settings(), get_client(sync_client=True) as client:
        while True:
            runs = [r for r in client.read_flow_runs() if (r.parameters.get("params") or {}).get("tag") == tag]
            if len(runs) >= n or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)  # polling the API with a deadline


def _open_custom_run(page: Any, ui: str, deployment: str) -> None:
    page.goto(f"{ui}/deployments")
    page.get_by_role("link", name=deployment, exact=True).first.click()
    page.wait_for_url(re.compile(r"/deployments/deployment/"))
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run").click()
    page.wait_for_url(re.compile(r"/run(\?|$)"))


def test_ui_lists_deployments_and_starts_a_custom_run(served: Any, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    ui = served.ui_url()
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.set_default_timeout(30_000)

    # every deployment is listed
    page.goto(f"{ui}/deployments")
    for name in served_flows():
        expect(page.get_by_role("link", name=name, exact=True).first).to_be_visible()

    # a custom run from the form: non-default parameters
    _open_custom_run(page, ui, "probe")
    _field(page, "Tag (Optional)").fill("ui-run")
    _field(page, "N (Optional)").fill("4")
    page.get_by_role("button", name="Submit").click()
    expect(page.get_by_text("scheduled to start").first).to_be_visible()
    (run,) = _wait_for_runs(served, "ui-run", 1)  # exactly one run for one Submit
    page.goto(f"{ui}/runs/flow-run/{run.id}")  # watch it in the UI
    expect(page.get_by_text("Completed").first).to_be_visible(timeout=150_000)
    (run,) = _wait_for_runs(served, "ui-run", 1)
    assert run.state.is_completed() and run.parameters["params"]["n"] == 4
    _, rows = served.warehouse.query(
        "SELECT record->>'subject' FROM rejections WHERE record->>'subject' LIKE 'ui-run-%' ORDER BY 1"
    )
    assert [r[0] for r in rows] == [f"ui-run-{i}" for i in range(4)]

    # the README screenshot: the deployments page with the run's activity
    page.goto(f"{ui}/deployments")
    expect(page.get_by_role("link", name="probe", exact=True).first).to_be_visible()
    shot = tmp_path / "ui-deployments.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("ARENAFORGE_UPDATE_SCREENSHOT"):
        shutil.copy(shot, REPO / "docs" / "ui-deployments.png")


def test_ui_refuses_a_wrong_parameter_before_any_run(served: Any, browser: Any) -> None:
    from playwright.sync_api import expect

    ui = served.ui_url()
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.set_default_timeout(30_000)
    _open_custom_run(page, ui, "probe")
    _field(page, "Tag (Optional)").fill("ui-bad")
    _field(page, "N (Optional)").fill("0")
    page.get_by_role("button", name="Submit").click()
    expect(page.get_by_text("Validation failed for field 'params.n'").first).to_be_visible()
    assert re.search(r"/run(\?|$)", page.url), "the form must stay open"
    from prefect.client.orchestration import get_client

    with served.client_settings(), get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    assert not [r for r in runs if (r.parameters.get("params") or {}).get("tag") == "ui-bad"]
