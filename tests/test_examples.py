"""The examples run as the docs say: the custom graph script trains through the CLI, the
Python example trains on its own ``LocalCluster`` (a short budget) and prints its summary,
and the batch-job example writes a CPU and a GPU job script for Slurm and for PBS."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_custom_graph_script_trains(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "daskrl", "train", str(ROOT / "examples" / "custom_fragment.py"),
         "--scheduler", "sync", "--steps", "2048", "--num-envs", "4", "--no-progress",
         "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] >= 2048
    assert summary["graph"].endswith("custom_fragment.py"), summary["graph"]


def test_the_python_example_trains_on_its_own_local_cluster(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "local_run.py"), "--steps", "2048",
         "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("dashboard: http://"), proc.stdout
    printed = ast.literal_eval(lines[-1])  # the summary's numbers, as the example prints them
    summary = json.loads((out / "summary.json").read_text())
    assert printed == {k: summary[k] for k in ("env_steps", "env_steps_per_s",
                                               "eval_return_mean")}
    assert summary["env_steps"] >= 2048 and summary["distribution"] == "actors-learner"
    # its own cluster's workers did the work (unnamed: their addresses), not an embedded
    # cluster's (named w0, w1, ...)
    workers = {w for ws in summary["placement"].values() for w in ws}
    assert workers and all(w.startswith("tcp://127.0.0.1:") for w in workers), workers


@pytest.mark.parametrize("kind, gpu_line", [("slurm", "#SBATCH --gres=gpu:1"),
                                            ("pbs", "ngpus=1")])
def test_the_batch_example_writes_a_cpu_and_a_gpu_job(tmp_path, kind, gpu_line):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "batch_run.py"), "--kind", kind,
         "--print-scripts"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "--- cpu job ---" in text and "--- gpu job ---" in text, text
    gpu = text[text.index("--- gpu job ---"):]
    assert gpu_line in gpu and "distributed.cli.dask_worker" in gpu, gpu
    cpu = text[text.index("--- cpu job ---"):text.index("--- gpu job ---")]
    assert gpu_line not in cpu, cpu
