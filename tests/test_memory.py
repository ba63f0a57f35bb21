"""The memory budget: an estimate per worker from the placement, checked before launch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, Nanny

from daskrl import Algorithm, Placement
from daskrl.cluster.local import configure_dask, sync_workers
from daskrl.core.script import load_graph
from daskrl.core.sizes import Sizes
from daskrl.distributions import get_distribution
from daskrl.runtime.backend import DaskBackend, SyncBackend
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.memory import (
    ACTOR_COPIES,
    LEARNER_COPIES,
    PROCESS_BYTES,
    MemoryBudgetError,
    check_memory,
    estimate,
)

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2 * 2**30


@pytest.fixture(scope="module")
def cluster_small_memory() -> Iterator[Client]:
    """Worker processes ``w0`` and ``w1`` with a 2 GiB memory limit each."""
    configure_dask()
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
