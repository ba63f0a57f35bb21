"""Clusters a Dask user already has: a ``LocalCluster`` made in the test (worker names
``0, 1``, processes or threads, with or without declared resources), ``dask worker
--nworkers N`` (workers named by their addresses), reached through ``--scheduler ADDRESS``
or a ``Client``. Each one trains PPO for real (a few iterations, evaluation included)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from daskrl.cluster.local import configure_dask, worker_resources
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent
GRAPH = str(REPO / "graphs" / "ppo.py")
STEPS = 512  # two iterations of the tiny PPO (2 actors x 4 envs x 32 steps)

pytestmark = pytest.mark.timeout(240)


def _settings(out: Path) -> RunSettings:
    return RunSettings(out=out, steps=STEPS, tensorboard=False, progress=False)


def _trained(summary: dict, workers: set) -> None:
    """Both iterations ran, every rollout replica and the learner on the cluster's workers,
    and the final evaluation came back."""
    assert summary["env_steps"] >= STEPS and summary["iterations"] == 2
    placed = {w for names in summary["placement"].values() for w in names}
    assert placed <= workers, (placed, workers)
    assert summary["eval_return_mean"] > 0


@pytest.fixture
def user_cluster(request: pytest.FixtureRequest) -> Iterator[Client]:
    """A LocalCluster as a Dask user makes one (``request.param``: its keyword arguments)."""
    configure_dask()  # what the CLI and daskrl.train set in the driver's process
    where = {"host": "127.0.0.1"} if request.param["processes"] else {}  # threads: inproc://
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                           **where, **request.param)
    client = Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.mark.parametrize("user_cluster", [{"processes": True}], indirect=True,
                         ids=["processes"])
def test_a_users_local_cluster_trains_ppo_through_scheduler_address(user_cluster, tmp_path):
    """Integer worker names declaring no resources, reached through ``--scheduler ADDRESS``
    from another process."""
    names = {w["name"] for w in user_cluster.scheduler_info(n_workers=-1)["workers"].values()}
    assert names == {0, 1}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "daskrl.cli", "train", GRAPH, "--scheduler",
           user_cluster.scheduler.address, "--steps", str(STEPS), "--num-actors", "2",
           "--num-envs", "4", "--num-steps", "32", "--eval-episodes", "2", "--out", str(out),
           "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    _trained(json.loads((out / "summary.json").read_text()), set(worker_resources(user_cluster)))


@pytest.mark.parametrize("user_cluster", [{"processes": False}], indirect=True,
                         ids=["threads"])
def test_a_users_local_cluster_trains_ppo_through_a_client(user_cluster, tmp_path,
                                                           cluster_tiny_ppo):
    """Thread workers in this process, declaring no resources."""
    assert all(not r for r in worker_resources(user_cluster).values())
    summary = train(user_cluster, cluster_tiny_ppo(), get_distribution("actors-learner"),
                    _settings(tmp_path / "run"))
    _trained(summary, set(worker_resources(user_cluster)))


@pytest.fixture
def nworkers_client(tmp_path: Path) -> Iterator[Client]:
    """A scheduler, and ``dask worker ADDRESS --nworkers 2`` (no --name: named by address)."""
    configure_dask()
    cluster = LocalCluster(n_workers=0, dashboard_address=None, host="127.0.0.1")
    log = (tmp_path / "workers.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                             cluster.scheduler_address, "--nworkers", "2", "--nthreads", "1",
                             "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT)
    client = Client(cluster)
    try:
        client.wait_for_workers(2, timeout=90)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        cluster.close()
        log.close()


def test_dask_worker_nworkers_trains_ppo_through_a_client(nworkers_client, tmp_path,
                                                          cluster_tiny_ppo):
    info = nworkers_client.scheduler_info(n_workers=-1)["workers"]
    assert {w["name"] for w in info.values()} == set(info)  # named by their addresses
    summary = train(nworkers_client, cluster_tiny_ppo(), get_distribution("actors-learner"),
                    _settings(tmp_path / "run"))
    _trained(summary, set(info))
