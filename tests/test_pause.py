"""``pause_at``: a run that pauses after an iteration and is resumed with the same steps
trains exactly as one that did not pause (the learning-rate schedule is laid out for all
its steps), which population-based training's rounds rely on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

pytestmark = pytest.mark.timeout(240)


def _settings(out: Path, steps: int, **kwargs) -> RunSettings:
    return RunSettings(out=out, steps=steps, seed=4, progress=False, eval=False,
                       tensorboard=False, deterministic=True, checkpoint_every=100, **kwargs)


def _rates(out: Path) -> list[str]:
    with (out / "metrics.csv").open(newline="") as f:
        return [r["charts/learning_rate"] for r in csv.DictReader(f) if r["iteration"]]


def test_a_paused_and_resumed_run_trains_as_one_that_did_not_pause(cluster_tiny_ppo,
                                                                   tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    dist, steps = get_distribution("actors-learner"), 6 * algo.steps_per_iteration
    whole = train(SyncBackend(), algo, dist, _settings(tmp_path / "whole", steps))
    paused = train(SyncBackend(), algo, dist, _settings(tmp_path / "paused", steps, pause_at=4))
    assert paused["iterations"] == 4
    assert (tmp_path / "paused" / "checkpoints" / "ckpt-00000004.pt").is_file()
    resumed = train(SyncBackend(), algo, dist,
                    _settings(tmp_path / "paused", steps, resume=True))
    assert resumed["iterations"] == 6 and resumed["env_steps"] == whole["env_steps"]
    assert _rates(tmp_path / "paused") == _rates(tmp_path / "whole")  # one annealed schedule
    assert resumed["weights_sha256"] == whole["weights_sha256"]


def test_pause_at_must_be_an_iteration(tmp_path):
    from daskrl.runtime.settings import check_settings

    with pytest.raises(ValueError, match="pause_at must be >= 1 iteration, got 0"):
        check_settings(RunSettings(tmp_path, pause_at=0))
