"""``daskrl plot``: returns raw and smoothed with evaluation points, per-iteration speed, one
panel per loss on its own scale; PNG and SVG with titles and axis labels."""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daskrl.observe.plot import iteration_speed, plot_run, read_metrics, smooth


def write_run(run: Path, n: int = 30) -> None:
    """A metrics.csv like a run's: the speed doubles halfway, evaluations every 10 rows, two
    losses three orders of magnitude apart."""
    run.mkdir()
    cols = ["iteration", "env_steps", "wall_s", "episode_return_mean", "iteration_env_steps",
            "iteration_s", "losses/policy_loss", "losses/value_loss", "eval_iteration",
            "eval_return_mean", "eval_return_std"]
    wall = 0.0
    with (run / "metrics.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        for i in range(n):
            secs = 1.0 if i < n // 2 else 0.5
            wall += secs
            ev = i % 10 == 9
            w.writerow({"iteration": i + 1, "env_steps": 1000 * (i + 1), "wall_s": wall,
                        "episode_return_mean": 10 + i, "iteration_env_steps": 1000,
                        "iteration_s": secs, "losses/policy_loss": 0.001 * math.sin(i),
                        "losses/value_loss": 50 + i})
            if ev:  # a periodic evaluation: a row of its own, as the run writes it
                w.writerow({"env_steps": 1000 * n, "eval_iteration": i + 1,
                            "eval_return_mean": 20 + i, "eval_return_std": 2.0})


def test_speed_is_per_iteration_not_the_running_mean(tmp_path):
    write_run(tmp_path / "run")
    data = read_metrics(tmp_path / "run")
    data = {k: [x for x, it in zip(v, data["iteration"], strict=True) if not math.isnan(it)]
            for k, v in data.items()}
    speed = iteration_speed(data)
    assert speed[:15] == [1000.0] * 15 and speed[15:] == [2000.0] * 15
    running = data["env_steps"][-1] / data["wall_s"][-1]  # what env_steps_per_s would show
    assert running < 1400 < speed[-1]
    assert smooth([1.0, 3.0, math.nan, 5.0], 2) == [1.0, 2.0, 2.0, 4.0]


def test_plot_writes_png_and_svg_with_a_panel_per_loss_and_eval_points(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    done = subprocess.run([sys.executable, "-m", "daskrl.cli", "plot", str(run)],
                          capture_output=True, text=True, timeout=120, check=True)
    for name in ("returns", "speed", "losses"):
        png, svg = run / f"{name}.png", run / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
        assert svg.read_text().lstrip().startswith("<?xml") and str(svg) in done.stdout
    losses = (run / "losses.svg").read_text()
    assert "policy loss" in losses and "value loss" in losses  # a titled panel each
    assert losses.count("value (own scale)") == 2  # own y axis per panel
    returns = (run / "returns.svg").read_text()
    assert "run: episode return" in returns and "evaluation (mean ± std)" in returns
    assert "return per episode (sum of rewards)" in returns and "env steps" in returns
    speed = (run / "speed.svg").read_text()
    assert "speed of each iteration" in speed and "env steps per second" in speed


def test_each_loss_panel_has_its_own_scale(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = tmp_path / "run"
    write_run(run)
    shown = []
    real_savefig = plt.Figure.savefig

    def spy(fig, path, *args, **kwargs):
        if Path(path).name == "losses.png":
            shown.extend(ax.get_ylim() for ax in fig.axes if ax.get_visible())
        return real_savefig(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", spy)
        plot_run(run)
    (lo1, hi1), (lo2, hi2) = shown
    assert hi1 - lo1 < 0.01 and hi2 - lo2 > 10  # policy loss ~1e-3, value loss ~50..80


def test_plot_of_a_missing_run_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "daskrl.cli", "plot", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert re.fullmatch(r"daskrl: error: .*metrics.csv not found.*\n", done.stderr)


def test_evaluations_are_drawn_at_the_iteration_they_evaluated(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.axes

    run = tmp_path / "run"
    write_run(run)
    drawn = []
    real = matplotlib.axes.Axes.errorbar

    def spy(ax, x, y, *args, **kwargs):
        drawn.append((list(x), list(y)))
        return real(ax, x, y, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "errorbar", spy)
        plot_run(run)
    assert drawn == [([10_000.0, 20_000.0, 30_000.0], [29.0, 39.0, 49.0])]
