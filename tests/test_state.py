"""Worker-resident state: kept across iterations on one worker, rebuilt on another.

Runs on real worker processes (``cluster_gpu_client``: ``w0`` {CPU: 1}, ``w1`` {CPU: 1,
GPU: 1}); one test adds and retires a third worker, another resumes on a new cluster.
"""

from __future__ import annotations

import csv
import time
import uuid
from pathlib import Path

import pytest
import torch
from distributed import Client

from daskrl import plan_placement, resident
from daskrl.cluster.local import local_cluster, sync_workers, worker_resources
from daskrl.core.worker_state import PLUGIN_NAME, drop_run, in_turn, register, worker_name
from daskrl.distributions import IterationInputs, get_distribution
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.driver import RunSettings, initial_output, train

pytestmark = pytest.mark.timeout(180)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- the registry itself


class Closable:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_resident_builds_once_per_key_in_process():
    run = uuid.uuid4().hex[:8]
    calls = []

    def build(tag):
        calls.append(tag)
        return Closable()

    a, built_a = resident((run, "rollout", 0), lambda: build("a"))
    again, built_again = resident((run, "rollout", 0), lambda: build("again"))
    b, built_b = resident((run, "rollout", 1), lambda: build("b"))
    assert (built_a, built_again, built_b) == (True, False, True)
    assert again is a and b is not a and calls == ["a", "b"]
    other, _ = resident(("other" + run, "rollout", 0), Closable)
    assert worker_name() == "local"
    assert drop_run(run) == 2
    assert a.closed and b.closed and not other.closed
    assert resident((run, "rollout", 0), lambda: "fresh") == ("fresh", True)
    assert drop_run(run) == 1 and drop_run("other" + run) == 1


def test_a_failed_build_stores_nothing():
    run = uuid.uuid4().hex[:8]

    def boom():
        raise RuntimeError("env failed to start")

    with pytest.raises(RuntimeError, match="env failed"):
        resident((run, "rollout", 0), boom)
    assert resident((run, "rollout", 0), lambda: 7) == (7, True)
    drop_run(run)


def test_resident_state_lives_on_each_worker(cluster_gpu_client):
    client = cluster_gpu_client
    run = uuid.uuid4().hex[:8]

    def touch(i):
        obj, built = resident((run, "rollout", 0), lambda: {"born": worker_name(), "calls": 0})
        obj["calls"] += 1
        return worker_name(), built, obj["born"], obj["calls"]

    on = [("w0", 0), ("w0", 1), ("w1", 2), ("w0", 3), ("w1", 4)]
    results = [client.submit(touch, i, workers=[w], pure=False).result() for w, i in on]
    assert results == [("w0", True, "w0", 1), ("w0", False, "w0", 2), ("w1", True, "w1", 1),
                       ("w0", False, "w0", 3), ("w1", False, "w1", 2)]
    # nothing of it went into worker.data (which Dask spills and moves)
    keys = client.run(lambda dask_worker: [str(k) for k in dask_worker.data])
    assert not any(run in k for ks in keys.values() for k in ks)
    dropped = [client.submit(drop_run, run, workers=[w], pure=False).result()
               for w in ("w0", "w1", "w0")]
    assert dropped == [1, 1, 0]


def test_a_task_out_of_turn_runs_after_the_earlier_iteration(cluster_gpu_client):
    """Two iterations' tasks stepping the same resident envs: the later one, ready first,
    hands its worker's CPU back to the scheduler until the earlier one ran; one whose
    earlier iteration never comes runs after ``wait_s``."""
    client = cluster_gpu_client
    run = uuid.uuid4().hex[:8]

    def step(iteration, after, *_, wait_s=60.0):
        with in_turn((run, "rollout", 0), iteration, after, wait_s=wait_s):
            log, _ = resident((run, "log"), list)
            log.append(iteration)
            return list(log)

    pin = {"workers": ["w0"], "resources": {"CPU": 1}, "pure": False}
    gate = client.submit(time.sleep, 1.0, workers=["w1"], pure=False)
    first = client.submit(step, 0, None, gate, **pin)  # waits for the gate
    second = client.submit(step, 1, 0, **pin)  # ready at once, but must follow iteration 0
    assert second.result() == [0, 1] and first.result() == [0]
    lost = client.submit(step, 5, 4, wait_s=0.5, **pin)  # iteration 4 never runs
    assert lost.result() == [0, 1, 5]
    assert client.submit(drop_run, run, workers=["w0"], pure=False).result() == 2


class MarksClosed:
    """A resident object that leaves a file behind when closed (seen across processes)."""

    def __init__(self, path):
        self.path = path

    def close(self):
        Path(self.path).write_text("closed")


def test_resident_state_is_a_worker_plugin_that_closes_objects_with_its_worker(tmp_path):
    run = uuid.uuid4().hex[:8]
    mark = tmp_path / "closed"

    def build(i):
        obj, built = resident((run, "env", 0), lambda: MarksClosed(str(mark)))
        return built

    cluster = local_cluster([{"CPU": 1}])
    client = Client(cluster)
    try:
        # nobody registered the plugin on this cluster: the first task that needs it does
        assert client.run(lambda dask_worker: PLUGIN_NAME in dask_worker.plugins) == {
            next(iter(cluster.scheduler_info["workers"])): False}
        assert client.submit(build, 0, pure=False).result() is True
        assert list(client.run(lambda dask_worker: PLUGIN_NAME in dask_worker.plugins
                               ).values()) == [True]
        register(client)  # again: the objects built stay
        assert client.submit(build, 1, pure=False).result() is False
        assert not mark.exists()
    finally:
        client.close()
        cluster.close()
    assert mark.read_text() == "closed"  # the plugin's teardown closed it with the worker


# --------------------------------------------------------------------------- training


def test_actors_and_learner_are_reused_across_iterations(
    cluster_gpu_client, cluster_tiny_ppo, tmp_path
):
    algo = cluster_tiny_ppo(num_actors=1)
    settings = RunSettings(out=tmp_path, steps=4 * algo.steps_per_iteration, seed=5,
                           progress=False, eval=False)
    train(cluster_gpu_client, algo, get_distribution("actors-learner"), settings)
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["actors_built"] for r in rows] == ["1", "0", "0", "0"]
    assert [r["learner_built"] for r in rows] == ["True", "False", "False", "False"]
    assert {r["learner_worker"] for r in rows} == {"w1"}
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[0] > 0  # cumulative


def resident_keys(client) -> dict[str, list[str]]:
    """Worker name -> keys of the objects resident there (read inside a task on each)."""

    def keys():
        from distributed import get_worker

        plugin = get_worker().plugins.get(PLUGIN_NAME)
        return sorted(map(str, plugin.objects if plugin is not None else {}))

    names = worker_resources(client)
    return {w: client.submit(keys, workers=[w], pure=False).result() for w in names}


def test_run_state_is_dropped_from_the_workers_after_training(
    cluster_gpu_client, cluster_tiny_ppo, tmp_path
):
    algo = cluster_tiny_ppo(num_actors=1)
    settings = RunSettings(out=tmp_path, steps=algo.steps_per_iteration, seed=6,
                           progress=False, eval=False)
    before = resident_keys(cluster_gpu_client)
    train(cluster_gpu_client, algo, get_distribution("actors-learner"), settings)
    assert resident_keys(cluster_gpu_client) == before


def test_replica_is_rebuilt_on_another_worker_when_its_worker_retires(
    cluster_gpu_client, cluster_tiny_ppo
):
    client, cluster = cluster_gpu_client, cluster_gpu_client.cluster
    run = uuid.uuid4().hex[:8]
    spec = dict(cluster.worker_spec["w0"])
    spec["options"] = {**spec["options"], "resources": {"CPU": 1}}
    cluster.worker_spec["w2"] = spec
    sync_workers(cluster)
    try:
        client.wait_for_workers(3, timeout=60)
        algo = cluster_tiny_ppo(num_actors=2)
        dist = get_distribution("actors-learner")
        placement = plan_placement(dist.fragments(algo), worker_resources(client))
        assert placement.workers["rollout"] == ("w0", "w2")
        learner_in, _, _ = initial_output(algo, RunSettings(out=Path("unused")))
        futures = [learner_in]

        def iteration(k):
            # chained through futures, as the driver does: the learner's output stays on w1
            inputs = IterationInputs(algo, placement, run, 1, k, 10, futures[-1])
            futures.append(client.compute(dist.iteration(inputs)))
            return futures[-1].result(timeout=60)

        outs = [learner_in]
        for k in range(2):
            outs.append(iteration(k))
        assert [o.metrics["actors_built"] for o in outs[1:]] == [2, 0]
        assert [o.metrics["rollout_workers"] for o in outs[1:]] == ["0@w0;1@w2"] * 2
        del cluster.worker_spec["w2"]  # retire the worker holding replica 1
        sync_workers(cluster)
        assert set(worker_resources(client)) == {"w0", "w1"}
        # pins are strict: like the driver, plan placement again on the workers left
        placement = plan_placement(dist.fragments(algo), worker_resources(client))
        assert placement.workers["rollout"] == ("w0", "w0")
        for k in range(2, 4):
            outs.append(iteration(k))
        moved = outs[3].metrics
        assert moved["actors_built"] == 1  # only replica 1 was rebuilt
        assert moved["learner_built"] is False and moved["learner_worker"] == "w1"
        where = dict(p.split("@") for p in moved["rollout_workers"].split(";"))
        assert where == {"0+1": "w0"}  # co-located replicas run fused in one task
        assert [o.version for o in outs] == [0, 1, 2, 3, 4]
        assert all(o.metrics["env_steps"] > 0 for o in outs[1:])
    finally:
        cluster.worker_spec.pop("w2", None)
        sync_workers(cluster)
        for w in worker_resources(client):
            client.submit(drop_run, run, workers=[w], pure=False).result()


def test_resume_on_a_new_worker_set_rebuilds_state_from_the_checkpoint(
    cluster_gpu_client, cluster_tiny_ppo, tmp_path
):
    algo = cluster_tiny_ppo(num_actors=1)
    per_it = algo.steps_per_iteration
    dist = get_distribution("actors-learner")
    first = train(cluster_gpu_client, algo, dist,
                  RunSettings(out=tmp_path, steps=2 * per_it, seed=2, progress=False, eval=False))
    saved = load_latest(tmp_path / "checkpoints")
    assert saved["iteration"] == 2 and saved["counters"]["env_steps"] == first["env_steps"]

    # a learning rate of 0 keeps the weights: after the resumed iterations they must still be
    # the checkpoint's, which they are only if the new learner loaded them
    frozen = cluster_tiny_ppo(num_actors=1, learning_rate=0.0)
    cluster = local_cluster([{"CPU": 1}])  # no GPU: the learner falls back to CPU
    client = Client(cluster)
    try:
        client.wait_for_workers(1, timeout=60)
        summary = train(client, frozen, dist,
                        RunSettings(out=tmp_path, steps=4 * per_it, seed=2, resume=True,
                                    progress=False, eval=False))
    finally:
        client.close()
        cluster.close()
    assert summary["placement"]["learner"] == ["w0"] and summary["placement"]["rollout"] == ["w0"]
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in rows] == ["1", "2", "3", "4"]
    assert [r["actors_built"] for r in rows] == ["1", "0", "1", "0"]
    assert [r["learner_built"] for r in rows] == ["True", "False", "True", "False"]
    assert [r["learner_worker"] for r in rows] == ["w1", "w1", "w0", "w0"]
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[1] == first["env_steps"]
    assert summary["env_steps"] == steps[-1] > first["env_steps"]
    final = load_latest(tmp_path / "checkpoints")
    assert final["iteration"] == 4
    for name, value in saved["learner"]["model"].items():
        assert torch.equal(final["learner"]["model"][name], value), name


# ------------------------------------------------- threads: each task runs with its CPU grant


def _grant_reporter():
    """A function (sent by value: workers cannot import this file) that returns torch's
    threads and every BLAS pool's, as a task sees them."""

    def report() -> tuple[int, list[int]]:
        import numpy  # noqa: F401 - its BLAS pool is loaded
        import torch
        from threadpoolctl import threadpool_info

        return torch.get_num_threads(), sorted({p["num_threads"] for p in threadpool_info()
                                                if p["user_api"] == "blas"})

    return report


def _grant_task(cpu: float):
    from daskrl import Resources, task

    return task(_grant_reporter(), role="rollout", replica=0, iteration=0, run=uuid.uuid4().hex[:8],
                resources=Resources(cpu=cpu))


@pytest.mark.parametrize("cpu", [1, 2])
def test_a_task_in_sync_mode_runs_torch_and_blas_with_its_cpu_grant(cpu):
    from daskrl.runtime.sync_backend import SyncBackend

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3 - cpu)  # the other count: the task must change it
        threads, blas = SyncBackend().submit(_grant_task(cpu)).result()
    finally:
        torch.set_num_threads(before)
    assert threads == cpu and blas == [1]


def test_a_task_on_a_worker_without_a_nanny_runs_with_its_cpu_grant(tmp_path):
    """``dask worker --no-nanny`` does not set OMP_NUM_THREADS: torch would use every core."""
    import os
    import subprocess
    import sys

    from distributed import LocalCluster

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    with LocalCluster(n_workers=0, dashboard_address=None, host="127.0.0.1") as cluster, \
            Client(cluster) as client, (tmp_path / "worker.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                 cluster.scheduler_address, "--no-nanny", "--nthreads", "2",
                                 "--resources", "CPU=2", "--name", "lone", "--no-dashboard"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            client.wait_for_workers(1, timeout=90)
            cores = os.cpu_count() or 1
            untouched = client.submit(_grant_reporter(), pure=False).result(timeout=60)
            assert untouched[0] == cores  # what every task would run with otherwise
            for cpu in (1, 2, 1):
                threads, blas = client.compute(_grant_task(cpu)).result(timeout=60)
                assert threads == cpu and blas == [1]  # numpy's BLAS: one thread
        finally:
            # SIGTERM makes a nanny-less worker close with the scheduler, which a loaded
            # machine can stall past any bound: the assertions above are what is tested
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


LATE_BLAS_SCRIPT = """
import json
import numpy, torch
from threadpoolctl import threadpool_info, threadpool_limits
from daskrl.core.worker_state import limit_threads
limit_threads(1)  # a first task, before scipy (and its own OpenBLAS) is loaded
import scipy.linalg
with threadpool_limits(limits=2, user_api="blas"):
    limit_threads(1)
    print(json.dumps(sorted({p["num_threads"] for p in threadpool_info()
                             if p["user_api"] == "blas"})))
"""


def test_a_blas_loaded_after_the_first_task_is_held_at_one_thread_too():
    """An import between two tasks can load another BLAS (scipy ships its own OpenBLAS): the
    next task must hold it at one thread as well (a fresh process, so scipy is not loaded
    before the first task)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("scipy")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores for a BLAS pool larger than the task's grant")
    out = subprocess.run([sys.executable, "-c", LATE_BLAS_SCRIPT], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [1]
