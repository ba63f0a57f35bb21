"""A full disk while writing stops the run with one line, and the last good checkpoint stays.

``RLIMIT_FSIZE`` (the most bytes a process may write to one file) stands in for a full disk:
with ``SIGXFSZ`` ignored, a write past it fails with ``EFBIG``, as one fails with ``ENOSPC``
on a full disk; it binds root too, unlike a read-only folder.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from daskrl.runtime.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parent.parent
TINY = ["--num-actors", "1", "--num-envs", "4", "--num-steps", "32", "--no-progress",
        "--no-eval", "--update-epochs", "1", "--scheduler", "sync", "--checkpoint-every", "2"]
PER_ITERATION = 4 * 32

pytestmark = pytest.mark.timeout(180)


def _train(cwd: Path, iterations: int, extra: list[str], fsize: int | None = None
           ) -> subprocess.CompletedProcess:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "daskrl.cli", "train", str(REPO / "graphs" / "ppo.py"), "--out",
         "run", "--steps", str(iterations * PER_ITERATION), *TINY, *extra],
        cwd=cwd, capture_output=True, text=True, timeout=150,
        preexec_fn=limit if fsize is not None else None)


def test_a_full_disk_during_a_checkpoint_stops_in_one_line_and_keeps_the_last(tmp_path):
    first = _train(tmp_path, 4, [])
    assert first.returncode == 0, first.stderr
    ckpts = tmp_path / "run" / "checkpoints"
    kept = list_checkpoints(ckpts)[-1]
    assert kept.name == "ckpt-00000004.pt"
    before = kept.read_bytes()
    rows = (tmp_path / "run" / "metrics.csv").stat().st_size
    # room for metrics.csv to grow, not for one more checkpoint
    limit = len(before) // 2
    assert rows * 3 < limit, (rows, limit)
    second = _train(tmp_path, 8, ["--resume"], fsize=limit)
    assert second.returncode == 2, second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("daskrl: error:")]
    assert len(errors) == 1, second.stderr
    assert f"cannot write a checkpoint in {Path('run') / 'checkpoints'} (File too large)" in (
        errors[0]), errors[0]
    assert f"the last good checkpoint is {Path('run') / 'checkpoints' / kept.name}" in errors[0]
    assert "Traceback" not in second.stderr, second.stderr
    # the one written before is intact and still loads; no torn or temp file beside it
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    assert kept.read_bytes() == before
    assert torch.load(kept, weights_only=True)["iteration"] == 4
