"""Advice while a run trains: an env-bound run says so once, with the setting to change, on
stderr and in ``summary.json``."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed import Client

import daskrl

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def test_an_env_bound_run_is_told_to_add_replicas_once(cluster_one_cpu: Client, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    # 64 env steps of 4 ms of CPU each an iteration, a tiny update: the envs take most of it
    run = daskrl.train(REPO / "graphs" / "ppo.py", client=cluster_one_cpu, steps=16 * 64,
                       out=tmp_path / "run", num_envs=2, num_steps=32, env_step_cost=0.004,
                       progress=False, evaluate=False)
    (given,) = run.summary["advice"]
    assert given["kind"] == "env" and given["share"] >= 0.6, given
    assert "--num-actors 2" in given["advice"], given
    first, last = given["iterations"]
    assert first >= 2 and last == first + 9, given  # a window of 10, after the start-up
    err = capsys.readouterr().err
    assert err.count(f"daskrl: iterations {first}-{last}: stepping envs took") == 1, err
