"""Learning-curve pictures from a run folder's ``metrics.csv``."""

from __future__ import annotations

import csv
import math
from pathlib import Path

PANELS = {
    "returns.png": ("episode return", lambda c: c == "episode_return_mean"
                    or c.startswith("return_mean/")),
    "speed.png": ("env steps per second", lambda c: c in ("env_steps_per_s",
                                                           "agent_steps_per_s")),
    "losses.png": ("loss", lambda c: c.startswith("losses/")),
}


def read_metrics(run_dir: Path) -> dict[str, list[float]]:
    """Numeric columns of ``run_dir/metrics.csv`` (blank cells read as NaN)."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass the --out folder of a training run")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path} has no rows yet")
    columns: dict[str, list[float]] = {}
    for name in rows[0]:
        try:
            columns[name] = [float(r[name]) if r[name] != "" else math.nan for r in rows]
        except ValueError:
            continue  # text columns (worker names)
    return columns


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write ``returns.png``, ``speed.png`` and ``losses.png`` against env steps.

    Examples
    --------
    >>> plot_run(Path("runs/ppo-20260101-000000"))  # doctest: +SKIP
    [PosixPath('runs/ppo-20260101-000000/returns.png'), ...]
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = read_metrics(run_dir)
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    x = data.get("env_steps") or data["iteration"]
    written = []
    for name, (ylabel, pick) in PANELS.items():
        cols = [c for c in data if pick(c)]
        if not cols:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
        for col in cols:
            ax.plot(x, data[col], label=col, linewidth=1.2)
        ax.set_xlabel("env steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(cols) > 1:
            ax.legend(fontsize=7)
        ax.set_title(f"{run_dir.name}: {ylabel}")
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
