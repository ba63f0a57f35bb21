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

import dask
import pytest
from distributed import Client, LocalCluster

from daskrl.cluster.local import worker_resources
from daskrl.core.scheduler_workers import scheduler_workers
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
    where = {"host": "127.0.0.1"} if request.param["processes"] else {}  # threads: inproc://
    # Dask's default start method, not the fork server the other tests' clusters use
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
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
    names = {w["name"] for w in scheduler_workers(user_cluster).values()}
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
    info = scheduler_workers(nworkers_client)
    assert {w["name"] for w in info.values()} == set(info)  # named by their addresses
    summary = train(nworkers_client, cluster_tiny_ppo(), get_distribution("actors-learner"),
                    _settings(tmp_path / "run"))
    _trained(summary, set(info))


# ------------------------------------------- a notebook's own thread counts survive its tasks


def _counts_reporter():
    """A task's function (by value) reporting torch's and the BLAS pools' thread counts as
    the task sees them."""

    def report() -> tuple[int, list[int]]:
        import torch
        from threadpoolctl import threadpool_info

        return torch.get_num_threads(), sorted({p["num_threads"] for p in threadpool_info()
                                                if p["user_api"] == "blas"})

    return report


def _blas_counts() -> list[int]:
    from threadpoolctl import threadpool_info

    return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})


@pytest.fixture
def callers_counts() -> Iterator[tuple[int, int]]:
    """The caller (a notebook) runs torch and numpy's BLAS with 2 threads each; its
    settings are put back after the test."""
    import numpy  # noqa: F401 - its BLAS pool is loaded
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    with threadpool_limits(limits=2, user_api="blas"):
        if _blas_counts() != [2]:
            pytest.skip("numpy's BLAS pool here cannot run 2 threads")
        yield 2, 2
    torch.set_num_threads(before)


def _one_cpu_task():
    import uuid

    from daskrl import Resources, task

    return task(_counts_reporter(), role="rollout", replica=0, iteration=0,
                run=uuid.uuid4().hex[:8], resources=Resources(cpu=1))


def test_a_task_in_the_callers_thread_gives_its_thread_counts_back(callers_counts):
    """``--scheduler sync``: the task runs with its grant of 1 thread in the caller's own
    thread, and the caller's torch and BLAS counts are as they were afterwards."""
    import torch

    from daskrl.runtime.sync_backend import SyncBackend

    seen = SyncBackend().submit(_one_cpu_task()).result()
    assert seen == (1, [1])  # the grant held inside the task
    assert (torch.get_num_threads(), _blas_counts()) == (2, [2])


THREAD_WORKER_SCRIPT = """
import json, sys, uuid
import numpy, torch
from distributed import Client, LocalCluster
from threadpoolctl import threadpool_info
from daskrl import Resources, task
from daskrl.runtime.dask_backend import DaskBackend
sys.path.insert(0, sys.argv[1])
from test_byo_dask import _counts_reporter

def blas():
    return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

before = (torch.get_num_threads(), blas())
with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, resources={"CPU": 1},
                  dashboard_address=None) as cluster, Client(cluster) as client:
    graph = task(_counts_reporter(), role="rollout", replica=0, iteration=0,
                 run=uuid.uuid4().hex[:8], resources=Resources(cpu=1))
    seen = DaskBackend(client).submit(graph).result(timeout=60)
    print(json.dumps({"before": before, "seen": seen, "after": (torch.get_num_threads(), blas())}))
"""


def test_thread_workers_give_the_callers_blas_count_back(tmp_path):
    """Thread workers share the caller's process, whose BLAS pool is one for all its
    threads: a fresh process (a notebook that set nothing) gets its count back once the task
    ends; torch's count is per thread and the caller's stays. (A fresh process: once its
    main thread sets a BLAS count, OpenBLAS ignores other threads' counts.)"""
    import json

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores for a BLAS pool larger than the task's grant")
    env = {k: v for k, v in os.environ.items()  # a notebook: the libraries' own defaults
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", THREAD_WORKER_SCRIPT, str(REPO / "tests")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["before"][1][0] >= 2, counts
    assert counts["seen"] == [1, [1]], counts  # the grant held inside the task
    assert counts["after"] == counts["before"], counts


# ------------------------------------------- many thread workers: Dask's per-worker upkeep


def _profiling(client: Client) -> set[bool]:
    return set(client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
               .values())


def test_many_thread_workers_with_the_profiler_on_are_named_in_one_line(capfd):
    """A user's cluster of thread workers made with Dask's defaults (the profiler on, every
    10 ms per worker) gets one line of advice; one made under quiet_upkeep(), and daskrl's
    own thread workers, get none."""
    import dask

    from daskrl.cluster.local import local_cluster
    from daskrl.cluster.upkeep import MANY_WORKERS, quiet_upkeep, upkeep_advice
    from daskrl.runtime.dask_backend import DaskBackend

    with dask.config.set({"distributed.worker.profile.enabled": True}):  # Dask's default
        users = LocalCluster(n_workers=MANY_WORKERS, processes=False, threads_per_worker=1,
                             memory_limit=0, dashboard_address=None)
    with users, Client(users) as client:
        client.wait_for_workers(MANY_WORKERS, timeout=60)
        assert _profiling(client) == {True}
        DaskBackend(client)
        line = capfd.readouterr().err
        assert f"daskrl: {MANY_WORKERS} Dask workers share process " in line, line
        assert "quiet_upkeep()" in line and line.count("\n") == 1, line
        assert upkeep_advice(client, many=MANY_WORKERS + 1) is None  # fewer than that
    with quiet_upkeep():
        quiet = LocalCluster(n_workers=4, processes=False, threads_per_worker=1,
                             memory_limit=0, dashboard_address=None)
    with quiet, Client(quiet) as client:
        assert _profiling(client) == {False} and upkeep_advice(client, many=4) is None
    with local_cluster([{"CPU": 1}] * 4, processes=False, dashboard_address=None) as own, \
            Client(own) as client:
        client.wait_for_workers(4, timeout=60)
        assert _profiling(client) == {False} and upkeep_advice(client, many=4) is None
        ticks = client.run(lambda dask_worker: dask_worker.periodic_callbacks["tick"]
                           .callback_time)
        assert set(ticks.values()) == {1000}, ticks  # quiet_upkeep's tick: 1 s, not 20 ms
