"""Every distribution trains on real LocalCluster workers, with its placement asserted.

One cluster serves the module: ``w0`` and ``w1`` advertise ``CPU=1``, ``w2`` advertises
``CPU=1, GPU=1`` (torch sees no GPU here, so the learner runs on its CPU). Roles that ask
for a GPU must land on ``w2``; env stepping and rollouts must not.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from dask.utils import key_split
from distributed import Client, get_task_stream

from daskrl import Resources
from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.networks import DiscreteActorCritic
from daskrl.cluster.local import local_cluster
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.distributions import IterationInputs, get_distribution
from daskrl.distributions.base import iterations_per_task
from daskrl.distributions.central_inference import unit_seed
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, place, train

ROOT = Path(__file__).resolve().parents[1]
PPO = load_graph(str(ROOT / "graphs" / "ppo.py"))
A3C = load_graph(str(ROOT / "graphs" / "a3c.py"))


@pytest.fixture(scope="module")
def client():
    cluster = local_cluster([{"CPU": 1}, {"CPU": 1}, {"CPU": 1, "GPU": 1}])
    with Client(cluster) as c:
        yield c
    cluster.close()


def ppo(**overrides):
    settings = {"num_envs": 4, "num_steps": 32, "num_actors": 2, "update_epochs": 2,
                "num_minibatches": 2, **overrides}
    return PPO.build(PPO.Config(**settings))


@contextlib.contextmanager
def placements(client: Client):
    """Record ``{role prefix: {worker names}}`` of the tasks run inside the block."""
    names = {addr: str(w["name"]) for addr, w in scheduler_workers(client).items()}
    where: dict[str, set[str]] = defaultdict(set)
    with get_task_stream(client) as ts:
        yield where
    for rec in ts.data:
        where[key_split(rec["key"])].add(names.get(rec["worker"], rec["worker"]))


def run(client: Client, algo, distribution: str, tmp_path: Path, iterations: int = 2):
    dist = get_distribution(distribution)
    steps = iterations * algo.steps_per_iteration
    settings = RunSettings(out=tmp_path, steps=steps, eval=False, progress=False)
    summary = train(client, algo, dist, settings)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == iterations and summary["distribution"] == dist.name
    return summary, rows


def _last_steps(rows: list[dict[str, str]]) -> int:
    """Env steps of the last iteration."""
    return int(rows[-1]["iteration_env_steps"])


def test_actors_learner_fuses_colocated_rollouts(client, tmp_path):
    algo = ppo(num_actors=4)
    with placements(client) as where:
        _, rows = run(client, algo, "actors-learner", tmp_path)
    assert where["learner"] == {"w2"}
    assert where["rollout"] == {"w0", "w1"}
    # four replicas on two CPU workers: two fused rollout tasks per iteration
    assert sorted(rows[-1]["rollout_workers"].split(";")) == ["0+2@w0", "1+3@w1"]
    # every env steps on past the auto-resets until the batch holds num_steps per env
    assert algo.steps_per_iteration <= _last_steps(rows) < 1.1 * algo.steps_per_iteration


def test_single_fuses_everything_on_the_gpu_worker(client, tmp_path):
    algo = ppo()
    with placements(client) as where:
        _, rows = run(client, algo, "single", tmp_path)
    assert set(where) == {"learner"} and where["learner"] == {"w2"}
    assert rows[-1]["rollout_workers"] == "all@w2"
    assert algo.steps_per_iteration <= _last_steps(rows) < 1.1 * algo.steps_per_iteration


def test_single_runs_several_iterations_per_task(client, tmp_path):
    algo = ppo(num_actors=1)
    dist = get_distribution("single:iterations_per_task=3")
    inputs = dataclasses.replace(_inputs(client, algo, dist, 0), count=3)
    assert iterations_per_task(dist, inputs) == 3
    out = client.compute(dist.iteration(inputs)).result()
    rows = [*out.history, out.metrics]
    assert out.version == 3 and len(rows) == 3
    # each iteration is its own update: its own learning rate (annealed), its own batch
    rates = [r["charts/learning_rate"] for r in rows]
    assert rates[0] > rates[1] > rates[2]
    assert all(int(r["env_steps"]) >= algo.steps_per_iteration for r in rows)
    assert iterations_per_task(dist, dataclasses.replace(inputs, deterministic=True)) == 1


def test_central_inference_places_envs_and_inference(client, tmp_path):
    algo = ppo(num_steps=16)
    with placements(client) as where:
        _, rows = run(client, algo, "central-inference", tmp_path)
    assert where["env"] == {"w0", "w1"}
    assert where["inference"] == {"w2"} and where["learner"] == {"w2"}
    assert "rollout" not in where
    assert rows[-1]["rollout_workers"] == "g0@w2;g1@w2"
    # auto-reset steps carry no transition: extra steps make up for them, as actors do
    assert algo.steps_per_iteration <= _last_steps(rows) < 1.2 * algo.steps_per_iteration


def test_central_inference_matches_local_inference(client):
    """Same weights, observations and seed: the same actions as an actor acting locally."""
    algo = ppo(num_actors=1, num_envs=4, num_steps=24)
    dist = get_distribution("central-inference")
    inputs = _inputs(client, algo, dist, 0)
    batches = client.gather(client.compute(dist.batches(inputs)))
    assert len(batches) == 2
    for g, remote in enumerate(batches):
        ctx = inputs.context("inference", g)
        local = VecEnvActor("CartPole-v1", 2, unit_seed(ctx, g))
        local.set_weights(inputs.learner_in.weights, inputs.learner_in.version)
        mine = local.rollout(algo.num_steps)  # num_steps, then steps until enough are valid
        np.testing.assert_array_equal(remote["obs"], mine["obs"])
        np.testing.assert_array_equal(remote["actions"], mine["actions"])
        for k in ("logp", "values", "advantages", "returns"):
            np.testing.assert_allclose(remote[k], mine[k], rtol=1e-6, atol=1e-6)


def test_data_parallel_replicas_stay_identical(client, tmp_path):
    algo = ppo().with_resources({"learner": Resources(cpu=1)})
    with placements(client) as where:
        _, rows = run(client, algo, "data-parallel", tmp_path, iterations=3)
    assert where["replica"] == {"w0", "w1"}
    assert len(where["allreduce"]) >= 1
    for row in rows:
        assert row["replicas_identical"] == "True", row["replica_digests"]
    digests = {row["replica_digests"] for row in rows}
    assert len(digests) == 3  # the weights changed every iteration


def test_data_parallel_torch_allreduce(client, tmp_path):
    algo = ppo(num_steps=16).with_resources({"learner": Resources(cpu=1)})
    dist = get_distribution("data-parallel:allreduce=torch")
    settings = RunSettings(out=tmp_path, steps=2 * algo.steps_per_iteration, eval=False,
                           progress=False)
    with placements(client) as where:
        train(client, algo, dist, settings)
    assert where["replica"] == {"w0", "w1"} and "allreduce" not in where
    with open(tmp_path / "metrics.csv", newline="") as fh:
        assert all(r["replicas_identical"] == "True" for r in csv.DictReader(fh))


def test_async_applies_every_gradient_once(client, tmp_path):
    algo = A3C.build(A3C.Config(num_envs=4, rollout_steps=4, num_steps=16))
    with placements(client) as where:
        summary, rows = run(client, algo, "async", tmp_path, iterations=3)
    assert where["grad"] == {"w0", "w1"} and where["learner"] == {"w2"}
    version = 0
    for row in rows:
        applied = row["grad_order"].split()
        ids = [a.split("@")[0] for a in applied]
        assert sorted(ids) == sorted(f"{a}.{j}" for a in range(2) for j in range(4))
        used = [int(a.split("@")[1]) for a in applied]
        assert all(version <= u < version + len(applied) for u in used)
        # staleness: the versions applied since the one the gradient was computed with
        staleness = [version + i - u for i, u in enumerate(used)]
        version += len(applied)
        assert int(row["grads_applied"]) == 8 and int(row["weights_version"]) == version
        assert int(row["staleness_max"]) == max(staleness)
        assert float(row["staleness_mean"]) == pytest.approx(sum(staleness) / len(staleness))
    assert summary["env_steps"] > 0


def test_async_needs_two_actors():
    algo = A3C.build(A3C.Config(num_actors=1))
    with pytest.raises(ValueError, match="needs >= 2 actors"):
        get_distribution("async").fragments(algo)


def test_distribution_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown distribution 'nope'.*actors-learner"):
        get_distribution("nope")
    with pytest.raises(ValueError, match="has no option colour.*env_groups"):
        get_distribution("central-inference:colour=red")
    with pytest.raises(ValueError, match="allreduce='mpi'"):
        get_distribution("data-parallel:allreduce=mpi")
    with pytest.raises(ValueError, match="fewer than env_groups=3"):
        get_distribution("central-inference:env_groups=3").batches(
            _fake_inputs(ppo(num_actors=1, num_envs=2)))


def _inputs(client: Client, algo, dist, k: int) -> IterationInputs:
    from daskrl.runtime.driver import initial_output

    learner_in, _, _ = initial_output(algo, RunSettings(out=Path("unused"), seed=3))
    placement = place(DaskBackend(client), algo, dist)
    return IterationInputs(algo, placement, "t" + dist.name[:3], 3, k, 10, learner_in)


def _fake_inputs(algo) -> IterationInputs:
    from daskrl.core.placement import plan_placement

    net = DiscreteActorCritic(4, 2)
    from daskrl.core.algorithm import LearnerOutput

    dist = get_distribution("central-inference")
    placement = plan_placement(dist.fragments(algo), {"a": {"CPU": 1}})
    out = LearnerOutput(0, {}, {k: v.detach() for k, v in net.state_dict().items()})
    return IterationInputs(algo, placement, "fake", 0, 0, 1, out)


def test_flatten_roundtrip():
    from daskrl.distributions.replica import flatten, unflatten_into

    grads = [torch.randn(3, 2), torch.randn(5)]
    flat = flatten(grads)
    target = [torch.zeros(3, 2), torch.zeros(5)]
    unflatten_into(flat, target)
    assert all(torch.equal(a, b) for a, b in zip(grads, target, strict=True))


def test_torch_allreduce_replicas_must_have_workers_of_their_own():
    """Checked when the driver places the fragments (so after a lost worker it waits for a
    replacement), with an error that says what to do."""
    from daskrl.core.placement import Placement

    algo, dist = ppo(num_actors=2), get_distribution("data-parallel:allreduce=torch")
    res = {"replica": Resources(cpu=1), "learner": Resources(cpu=1)}
    dist.check_placement(Placement(res, {"replica": ("a", "b")}), algo)
    with pytest.raises(ValueError, match=r"2 replicas on different workers.*--num-actors"):
        dist.check_placement(Placement(res, {"replica": ("b", "b")}), algo)
    get_distribution("data-parallel").check_placement(Placement(res, {"replica": ("b", "b")}),
                                                      algo)  # Dask's averaging: no such need
