"""Training curves as one figure: warm-start SFT loss, then GRPO reward/F1, zero-variance share and loss.

Skipped GRPO steps (no group had reward variance, so no update) are drawn as red crosses on the
x axis and counted in the legend, not as flat zeros. The PNG's file name carries the run id, so a
resumed or repeated run never overwrites an earlier run's picture.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.kinds_training import TrainStep
from arenaforge.warehouse import Warehouse


def curves_figure(warmstart: Sequence[TrainStep], grpo: Sequence[TrainStep], title: str = "") -> Any:
    """A matplotlib figure: left the warm-start loss (if any), right the GRPO per-step curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (1 if warmstart else 0) + (1 if grpo else 0)
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(6 * max(panels, 1), 4), squeeze=False)
    column = 0
    if warmstart:
        ax = axes[0][column]
        ordered = sorted(warmstart, key=lambda s: s.step)
        ax.plot([s.step for s in ordered], [s.metrics.get("loss", 0.0) for s in ordered], label="SFT loss")
        ax.set_yscale("log")
        ax.set_title("warm start (SFT on train split)")
        ax.set_xlabel("step")
        ax.legend()
        column += 1
    if grpo:
        ax = axes[0][column]
        ordered = sorted(grpo, key=lambda s: s.step)
        steps = [s.step for s in ordered]
        for metric, label in (("reward", "rollout F1 (reward)"), ("zero_variance_share", "zero-variance share"),
                              ("batch_reward", "batch F1 (groups used)")):
            ax.plot(steps, [s.metrics.get(metric, 0.0) for s in ordered], marker=".", label=label)
        skipped = [s.step for s in ordered if s.metrics.get("skipped")]
        if skipped:
            ax.scatter(skipped, [0.0] * len(skipped), marker="x", color="red", zorder=5,
                       label=f"skipped step ({len(skipped)}): no group with reward variance")
        loss_ax = ax.twinx()
        used = [s for s in ordered if not s.metrics.get("skipped")]
        loss_ax.plot([s.step for s in used], [s.metrics.get("loss", 0.0) for s in used], color="grey",
                     linestyle="--", label="GRPO loss")
        loss_ax.set_ylabel("loss")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title("GRPO (train split)")
        ax.set_xlabel("step")
        lines, labels = ax.get_legend_handles_labels()
        more, more_labels = loss_ax.get_legend_handles_labels()
        ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_curves(fig: Any, out_dir: str | Path, experiment: str, run_id: str) -> Path:
    """`<out_dir>/<experiment>-curves-<run id>.png`: one file per run, never overwritten by a resume."""
    import matplotlib.pyplot as plt

    path = Path(out_dir) / f"{experiment}-curves-{run_id}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_run_curves(wh: Warehouse, out_dir: str | Path, flow: str, experiment: str, run_id: str,
                     warm_run_id: str | None = None) -> Path | None:
    """The curves of run `run_id` (after its warm start's, when it had one), saved by the job that trained them;
    None when neither run recorded a step."""
    steps = wh.load(TrainStep, where="run_id = ?", params=[run_id])
    warm = wh.load(TrainStep, where="run_id = ?", params=[warm_run_id]) if warm_run_id else []
    if not steps and not warm:
        return None
    fig = curves_figure([*warm, *(s for s in steps if s.algorithm == "sft")],
                        [s for s in steps if s.algorithm == "grpo"], title=f"{flow} {experiment}")
    return save_curves(fig, out_dir, f"{flow}-{experiment}", run_id)
