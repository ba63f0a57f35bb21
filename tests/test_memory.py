"""The memory budget: an estimate per worker from the placement, checked before launch."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, Nanny

from daskrl import Algorithm, Placement
from daskrl.cluster.local import sync_workers
from daskrl.core.script import load_graph
from daskrl.core.sizes import Sizes
from daskrl.distributions import get_distribution
from daskrl.runtime import memory
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.memory import (
    ACTOR_COPIES,
    LEARNER_COPIES,
    PROCESS_BYTES,
    MemoryBudgetError,
    check_memory,
    estimate,
)
from daskrl.runtime.sync_backend import SyncBackend

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2 * 2**30


@pytest.fixture(scope="module")
def cluster_small_memory() -> Iterator[Client]:
    """Worker processes ``w0`` and ``w1`` with a 2 GiB memory limit each."""
    with LocalCluster(n_workers=0, threads_per_worker=1, memory_limit=LIMIT, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        (template,) = cluster.new_worker_spec().values()
        base = dict(template["options"])
        for name in ("w0", "w1"):  # named like daskrl.cluster.local.local_cluster's workers
            cluster.worker_spec[name] = {"cls": Nanny, "options": {
                **base, "nthreads": 1, "resources": {"CPU": 1}}}
        sync_workers(cluster)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            yield client


def _algo(**sizes: int) -> Algorithm:
    return Algorithm("a", print, print, print, num_steps=100, num_envs=10, num_actors=2,
                     sizes=Sizes(**sizes))


def test_estimate_follows_the_placement() -> None:
    algo = _algo(transition_bytes=50, model_params=1000)
    one = 100 * 10 * 50  # one replica's rollout
    spread = estimate(algo, Placement({}, {"rollout": ("w0", "w1"), "learner": ("w0",)}),
                      "actors-learner")
    assert spread["w1"].parts == {"worker process": PROCESS_BYTES,
                                  "rollout buffers": ACTOR_COPIES * one,
                                  "policy copy": 2 * 4 * 1000}
    assert spread["w0"].parts["learner batch"] == LEARNER_COPIES * 2 * one
    assert spread["w0"].total > spread["w1"].total
    fused = estimate(algo, Placement({}, {"learner": ("w0",)}), "single")  # rollouts inside
    assert fused["w0"].parts["rollout buffers"] == ACTOR_COPIES * 2 * one
    assert estimate(Algorithm("a", print, print, print, num_steps=8),
                    Placement({}, {"learner": ("w0",)})) == {}  # no sizes: not estimated


def test_a_learner_that_receives_gradients_is_estimated_by_what_it_declares() -> None:
    """The estimate asks the distribution what its learner receives, not its name: a new
    gradient-shipping distribution is estimated as ``async`` is."""
    from daskrl.distributions import AsyncGradients

    class Shipping(AsyncGradients):
        name = "my-gradient-shipping"

    algo = _algo(transition_bytes=50, model_params=1000)
    place = Placement({}, {"rollout": ("w1", "w2"), "learner": ("w0",)})
    for distribution in (get_distribution("async"), Shipping()):
        parts = estimate(algo, place, distribution)["w0"].parts
        assert parts["gradients"] == 2 * 4 * 1000 and "learner batch" not in parts
    assert "gradients" not in estimate(algo, place, "actors-learner")["w0"].parts


def test_in_process_backend_has_no_limit() -> None:
    algo = _algo(transition_bytes=10**9)
    need = check_memory(SyncBackend(), algo, get_distribution("single"),
                        Placement({}, {"learner": ("local",)}))
    assert need["local"].total > 10**12


def test_refuses_an_oversized_marl_run_before_launch(cluster_small_memory: Client,
                                                     tmp_path: Path) -> None:
    client = cluster_small_memory
    mappo = load_graph(str(ROOT / "graphs" / "mappo.py"))
    algo = mappo.build(mappo.Config(num_adversaries=3000, num_good=1000,
                                    num_agent_neighbors=4))
    assert algo.sizes is not None and algo.sizes.transition_bytes > 4000 * 100
    with pytest.raises(MemoryBudgetError) as err:
        train(client, algo, get_distribution("actors-learner"),
              RunSettings(out=tmp_path, steps=algo.steps_per_iteration, progress=False,
                          eval=False, tensorboard=False))
    msg = str(err.value)
    assert DaskBackend(client).memory_limits() == {"w0": LIMIT, "w1": LIMIT}
    assert "worker 'w0' would need about" in msg or "worker 'w1' would need about" in msg, msg
    assert "memory limit is 2.0 GiB" in msg and "--num-envs" in msg and "--num-steps" in msg
    assert not (tmp_path / "metrics.csv").exists()  # refused before the first iteration
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0


def test_accepts_the_default_run_and_estimates_its_batch(cluster_small_memory: Client,
                                                         tmp_path: Path) -> None:
    client = cluster_small_memory
    mappo = load_graph(str(ROOT / "graphs" / "mappo.py"))
    algo = mappo.build(mappo.Config())
    # fuse=false: the rollout stays a task of its own (not run inside the learner's task) so
    # that Dask measures its batch; the placement, and so the estimate, are the default's
    summary = train(client, algo, get_distribution("actors-learner:fuse=false"),
                    RunSettings(out=tmp_path, steps=algo.steps_per_iteration, progress=False,
                                eval=False, tensorboard=False))
    assert summary["iterations"] == 1
    measured = [r["nbytes"] for r in client.get_task_stream()
                if str(r["key"]).startswith("rollout-")]  # Dask's own size of each batch
    assert measured
    estimated = algo.num_envs * algo.num_steps * algo.sizes.transition_bytes
    assert 0.5 <= estimated / max(measured) <= 2.0, (estimated, measured)


def test_ppo_estimate_matches_a_measured_batch() -> None:
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_envs=4, num_steps=64))
    batch = algo.make_actor(0).rollout(algo.num_steps)
    measured = sum(v.nbytes for v in batch.values() if hasattr(v, "nbytes"))
    estimated = algo.num_envs * algo.num_steps * algo.sizes.transition_bytes
    assert 0.5 <= estimated / measured <= 2.0, (estimated, measured)


# ------------------------------------------------------------- thread workers share a process

THREAD_WORKERS = 128
PROCESS_LIMIT = 24 * 2**30


def _thread_cluster(**memory_limit: int) -> tuple[LocalCluster, Client]:
    cluster = LocalCluster(n_workers=THREAD_WORKERS, processes=False, threads_per_worker=1,
                           dashboard_address=None, **memory_limit)
    return cluster, Client(cluster)


@pytest.fixture(scope="module")
def cluster_thread_workers() -> Iterator[Client]:
    """128 in-process workers (threads of this process), each given the process's 24 GiB."""
    cluster, client = _thread_cluster(memory_limit=PROCESS_LIMIT)
    with cluster, client:
        yield client


def _place(client: Client, algo: Algorithm) -> Placement:
    from daskrl.runtime.run_loop import place

    return place(DaskBackend(client), algo, get_distribution("actors-learner"))


def test_thread_workers_are_one_process_charged_once(cluster_thread_workers: Client) -> None:
    backend = DaskBackend(cluster_thread_workers)
    assert len(set(backend.worker_processes().values())) == 1
    algo = _algo(transition_bytes=50, model_params=1000)
    placement = _place(cluster_thread_workers, algo)
    (need,) = check_memory(backend, algo, get_distribution("actors-learner"),
                           placement).values()
    assert need.parts["worker process"] == PROCESS_BYTES  # once, not once per worker
    assert len(need.workers) == len({w for ws in placement.workers.values() for w in ws}) > 1


def test_128_replicas_on_thread_workers_add_up_in_their_process(
        cluster_thread_workers: Client) -> None:
    """Each worker alone would fit its limit; together they exceed their process's."""
    # one replica's rollout: 10 envs x 100 steps x 64 KiB = 62.5 MiB; the learner's worker
    # alone would hold ~16.5 GiB of its 24 GiB, the process ~32 GiB
    algo = dataclasses.replace(_algo(transition_bytes=64 * 1024, model_params=1000),
                               num_actors=THREAD_WORKERS)
    placement = _place(cluster_thread_workers, algo)
    assert len(set(placement.workers["rollout"])) == THREAD_WORKERS
    with pytest.raises(MemoryBudgetError, match=r"^process \S+ would need about 3\d\.\d GiB "
                                                r".*rollout 0-127.* 128 workers are threads "):
        check_memory(DaskBackend(cluster_thread_workers), algo,
                     get_distribution("actors-learner"), placement)


def test_thread_workers_with_a_share_of_the_memory_each_are_refused_with_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask's default gives thread workers a share of the machine's memory each, and pauses
    each one once the whole process passes (most of) its own limit: such workers would
    never run a task, so the run is refused, saying how to give them the process's budget.
    The cluster made as the line says runs tasks, and the run passes the check.
    (Four workers here: 128 paused workers' memory monitors starve the process's event loop.)
    """
    share = 300 * 2**20  # below this process's memory (torch alone is more): Dask pauses
    # the thread workers' process is this test runner, whatever the tests before it loaded
    # (a compiler, many clusters): estimate it as it is, not as a fresh worker process
    import psutil

    monkeypatch.setattr(memory, "PROCESS_BYTES",
                        max(memory.PROCESS_BYTES, psutil.Process().memory_info().rss))
    with LocalCluster(n_workers=4, processes=False, threads_per_worker=1, memory_limit=share,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert set(DaskBackend(client).memory_limits().values()) == {share}
        algo = _algo(transition_bytes=50, model_params=1000)
        with pytest.raises(MemoryBudgetError) as refused:
            check_memory(DaskBackend(client), algo, get_distribution("actors-learner"),
                         _place(client, algo))
        # Dask's memory monitor pauses the workers at its first tick after they start: wait
        # for it, then a task never runs (what the refusal spares the user)
        statuses: set[str] = set()
        deadline = time.monotonic() + 20
        while statuses != {"paused"} and time.monotonic() < deadline:
            statuses = set(client.run(lambda dask_worker: dask_worker.status.name).values())
            time.sleep(0.1)
        assert statuses == {"paused"}, statuses
        with pytest.raises(TimeoutError):
            client.submit(abs, -1, pure=False).result(timeout=3)
    line = str(refused.value)
    fix = re.search(r'LocalCluster\(processes=False, memory_limit="(\d+GiB)"\), or no limit, '
                    r"memory_limit=0", line)
    assert fix and "threads of that process, and Dask pauses each one" in line, line
    assert "own limit, 300.0 MiB" in line, line
    for limit in (fix.group(1), 0):
        with LocalCluster(n_workers=4, processes=False, threads_per_worker=1,
                          memory_limit=limit, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            check_memory(DaskBackend(client), algo, get_distribution("actors-learner"),
                         _place(client, algo))
            assert client.submit(abs, -1, pure=False).result(timeout=30) == 1
