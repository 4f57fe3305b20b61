"""The seed's training charts: loss and held-out α by depth over training, as PNG + JSON next to the weights."""
from __future__ import annotations

import json
from pathlib import Path

from .loop import History


def curves_record(history: History, title: str) -> dict:
    """What the PNG draws, as data (losses thinned to at most ~400 points)."""
    every = max(1, len(history.losses) // 400)
    return {"title": title, "loss_names": history.loss_names, "steps": history.steps, "seconds": history.seconds,
            "losses": [list(row) for row in history.losses[::every]],
            "evals": [{"step": step, "minutes": seconds / 60, "alpha": result.get("alpha", [])}
                      for (step, result), seconds in zip(history.evals, history.eval_seconds)]}


def save_curves(history: History, out: Path, title: str, stem: str = "training_curves") -> tuple[Path, Path]:
    """Writes <stem>.json and <stem>.png into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = curves_record(history, title)
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    json_path.write_text(json.dumps(record, indent=1) + "\n")
    _plot(record, png_path)
    return json_path, png_path


def _plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    rows = record["losses"]
    for i, name in enumerate(record["loss_names"]):
        left.plot([r[0] for r in rows], [r[i + 1] for r in rows], label=name, linewidth=1)
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.legend(fontsize=8)
    evals = record["evals"]
    depths = max((len(e["alpha"]) for e in evals), default=0)
    for d in range(depths):
        right.plot([e["step"] for e in evals], [e["alpha"][d] if d < len(e["alpha"]) else None for e in evals],
                   marker="o", label=f"depth {d + 1}")
    right.set_xlabel("step")
    right.set_ylabel("held-out α (greedy acceptance)")
    right.set_ylim(0, 1)
    if depths:
        right.legend(fontsize=8)
    fig.suptitle(record["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
