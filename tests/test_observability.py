"""What users see: dashboard task prefixes by role, learning-curve pictures, reports, profile."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from distributed import Client

from daskrl.cluster.local import local_cluster
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.observe.profile import breakdown, report
from daskrl.runtime.driver import RunSettings, train

ROOT = Path(__file__).resolve().parents[1]


def test_dashboard_groups_tasks_by_role(tmp_path: Path) -> None:
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=2, num_steps=16))
    with local_cluster([{"CPU": 1}, {"CPU": 1}]) as cluster, Client(cluster) as client:
        train(client, algo, get_distribution("actors-learner"),
              RunSettings(out=tmp_path, steps=3 * algo.steps_per_iteration, progress=False))
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert {"rollout", "learner", "evaluate"} <= set(prefixes)


def test_plot_profile_report_and_tensorboard_from_a_short_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    html = tmp_path / "report.html"
    cmd = [sys.executable, "-m", "daskrl.cli", "train", str(ROOT / "graphs" / "ppo.py"),
           "--steps", "3000", "--num-envs", "4", "--num-steps", "64", "--workers", "1",
           "--out", str(out), "--no-progress", "--report", str(html)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    assert html.stat().st_size > 10_000 and b"bokeh" in html.read_bytes().lower()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    with open(out / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    returns = events.Scalars("charts/episode_return_mean")  # one event per row, all columns
    assert [e.step for e in returns] == [int(r["env_steps"]) for r in rows]
    assert "losses/policy_loss" in events.Tags()["scalars"]
    done = subprocess.run([sys.executable, "-m", "daskrl.cli", "plot", str(out)], check=True,
                          capture_output=True, text=True, timeout=120)
    for name in ("returns.png", "speed.png", "losses.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
        assert str(png) in done.stdout
    parts = breakdown(out)
    total = parts.pop("iteration")
    assert abs(sum(parts.values()) - total) <= 0.05 * total  # the parts add up
    assert "bottleneck:" in report(out)
