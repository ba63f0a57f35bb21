"""PPO learns CartPole-v1 through the command line, as a user runs it.

Slow (a couple of minutes on two cores) but part of the default run: ``python -m pytest -q``
runs it; ``-m "not slow"`` skips it while iterating.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEED = 1  # seeds 1, 2 and 3 all reach eval_return_mean >= 475 within 500k env steps
BUDGET = 500_000


def daskrl_command() -> list[str]:
    """The ``daskrl`` console script of this environment (else ``python -m daskrl.cli``)."""
    script = Path(sys.executable).with_name("daskrl")
    if script.exists():
        return [str(script)]
    found = shutil.which("daskrl")
    return [found] if found else [sys.executable, "-m", "daskrl.cli"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_ppo_solves_cartpole_within_500k_env_steps(tmp_path):
    out = tmp_path / "run"
    cmd = [*daskrl_command(), "train", str(REPO / "graphs" / "ppo.py"), "--env", "CartPole-v1",
           "--steps", str(BUDGET), "--seed", str(SEED), "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    reached = next((int(r["env_steps"]) for r in rows
                    if r["episode_return_mean"] and float(r["episode_return_mean"]) >= 475), None)
    print(f"seed {SEED}: eval_return_mean={summary['eval_return_mean']:.1f} "
          f"env_steps={summary['env_steps']} first training return >= 475 at {reached} steps, "
          f"wall_s={summary['wall_s']:.0f}")
    # at least the steps asked for, and at most one iteration (plus auto-reset make-up) more
    assert BUDGET <= summary["env_steps"] <= 1.01 * BUDGET
    assert summary["eval_return_mean"] >= 475, summary
    assert reached is not None  # training episodes got there too, not only the final policy
