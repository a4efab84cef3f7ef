"""Prefect artifacts and concurrency limits every flow shares.

Owns: the per-run summary (a markdown table in the run's Artifacts tab), progress bars,
plot images (PNG via matplotlib, saved under `out_dir` and embedded as a data URI), and the
names of the global concurrency limits `arenaforge serve` creates (`model-endpoint`,
`sandbox`). Flow modules call these helpers; stage code in `tracks/` never does.

Outside a Prefect run (a unit test calling a function directly) every helper is a quiet
no-op that returns None, so nothing starts an ephemeral API server by accident. Plot files
are still written.
"""

from __future__ import annotations

import base64
import contextlib
import io
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

# Global concurrency limits (created by `arenaforge serve`, sizes from prefect.* config).
# Use them as task tags (`@task(tags=[MODEL_ENDPOINT])`: Prefect enforces the `tag:` limit per
# task run) or around a block with `with limit(SANDBOX): ...`.
MODEL_ENDPOINT = "model-endpoint"
SANDBOX = "sandbox"
CONCURRENCY_LIMITS = (MODEL_ENDPOINT, SANDBOX)

_KEY_BAD = re.compile(r"[^a-z0-9-]+")


def in_prefect_run() -> bool:
    """True inside a Prefect flow or task run (where artifacts have somewhere to go)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def artifact_key(*parts: Any) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free-form parts."""
    raw = "-".join(str(p) for p in parts if p is not None and str(p) != "")
    key = _KEY_BAD.sub("-", raw.lower()).strip("-")
    return re.sub("-{2,}", "-", key)[:100] or "arenaforge"


def _md_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:200]


def markdown_table(rows: Sequence[Mapping[str, Any]] | Mapping[str, Any], columns: Sequence[str] | None = None) -> str:
    """Rows (dicts) or one mapping (shown as name | value) as a markdown table."""
    if isinstance(rows, Mapping):
        rows = [{"name": k, "value": v} for k, v in rows.items()]
    if not rows:
        return "_(no rows)_"
    cols = list(columns) if columns else list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_md_cell(row.get(c)) for c in cols) + " |" for row in rows]
    return "\n".join(lines)


def summary_table(
    title: str,
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    key: str | None = None,
    description: str | None = None,
    note: str | None = None,
) -> UUID | None:
    """A markdown artifact: `## title`, a table of rows, and an optional note below it."""
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    body = f"## {title}\n\n{markdown_table(rows)}\n"
    if note:
        body += f"\n{note}\n"
    return create_markdown_artifact(markdown=body, key=artifact_key(key) if key else None, description=description,
                                    _sync=True)


def run_summary(
    flow: str,
    run_id: str,
    counts: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
    warehouse_path: str | None = None,
) -> UUID | None:
    """The standard end-of-run summary: what a run wrote, and how to browse it.

    Call once at the end of every flow with the warehouse run id and its counts dict
    (the one `warehouse.recorded_run` yields). Keyed `<flow>-summary`, so the Artifacts
    page keeps the latest per flow and each flow run shows its own.
    """
    rows: list[dict[str, Any]] = [{"what": name, "count": n} for name, n in sorted(counts.items())]
    details: dict[str, Any] = {"flow": flow, "warehouse run id": run_id}
    if warehouse_path:
        details["warehouse"] = warehouse_path
    details.update(extra or {})
    note = (
        markdown_table(details)
        + f"\n\nBrowse: `arenaforge db show runs --where \"id = '{run_id}'\"` or "
        f"`arenaforge db query \"SELECT * FROM <table> WHERE run_id = '{run_id}'\"`"
    )
    return summary_table(f"{flow}: rows written", rows, key=f"{flow}-summary", description=f"{flow} run {run_id}", note=note)


class Progress:
    """A progress-bar artifact; `advance()` as work completes (updates throttled to whole percents)."""

    def __init__(self, key: str, total: int, description: str | None = None) -> None:
        self.total = max(int(total), 1)
        self.done = 0
        self._shown = -1.0
        self._id: UUID | None = None
        self._bar = _terminal_bar(description or key, self.total)
        if in_prefect_run():
            from prefect.artifacts import create_progress_artifact

            self._id = create_progress_artifact(progress=0.0, key=artifact_key(key), description=description, _sync=True)
            self._shown = 0.0

    @property
    def percent(self) -> float:
        return min(100.0, 100.0 * self.done / self.total)

    def advance(self, n: int = 1) -> None:
        self.set(self.done + n)

    def set(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            progress_bar, task_id = self._bar
            progress_bar.update(task_id, completed=min(done, self.total))
            if done >= self.total:
                progress_bar.stop()
        pct = round(self.percent)
        if self._id is None or pct <= self._shown:
            return
        from prefect.artifacts import update_progress_artifact

        update_progress_artifact(artifact_id=self._id, progress=float(pct), _sync=True)
        self._shown = pct


def _terminal_bar(description: str, total: int) -> Any:
    """A rich progress bar on stderr when a person is watching (a TTY), else None."""
    import sys

    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress as RichProgress

    bar = RichProgress(console=Console(stderr=True), transient=False)
    bar.start()
    return bar, bar.add_task(description, total=total)


def progress(key: str, total: int, description: str | None = None) -> Progress:
    """Start a progress artifact for `total` units of work."""
    return Progress(key, total, description)


def figure_artifact(fig: Any, key: str, out_dir: str | Path, title: str | None = None) -> Path:
    """Save a matplotlib figure as `<out_dir>/<key>.png` and show it in the run's artifacts."""
    path = Path(out_dir) / f"{artifact_key(key)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    path.write_bytes(buf.getvalue())
    if in_prefect_run():
        from prefect.artifacts import create_markdown_artifact

        data = base64.b64encode(buf.getvalue()).decode()
        md = f"## {title or key}\n\n![{key}](data:image/png;base64,{data})\n\nSaved to `{path.resolve()}`\n"
        create_markdown_artifact(markdown=md, key=artifact_key(key), description=title, _sync=True)
    return path


def plot_artifact(
    series: Mapping[str, Sequence[float]],
    key: str,
    out_dir: str | Path,
    title: str = "",
    xlabel: str = "step",
    ylabel: str = "",
    x: Sequence[float] | None = None,
) -> Path:
    """Line plot of named series (e.g. {"reward": [...], "loss": [...]}) -> PNG file + artifact."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    try:
        for name, values in series.items():
            xs = list(x) if x is not None else list(range(len(values)))
            ax.plot(xs[: len(values)], list(values), label=name)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if len(series) > 1:
            ax.legend()
        ax.grid(alpha=0.3)
        return figure_artifact(fig, key, out_dir, title or key)
    finally:
        plt.close(fig)


@contextlib.contextmanager
def limit(name: str, occupy: int = 1, timeout_s: float | None = None) -> Iterator[None]:
    """Hold `occupy` slots of a global concurrency limit (`MODEL_ENDPOINT`, `SANDBOX`) for a block.

    Inside a Prefect run this blocks until slots are free; if the limit does not exist
    (no `arenaforge serve` yet) it does not block. Outside a run it does nothing.
    """
    if not in_prefect_run():
        yield
        return
    from prefect.concurrency.sync import concurrency

    with concurrency(name, occupy=occupy, timeout_seconds=timeout_s, strict=False):
        yield


def step_curves(
    steps: Sequence[Any],
    key: str,
    out_dir: str | Path,
    metrics: Sequence[str] = ("loss", "reward", "f1"),
    title: str = "",
) -> Path | None:
    """Plot per-step metrics of training-step records (anything with `.step` and `.metrics`).

    One line per metric in `metrics` that every step reports; None when there is nothing to plot.
    """
    ordered = sorted(steps, key=lambda s: s.step)
    series = {m: [float(s.metrics[m]) for s in ordered if m in s.metrics] for m in metrics}
    series = {m: v for m, v in series.items() if v and len(v) == len(ordered)}  # metrics every step reports
    if not series:
        return None
    xs = [s.step for s in ordered]
    return plot_artifact(series, key=key, out_dir=out_dir, title=title or key, xlabel="step", x=xs)
