"""``--distribution auto``: the probe picks the fastest distribution on two unlike workloads,
records why, keeps its choice on resume, and is refused under ``--deterministic``.

Real clusters (daskrl's own, one CPU per worker); the margins asserted are the workloads'
(2x and more), not the probe's noise.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client

import daskrl
from daskrl.runtime.auto import NOISE

REPO = Path(__file__).resolve().parent.parent
GRAPH = REPO / "graphs" / "ppo.py"

pytestmark = pytest.mark.timeout(300)


def _rates(summary: dict) -> dict[str, float]:
    return {c["distribution"]: c["env_steps_per_s"]
            for c in summary["distribution_probe"]["candidates"]
            if c["env_steps_per_s"] is not None}


def _check_record(summary: dict) -> dict[str, float]:
    """The summary names the winner, which is the fastest probed within the noise."""
    probe = summary["distribution_probe"]
    rates = _rates(summary)
    assert summary["distribution"] == probe["chosen"]
    assert rates[probe["chosen"]] >= (1 - NOISE) * max(rates.values())
    skipped = {c["distribution"]: c["skipped"] for c in probe["candidates"] if c["skipped"]}
    assert "needs the 'vtrace' capability" in skipped["impala"]
    return rates


def test_a_cheap_env_on_one_worker_skips_the_per_step_distributions(
        cluster_one_cpu: Client, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """CartPole costs microseconds a step: a task per env step (central-inference) or per
    gradient step (data-parallel) cannot win, and auto trains under a fused one."""
    run = daskrl.train(GRAPH, client=cluster_one_cpu, distribution="auto", steps=4 * 256,
                       out=tmp_path / "run", num_envs=4, num_steps=64, progress=False,
                       evaluate=False)
    summary = run.summary
    rates = _check_record(summary)
    assert summary["distribution"] in ("actors-learner", "single"), summary
    for slow in ("central-inference", "data-parallel"):  # skipped by its floor, or slower
        assert slow not in rates or rates[slow] < 0.5 * rates[summary["distribution"]], rates
    assert summary["env_steps"] >= 4 * 256
    assert "auto chose" in capsys.readouterr().err

    again = daskrl.train(GRAPH, client=cluster_one_cpu, distribution="auto", steps=8 * 256,
                         out=tmp_path / "run", resume=True, num_envs=4, num_steps=64,
                         progress=False, evaluate=False)
    err = capsys.readouterr().err
    assert f"resuming under {summary['distribution']}" in err and "probing" not in err
    assert again.summary["distribution"] == summary["distribution"]
    assert again.summary["env_steps"] >= 8 * 256


def test_a_costly_env_on_two_workers_spreads_its_actors(cluster_pair: dict[int, Client],
                                                         tmp_path: Path) -> None:
    """Two actors whose env steps cost 2 ms of CPU each: ``single`` steps both on one
    worker, half as fast as a distribution that gives each actor a worker of its own."""
    run = daskrl.train(GRAPH, client=cluster_pair[2], distribution="auto", steps=4 * 128,
                       out=tmp_path / "run", num_actors=2, num_envs=2, num_steps=32,
                       env_step_cost=0.002, progress=False, evaluate=False)
    summary = run.summary
    rates = _check_record(summary)
    assert summary["distribution"] in ("actors-learner", "data-parallel"), rates
    assert rates["single"] < 0.8 * rates[summary["distribution"]], rates


def test_auto_under_deterministic_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "daskrl", "train", str(GRAPH),
                           "--distribution", "auto", "--deterministic", "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--deterministic" in lines[0] and "auto" in lines[0], lines
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r'deterministic=True name the distribution '
                                         r'\(e.g. distribution="actors-learner"\)'):
        daskrl.train(GRAPH, distribution="auto", deterministic=True, out=tmp_path / "api")


def test_stop_after_s_ends_a_run_early_as_a_shorter_one(cluster_tiny_ppo, tmp_path: Path
                                                        ) -> None:
    """The probes' bound: once the time is up nothing more is submitted, and the run ends as
    a complete shorter one (its summary counts the iterations it recorded)."""
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train
    from daskrl.runtime.sync_backend import SyncBackend

    algo = cluster_tiny_ppo()
    settings = RunSettings(tmp_path / "run", steps=50 * algo.steps_per_iteration, eval=False,
                           progress=False, tensorboard=False, task_s=0, lookahead=2,
                           stop_after_s=0.0)
    summary = train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert 2 <= summary["iterations"] <= 3, summary["iterations"]  # the first, and in flight
    assert len(rows) == summary["iterations"]
    # the steps of the iterations recorded: each at least its slots (a rollout that met an
    # auto-reset step steps all its envs again, so it may take up to num_envs - 1 more)
    assert summary["env_steps"] == int(rows[-1]["env_steps"])
    assert summary["env_steps"] == sum(int(r["iteration_env_steps"]) for r in rows)
    slots = summary["iterations"] * algo.steps_per_iteration
    assert slots <= summary["env_steps"] < slots + summary["iterations"] * 2 * 4  # 2 x 4 envs
