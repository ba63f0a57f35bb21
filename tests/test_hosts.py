"""A cluster of separate processes (``daskrl.cluster.hosts``) and what its counters say
(``daskrl.observe.cluster_load``): real scheduler and worker processes, real tasks."""

from __future__ import annotations

import os

import dask
import numpy as np
from distributed import Client

from daskrl.algos.env_runner import burn_cpu
from daskrl.cluster.hosts import WorkerSpec, cpu_seconds, dask_env, host_cluster
from daskrl.observe.cluster_load import rates, sample, start_counting

# the worker processes cannot import this test module, and Dask pickles a module-level
# function by reference: what runs there is a lambda (pickled by value) or daskrl's own
_burn = lambda seconds: (burn_cpu(seconds), os.getpid())[1]  # noqa: E731


_settings = lambda: (dask.config.get("distributed.worker.profile.enabled"),  # noqa: E731
                     os.getpid())


def test_each_worker_is_a_process_of_its_own_with_its_threads_and_resources() -> None:
    specs = [WorkerSpec("a0", nthreads=3, resources={"CPU": 3}),
             WorkerSpec("learner", nthreads=1, resources={"learner_host": 1})]
    with host_cluster(specs) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        info = {w["name"]: w for w in client.scheduler_info(n_workers=-1)["workers"].values()}
        assert info["a0"]["nthreads"] == 3 and info["a0"]["resources"] == {"CPU": 3}
        assert info["learner"]["resources"] == {"learner_host": 1}
        scheduler_pid = client.run_on_scheduler(os.getpid)
        pids = client.run(os.getpid)
        assert len({scheduler_pid, os.getpid(), *pids.values()}) == 4  # all apart
        # a task that asks for learner_host runs on the learner's process, and no other
        where = client.submit(_burn, 0.3, resources={"learner_host": 1}, pure=False).result()
        assert where == cluster.workers["learner"].pid
        # the lab's quiet settings reached the worker processes
        assert client.submit(_settings, workers=["a0"], pure=False).result() == (
            False, cluster.workers["a0"].pid)
        used = cpu_seconds(cluster)
        assert used["learner"] >= 0.3 and set(used) == {"scheduler", "a0", "learner"}


def test_the_counters_see_tasks_cpu_and_bytes_sent() -> None:
    specs = [WorkerSpec("a0"), WorkerSpec("a1")]
    with host_cluster(specs) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        start_counting(client)
        before = sample(client)
        data = client.submit(np.ones, 2**20, workers=["a0"], pure=False)  # 8 MiB on a0
        total = client.submit(np.sum, data, workers=["a1"], pure=False)  # fetched by a1
        assert total.result() == 2**20
        client.gather(client.map(_burn, [0.2] * 4, workers=["a1"], pure=False))
        after = sample(client)
        r = rates(before, after, {"source": {"a0"}, "sink": {"a1"}})
        assert after.tasks_done - before.tasks_done == 6, (before, after)
        # the counter is Dask's own tally of what it sent, which can differ from the array's
        # 8 MiB by a few framing bytes; what matters is that a0's send shows and a1's does not
        assert r["source_bytes_per_s"] * r["window_s"] >= 0.9 * 8 * 2**20, r
        assert r["sink_bytes_per_s"] * r["window_s"] < 2**20, r  # only small results
        assert r["sink_cpu_share"] * r["window_s"] >= 0.8, r
        assert r["scheduler_cpu_share"] > 0, r


def test_settings_become_the_variables_dask_reads() -> None:
    env = dask_env({"distributed.scheduler.no-workers-timeout": "30s"})
    assert env == {"DASK_DISTRIBUTED__SCHEDULER__NO_WORKERS_TIMEOUT": "30s"}
