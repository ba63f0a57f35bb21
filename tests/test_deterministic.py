"""``--deterministic``: fused replicas as the control, and the same ``weights_sha256`` after a
resume (every distribution and algorithm over one and two workers: test_determinism_stress).

Runs on real LocalClusters of one and two worker processes; the resume check kills the
``daskrl train`` process with SIGKILL after a checkpoint and resumes it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client

from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent
GRAPH = REPO / "graphs" / "ppo.py"

pytestmark = pytest.mark.timeout(300)


def _run(client: Client, algo, spec: str, out: Path, deterministic: bool = True) -> dict:
    settings = RunSettings(out=out, steps=3 * algo.steps_per_iteration, seed=7, eval=False,
                           progress=False, tensorboard=False, deterministic=deterministic)
    return train(client, algo, get_distribution(spec), settings)


def test_without_it_fused_replicas_change_the_weights(cluster_pair, cluster_tiny_ppo, tmp_path):
    """The control: by default co-located replicas fuse, so one worker trains other weights."""
    algo = cluster_tiny_ppo()
    one = _run(cluster_pair[1], algo, "actors-learner", tmp_path / "one", deterministic=False)
    two = _run(cluster_pair[2], algo, "actors-learner", tmp_path / "two", deterministic=False)
    assert one["weights_sha256"] != two["weights_sha256"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_killed_and_resumed_run_ends_with_the_same_weights(tmp_path):
    args = [sys.executable, "-m", "daskrl.cli", "train", str(GRAPH), "--scheduler", "sync",
            "--deterministic", "--steps", str(16 * 2 * 4 * 64), "--num-actors", "2",
            "--num-envs", "4", "--num-steps", "64", "--checkpoint-every", "3", "--no-eval",
            "--no-progress"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # the uninterrupted run goes beside the one to be killed: under --deterministic the
    # weights do not depend on how the two share the cores
    full_log = tmp_path / "full.stderr"
    with full_log.open("w") as log:
        full = subprocess.Popen([*args, "--out", str(tmp_path / "full")], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log)
    proc = None
    try:
        killed = tmp_path / "killed"
        killed_log = tmp_path / "killed.stderr"
        with killed_log.open("w") as log:
            proc = subprocess.Popen([*args, "--out", str(killed)], env=env, cwd=tmp_path,
                                    stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 120
        # checkpoint 6 or later (3 are kept: checkpoint 6 is gone once 15 is written)
        while not [c for c in list_checkpoints(killed / "checkpoints")
                   if int(c.stem.split("-")[1]) >= 6]:
            assert proc.poll() is None, ("the run ended before it could be killed:\n"
                                         + killed_log.read_text()[-2000:])
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert not (killed / "summary.json").exists()
        done_before = len(_rows(killed / "metrics.csv"))

        resumed = subprocess.run([*args, "--out", str(killed), "--resume"], env=env,
                                 cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert resumed.returncode == 0, resumed.stderr
        assert full.wait(timeout=240) == 0, full_log.read_text()
    finally:
        for running in (full, proc):
            if running is not None:
                running.kill()  # nothing once it has exited
    a = json.loads((tmp_path / "full" / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["env_steps"] == b["env_steps"]
    rows = _rows(killed / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, 17))
    full_rows = _rows(tmp_path / "full" / "metrics.csv")
    assert [r["episode_return_mean"] for r in rows] == [r["episode_return_mean"]
                                                         for r in full_rows]
    assert done_before >= 6
