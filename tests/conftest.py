"""Shared fixtures: a real local Dask cluster (one worker advertising GPU=1) and the PPO graph.

Fixture names start with ``cluster_`` so they do not clash with fixtures of other test files.
Clusters are module-scoped: starting one (two worker processes importing torch) takes seconds.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

REPO = Path(__file__).resolve().parent.parent

# a sweep's report bootstraps its intervals in Python, 0.25 ms a resample: the tests check the
# report, not the interval's last digit (subprocesses and the docs' commands inherit it)
os.environ.setdefault("DASKRL_BOOTSTRAP_REPS", "1000")
PPO_GRAPH = REPO / "graphs" / "ppo.py"


@pytest.fixture(scope="session", autouse=True)
def cluster_workers_forked() -> Iterator[None]:
    """The worker processes of the clusters tests start fork from daskrl's worker fork server,
    as ``daskrl train``'s do: it imported torch, Dask and gymnasium once, where each spawned
    worker (Dask's default) imports them again, 2-3 CPU-seconds a worker. A test that wants
    Dask's default sets ``distributed.worker.multiprocessing-method`` itself."""
    import dask

    from daskrl.cluster.forkserver import worker_forkserver

    method = worker_forkserver()
    if method is None:
        yield
        return
    with dask.config.set({"distributed.worker.multiprocessing-method": method}):
        yield


@pytest.fixture(scope="module")
def cluster_one_cpu() -> Iterator[Client]:
    """A client of daskrl's own cluster with one worker of one CPU."""
    from daskrl.cluster.local import local_cluster

    cluster = local_cluster([{"CPU": 1}])
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="module")
def cluster_pair() -> Iterator[dict[int, Client]]:
    """Clients of a one-worker and a two-worker cluster (daskrl's own, one CPU per worker),
    keyed by their worker count: for runs that must agree whatever the workers."""
    from daskrl.cluster.local import local_cluster

    clusters = {n: local_cluster([{"CPU": 1}] * n) for n in (1, 2)}
    out = {n: Client(c) for n, c in clusters.items()}
    try:
        yield out
    finally:
        for n in out:
            out[n].close()
            clusters[n].close()


@pytest.fixture(scope="module")
def cluster_gpu_client() -> Iterator[Client]:
    """A client of a LocalCluster with workers ``w0`` {CPU: 1} and ``w1`` {CPU: 1, GPU: 1}.

    ``w1`` only *advertises* a GPU (a Dask resource); torch still runs on the CPU there.
    The cluster is reachable as ``client.cluster``.
    """
    from daskrl.cluster.local import local_cluster

    cluster = local_cluster([{"CPU": 1}, {"CPU": 1, "GPU": 1}])
    client = Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="session")
def cluster_ppo_graph() -> types.ModuleType:
    """``graphs/ppo.py`` loaded the way the CLI loads it (pickled by value to the workers)."""
    from daskrl.core.script import load_graph

    return load_graph(str(PPO_GRAPH))


@pytest.fixture(scope="session")
def cluster_tiny_ppo(cluster_ppo_graph: types.ModuleType):
    """A factory of small PPO algorithms: 2 actors x 4 envs x 32 steps (256 slots/iteration)."""

    def make(**overrides):
        settings = {"num_actors": 2, "num_envs": 4, "num_steps": 32, "update_epochs": 2,
                    "num_minibatches": 2, "eval_episodes": 2, **overrides}
        return cluster_ppo_graph.build(cluster_ppo_graph.Config(**settings))

    return make


@pytest.fixture(scope="session")
def cluster_python() -> str:
    """The interpreter running the tests (subprocesses use the same environment)."""
    return sys.executable
