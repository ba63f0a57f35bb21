"""A resume never loses a run: unreadable checkpoints are refused without touching the folder,
a damaged newest one falls back to the one before with a warning naming it, and rows the
resumed run redoes are kept in a backup, said so.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import CheckpointsUnreadable
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


def _run(algo, out: Path, iterations: int, **kwargs) -> dict:
    settings = RunSettings(out=out, steps=iterations * algo.steps_per_iteration, seed=3,
                           progress=False, eval=False, tensorboard=False, task_s=0,
                           checkpoint_every=2, keep_checkpoints=5, **kwargs)
    return train(SyncBackend(), algo, get_distribution("actors-learner"), settings)


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _iterations(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return [r["iteration"] for r in csv.DictReader(fh)]


def test_a_resume_that_can_load_no_checkpoint_refuses_and_changes_nothing(cluster_tiny_ppo,
                                                                          tmp_path, capsys):
    algo = cluster_tiny_ppo(num_actors=1)
    _run(algo, tmp_path, 4)
    ckpts = sorted((tmp_path / "checkpoints").glob("ckpt-*.pt"))
    assert [p.name for p in ckpts] == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    ckpts[0].write_bytes(b"")  # empty
    ckpts[1].write_bytes(ckpts[1].read_bytes()[:300])  # torn
    before = _snapshot(tmp_path)
    with pytest.raises(CheckpointsUnreadable) as info:
        _run(algo, tmp_path, 8, resume=True)
    message = str(info.value)
    assert "\n" not in message
    for path in ckpts:  # each file named, with why
        assert f"{path} (" in message
    assert "nothing was changed" in message
    assert _snapshot(tmp_path) == before  # byte-identical, not even touched


def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(cluster_tiny_ppo, tmp_path,
                                                               capsys):
    algo = cluster_tiny_ppo(num_actors=1)
    _run(algo, tmp_path, 4)
    (tmp_path / "checkpoints" / "ckpt-00000004.pt").write_bytes(b"garbage")
    rows = (tmp_path / "metrics.csv").read_bytes()
    capsys.readouterr()
    _run(algo, tmp_path, 5, resume=True)
    err = capsys.readouterr().err
    assert "skipped damaged checkpoint(s) (ckpt-00000004.pt:" in err
    assert "continuing from ckpt-00000002.pt" in err
    # iterations 3-4 are redone; the rows first written for them are kept, and said so
    assert "rows of iterations 3-4" in err and "metrics.csv.bak" in err
    assert (tmp_path / "metrics.csv.bak").read_bytes() == rows
    assert _iterations(tmp_path / "metrics.csv") == ["1", "2", "3", "4", "5"]


def test_the_command_line_refuses_unreadable_checkpoints_with_exit_2(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "ckpt-00000010.pt").write_bytes(b"not a checkpoint")
    (out / "metrics.csv").write_text("iteration,env_steps\n1,8\n")
    before = _snapshot(out)
    result = subprocess.run(
        [sys.executable, "-m", "daskrl.cli", "train", str(REPO / "graphs" / "ppo.py"),
         "--scheduler", "sync", "--out", str(out), "--resume", "--steps", "512",
         "--num-envs", "4", "--num-steps", "32", "--no-progress", "--no-eval"],
        cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("daskrl: error")]
    assert len(lines) == 1 and "ckpt-00000010.pt" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert _snapshot(out) == before
