"""Keys, annotations and placement as the Dask scheduler sees them, on real worker processes.

The cluster (``cluster_gpu_client``) has ``w0`` {CPU: 1} and ``w1`` {CPU: 1, GPU: 1}: the
learner must run on ``w1`` and rollouts must stay off it.
"""

from __future__ import annotations

import csv
import time
import uuid
from pathlib import Path

import pytest
from dask.utils import key_split
from distributed import Client, Event

from daskrl import Resources, plan_placement, task, task_key
from daskrl.cluster.local import worker_resources
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.distributions import IterationInputs, get_distribution
from daskrl.runtime.driver import RunSettings, initial_output, train

pytestmark = pytest.mark.timeout(120)


def scheduler_view(client):
    """Every task the scheduler holds now: restrictions, prefix, dependencies, state."""

    def view(dask_scheduler):
        return {k: (ts.resource_restrictions, ts.worker_restrictions, ts.loose_restrictions,
                    ts.prefix.name, sorted(d.key for d in ts.dependencies), ts.state)
                for k, ts in dask_scheduler.tasks.items()}

    return client.run_on_scheduler(view)


def worker_addresses(client) -> dict[str, str]:
    """Worker name -> address, as the scheduler knows them now."""
    info = scheduler_workers(client)
    return {str(w["name"]): addr for addr, w in info.items()}


def wait_for_tasks(client, run: str, count: int) -> dict:
    """The scheduler's view of ``run``'s tasks once ``count`` of them arrived (graphs are sent
    asynchronously)."""
    deadline = time.monotonic() + 30
    while True:
        view = {key: v for key, v in scheduler_view(client).items() if run in key}
        if len(view) >= count or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def gated(client, value, name):
    """A future of ``value`` that completes only once the event ``name`` is set."""

    def wait_then_return(x):
        if not Event(name).wait(60):
            raise TimeoutError(f"event {name} never set")
        return x

    return client.submit(wait_then_return, value, key=f"gate-{name}", workers=["w0"])


def rollout_workers(column: str) -> set[str]:
    """Workers named in a ``rollout_workers`` entry (``<replica>@<worker>;...``)."""
    return {part.rpartition("@")[2] for part in column.split(";")}


def place(client, algo, dist):
    """The distribution's placement on the workers the scheduler knows now."""
    return plan_placement(dist.fragments(algo), worker_resources(client))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_task_key_format_and_role_prefix():
    key = task_key("rollout", 3, 7, "1a2b3c4d")
    assert key == "rollout-3-it7-1a2b3c4d"
    assert key_split(key) == "rollout"
    assert key_split(task_key("learner", 0, 12, "deadbeef")) == "learner"
    assert key_split(task_key("central_inference", 1, 0, "00000000")) == "central_inference"


@pytest.mark.parametrize("fuse", [False, True], ids=["per-replica", "fused"])
def test_iteration_keys_and_annotations_on_the_scheduler(
    cluster_gpu_client, cluster_tiny_ppo, fuse
):
    client = cluster_gpu_client
    algo = cluster_tiny_ppo(num_actors=3)
    dist = get_distribution("actors-learner", fuse=fuse)
    placement = place(client, algo, dist)
    assert placement.workers["learner"] == ("w1",)
    assert placement.workers["rollout"] == ("w0", "w0", "w0")
    first, _, _ = initial_output(algo, RunSettings(out=Path("unused")))
    run, k = uuid.uuid4().hex[:8], 4
    event = f"go-{run}"
    learner_in = gated(client, first, event)
    graph = dist.iteration(IterationInputs(algo, placement, run, 1, k, 10, learner_in))
    assert graph.key == f"learner-0-it{k}-{run}"
    # unfused: one task per replica; fused: the three co-located replicas run as one task
    # keyed by the first replica
    rollouts = [f"rollout-{r}-it{k}-{run}" for r in ((0,) if fuse else (0, 1, 2))]
    learner = f"learner-0-it{k}-{run}"
    fut = client.compute(graph)
    try:
        view = wait_for_tasks(client, run, 2 + len(rollouts))
        first_priority = client.run_on_scheduler(
            lambda dask_scheduler: {k: ts.priority[0] for k, ts in dask_scheduler.tasks.items()
                                    if run in k})
    finally:
        if not fuse:
            # several rollout tasks queued on one worker invite work stealing, which moves
            # loosely pinned tasks anywhere (see test_pin_never_relaxes_resources):
            # drop this graph before it runs
            fut.cancel()
        Event(event).set()
    addr = worker_addresses(client)
    assert sorted(view) == sorted([f"gate-{event}", learner, *rollouts])
    # earlier iterations first: Dask's priority tuple starts with minus the annotation
    assert {first_priority[key] for key in [learner, *rollouts]} == {k}
    for key in rollouts:
        res, workers, loose, prefix, deps, state = view[key]
        assert key_split(key) == prefix == "rollout"
        assert res == {"CPU": 1} == placement.resources["rollout"].to_dask()
        assert workers == {addr["w0"]} and loose is False
        assert deps == [f"gate-{event}"] and state == "waiting"
    res, workers, loose, prefix, deps, state = view[learner]
    assert key_split(learner) == prefix == "learner"
    assert res == {"GPU": 1} == placement.resources["learner"].to_dask()
    assert workers == {addr["w1"]} and loose is False
    assert deps == sorted([f"gate-{event}", *rollouts])
    if fuse:
        out = fut.result(timeout=60)
        assert out.version == 1
        assert out.metrics["learner_worker"] == "w1"
        assert out.metrics["env_steps"] > 0
        assert rollout_workers(out.metrics["rollout_workers"]) == {"w0"}


def test_task_without_worker_has_only_resource_restrictions(cluster_gpu_client):
    client = cluster_gpu_client
    run = uuid.uuid4().hex[:8]
    event = f"go-{run}"
    gate = gated(client, 20, event)
    zero_gpu = task(lambda x: x + 1, gate, role="evaluate", replica=0, iteration=0, run=run,
                    resources=Resources(cpu=1, gpu=0, custom={"MEM_GB": 0}))
    gpu = task(lambda x: x + 2, gate, role="inference", replica=1, iteration=0, run=run,
               resources=Resources(gpu=1), worker="w1")
    futs = client.compute([zero_gpu, gpu])
    try:
        view = wait_for_tasks(client, run, 3)
    finally:
        Event(event).set()
    # GPU:0 and MEM_GB:0 are left out, so the task may run on w0, which lacks both keys
    assert view[f"evaluate-0-it0-{run}"][:3] == ({"CPU": 1}, None, False)
    assert view[f"inference-1-it0-{run}"][:3] == (
        {"GPU": 1}, {worker_addresses(client)["w1"]}, False)
    assert client.gather(futs) == [21, 22]


def test_short_training_places_the_learner_on_the_gpu_worker(
    cluster_gpu_client, cluster_tiny_ppo, tmp_path
):
    algo = cluster_tiny_ppo()
    settings = RunSettings(out=tmp_path, steps=3 * algo.steps_per_iteration, seed=3,
                           progress=False)
    summary = train(cluster_gpu_client, algo, get_distribution("actors-learner"), settings)
    assert summary["placement"] == {"rollout": ["w0", "w0"], "learner": ["w1"],
                                    "evaluate": ["w0"]}
    assert summary["iterations"] == 3
    assert summary["eval_episodes"] == 2 and summary["eval_return_mean"] > 0
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in rows] == ["1", "2", "3"]
    assert {r["learner_worker"] for r in rows} == {"w1"}
    assert all(rollout_workers(r["rollout_workers"]) == {"w0"} for r in rows)
    assert (tmp_path / "summary.json").is_file()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-00000003.pt"]


def test_resource_nobody_offers_fails_before_submission(
    cluster_gpu_client, cluster_tiny_ppo, tmp_path
):
    client = cluster_gpu_client
    before = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))
    algo = cluster_tiny_ppo().with_resources({"learner": Resources(gpu=1, custom={"TPU": 2})})
    t0 = time.monotonic()
    with pytest.raises(ValueError) as info:
        train(client, algo, get_distribution("actors-learner"),
              RunSettings(out=tmp_path, steps=1000, progress=False))
    assert time.monotonic() - t0 < 10  # not the scheduler's 30 s no-workers timeout
    text = str(info.value)
    assert "fragment 'learner'" in text and "TPU:2" in text and "no worker offers" in text
    after = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))
    assert after <= before  # nothing was submitted
    assert not (tmp_path / "metrics.csv").exists()


def test_fallbacks_resolve_against_the_cluster_workers(cluster_gpu_client, cluster_tiny_ppo):
    # nobody offers NPU: each role takes its fallback, and GPU roles go to the GPU worker
    algo = cluster_tiny_ppo().with_resources({
        "rollout": Resources(custom={"NPU": 1}, fallback=Resources(cpu=1)),
        "learner": Resources(custom={"NPU": 1}, fallback=Resources(gpu=1)),
    })
    placement = place(cluster_gpu_client, algo, get_distribution("actors-learner"))
    assert placement.resources["rollout"].to_dask() == {"CPU": 1}
    assert placement.resources["learner"].to_dask() == {"GPU": 1}
    assert placement.workers == {"rollout": ("w0", "w0"), "learner": ("w1",)}


def test_pin_never_relaxes_resources():
    from daskrl.cluster.local import local_cluster, sync_workers

    cluster = local_cluster([{"CPU": 1}, {"CPU": 1, "GPU": 1}])
    client = Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        del cluster.worker_spec["w1"]  # the GPU worker is lost
        sync_workers(cluster)
        assert set(worker_addresses(client)) == {"w0"}
        learner = task(lambda: "ran", role="learner", replica=0, iteration=0, run="lost0000",
                       resources=Resources(gpu=1), worker="w1")
        fut = client.compute(learner)
        time.sleep(2)
        # nobody offers GPU now: the task must wait for one (and fail after the
        # no-workers timeout), not be sent to w0
        states = client.run_on_scheduler(
            lambda dask_scheduler: {k: ts.state for k, ts in dask_scheduler.tasks.items()})
        assert fut.status == "pending", repr(fut.exception()) if fut.status == "error" else ""
        assert states.get(learner.key) == "no-worker"
    finally:
        client.close()
        cluster.close()


def test_embedded_workers_keep_freed_memory_for_reuse(cluster_gpu_client):
    """Worker processes start with daskrl's allocator settings, not the nanny's 64 KiB trim
    (which made every large array a fresh mmap and slowed the update by a quarter)."""
    import os

    from daskrl.cluster.forkserver import WORKER_MALLOC

    env = cluster_gpu_client.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC})
    assert list(env.values()) == [{k: str(v) for k, v in WORKER_MALLOC.items()}] * 2


def test_embedded_workers_run_without_dasks_sampling_profiler(cluster_gpu_client):
    """Dask's profiler samples a worker's task every 10 ms (~6% of a PPO iteration): off on
    the workers daskrl starts."""
    sampling = cluster_gpu_client.run(
        lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
    assert list(sampling.values()) == [False, False]
