"""Training metrics: ``metrics.jsonl`` (one JSON object per logged step), TensorBoard scalars and a
PNG plot.

Only rank 0 writes (the caller passes ``enabled=False`` elsewhere). JSONL is the source of truth
(the Prefect task reads it for progress; a resumed run appends and drops lines past the resumed step
so the file never holds two records for one step). The PNG (matplotlib, Agg backend) shows the loss
and each TTT step's accuracy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training.png"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (a torn last line from a kill is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("skipping a torn line in %s", path)
    return records


def describe_record(record: dict[str, Any]) -> str:
    """A metrics record for a progress bar: "loss 2.310 - acc [0.41, 0.28, 0.2] - accept~1.82"."""
    parts = [f"loss {record['loss']:.3f}"] if "loss" in record else []
    if record.get("acc"):
        parts.append(f"acc {[round(a, 2) for a in record['acc']]}")
    if "accept_length_sim" in record:
        parts.append(f"accept~{record['accept_length_sim']:.2f}")
    return " - ".join(parts)


class MetricsWriter:
    """Appends records to JSONL and TensorBoard; ``close`` draws the PNG."""

    def __init__(self, out_dir: Path, *, enabled: bool, resume_step: int = 0) -> None:
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / METRICS_FILE
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(
            log_dir=str(self.out_dir / "tensorboard"), purge_step=resume_step + 1
        )

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float):
                self._tb.add_scalar(f"train/{key}", value, step)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    self._tb.add_scalar(f"train/{key}_{i}", item, step)
        self._tb.flush()

    def close(self) -> Path | None:
        if not self.enabled:
            return None
        self._tb.close()
        return plot_metrics(read_metrics(self.path), self.out_dir / PLOT_FILE)


def plot_metrics(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Loss (weighted and per TTT step) and per-step accuracy against the training step, as a PNG
    (the Prefect UI shows it on the nightly run: ``tasks.pipeline.night_plots_task``); None when
    there is nothing to plot."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(steps, [r["loss"] for r in records], color="black", label="weighted")
    for k in range(len(records[-1].get("loss_k", []))):
        ax_loss.plot(steps, [r["loss_k"][k] for r in records], linewidth=0.8, label=f"step {k}")
    ax_loss.set(xlabel="step", ylabel="TTT loss", title="loss (weighted and per TTT step)")
    ax_loss.legend(fontsize="small")
    n_steps = len(records[-1].get("acc", []))
    for k in range(n_steps):
        ax_acc.plot(steps, [r["acc"][k] for r in records], label=f"step {k}")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="per-step accuracy", ylim=(0, 1))
    if n_steps:
        ax_acc.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
