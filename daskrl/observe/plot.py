"""Learning-curve pictures from a run folder's ``metrics.csv``."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any


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


FORMATS = ("png", "svg")
"""Every figure is written in each format: PNG to look at, SVG to zoom and publish."""


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean of the last ``window`` finite values at each point (NaN before any).

    Examples
    --------
    >>> smooth([1.0, 3.0, math.nan, 5.0], 2)
    [1.0, 2.0, 2.0, 4.0]
    """
    out, recent = [], []
    for v in values:
        if not math.isnan(v):
            recent = [*recent, v][-window:]
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


def iteration_speed(data: dict[str, list[float]]) -> list[float]:
    """Env steps per second of each iteration on its own (not the run's running mean):
    ``iteration_env_steps / iteration_s``, else differences of the cumulative columns.

    Examples
    --------
    >>> iteration_speed({"iteration_env_steps": [100.0, 100.0], "iteration_s": [1.0, 0.5]})
    [100.0, 200.0]
    >>> iteration_speed({"env_steps": [100.0, 300.0], "wall_s": [2.0, 3.0]})
    [50.0, 200.0]
    """
    steps, secs = data.get("iteration_env_steps"), data.get("iteration_s")
    if steps is None or secs is None:
        cum_steps, wall = data["env_steps"], data["wall_s"]
        steps = [b - a for a, b in zip([0.0, *cum_steps], cum_steps, strict=False)]
        secs = [b - a for a, b in zip([0.0, *wall], wall, strict=False)]
    return [n / t if t > 0 else math.nan for n, t in zip(steps, secs, strict=True)]


def plot_run(run_dir: Path, out_dir: Path | None = None, window: int = 10) -> list[Path]:
    """Write ``returns``, ``speed`` and ``losses`` figures (PNG and SVG) against env steps.

    ``returns``: each return column raw (thin) and smoothed over ``window`` iterations,
    with the periodic evaluations (``eval_return_mean`` ± ``eval_return_std``) as points;
    ``speed``: env steps per second of each iteration, raw and smoothed; ``losses``: one
    panel per ``losses/*`` column, each on its own scale.

    Examples
    --------
    >>> plot_run(Path("runs/ppo-20260101-000000"))  # doctest: +SKIP
    [PosixPath('runs/ppo-20260101-000000/returns.png'), ...]
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw = read_metrics(run_dir)
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # training rows have an iteration; periodic evaluations write rows of their own
    its = raw.get("iteration", [])
    keep = [i for i, v in enumerate(its) if not math.isnan(v)] or list(range(len(its)))
    data = {k: [v[i] for i in keep] for k, v in raw.items()}
    x = data.get("env_steps") or data["iteration"]
    xlabel = "env steps" if "env_steps" in data else "iteration"
    at = dict(zip(data.get("iteration", []), x, strict=False))
    evals = [(at.get(it, math.nan), mean, std) for it, mean, std in zip(
        raw.get("eval_iteration", raw.get("iteration", [])), raw.get("eval_return_mean", []),
        raw.get("eval_return_std", [0.0] * len(its)), strict=False) if not math.isnan(mean)]
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        for fmt in FORMATS:
            path = out_dir / f"{name}.{fmt}"
            with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text
                fig.savefig(path)
            written.append(path)
        plt.close(fig)

    def curve(ax: Any, values: list[float], label: str, color: str) -> None:
        ax.plot(x, values, color=color, alpha=0.3, linewidth=0.8)
        ax.plot(x, smooth(values, window), color=color, linewidth=1.6,
                label=f"{label} (mean of {window} iterations)")

    returns = [c for c in data if c == "episode_return_mean" or c.startswith("return_mean/")]
    if returns or evals:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        for i, col in enumerate(returns):
            curve(ax, data[col], col.replace("episode_return_mean", "training episodes"),
                  f"C{i}")
        if evals:
            ax.errorbar([e[0] for e in evals], [e[1] for e in evals],
                        yerr=[0.0 if math.isnan(e[2]) else e[2] for e in evals],
                        fmt="o", color="black", markersize=4, capsize=3,
                        label="evaluation (mean ± std)")
        ax.set(xlabel=xlabel, ylabel="return per episode (sum of rewards)",
               title=f"{run_dir.name}: episode return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "returns")
    if "iteration_s" in data or "wall_s" in data:
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
        speed = iteration_speed(data)
        curve(ax, [math.nan, *speed[1:]], "per iteration", "C2")  # the first: start-up
        ax.set(xlabel=xlabel, ylabel="env steps per second",
               title=f"{run_dir.name}: speed of each iteration (the first, start-up, "
                     "left out)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "speed")
    losses = sorted(c for c in data if c.startswith("losses/"))
    if losses:
        cols = min(3, len(losses))
        rows = -(-len(losses) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), dpi=110,
                                 squeeze=False)
        for ax, col in zip(axes.flat, losses, strict=False):
            curve(ax, data[col], "raw", "C3")
            ax.set_title(col.removeprefix("losses/").replace("_", " "), fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("value (own scale)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(losses):]:
            ax.set_visible(False)
        fig.suptitle(f"{run_dir.name}: losses, one panel each "
                     f"(thin: per iteration; thick: mean of {window})", fontsize=10)
        save(fig, "losses")
    return written
