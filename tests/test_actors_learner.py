"""actors-learner: the on-policy fused iteration and the opt-in one-step-stale mode."""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import pytest
from dask.delayed import Delayed, delayed
from distributed import Client, get_task_stream

from daskrl.cluster.local import local_cluster
from daskrl.core.failures import FragmentError
from daskrl.core.script import load_graph
from daskrl.distributions import IterationInputs, get_distribution
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, place, train
from daskrl.runtime.sync_backend import SyncBackend

ROOT = Path(__file__).resolve().parents[1]
PPO = load_graph(str(ROOT / "graphs" / "ppo.py"))

pytestmark = pytest.mark.timeout(300)


def ppo(**overrides):
    settings = {"num_envs": 4, "num_steps": 32, "num_actors": 1, "update_epochs": 2,
                "num_minibatches": 2, **overrides}
    return PPO.build(PPO.Config(**settings))


@pytest.fixture(scope="module")
def client():
    cluster = local_cluster([{"CPU": 1}, {"CPU": 1}])
    with Client(cluster) as c:
        yield c
    cluster.close()


def rows_of(out: Path) -> list[dict[str, str]]:
    with open(out / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def graphs(dist, algo, placement, iterations: int) -> list[Delayed]:
    """The iteration graphs of a run, each taking the previous one's output (lazily)."""
    learner_in: object = delayed(lambda: None)(dask_key_name="start")
    out = []
    for k in range(iterations):
        graph = dist.iteration(IterationInputs(algo, placement, "run", 1, k, iterations,
                                               learner_in))
        out.append(graph)
        learner_in = graph
    return out


def dependencies(graph: Delayed, key_prefix: str) -> set[str]:
    """Keys the task whose key starts with ``key_prefix`` depends on."""
    deps = graph.dask.get_all_dependencies()
    (key,) = [k for k in deps if str(k).startswith(key_prefix)]
    return {str(d) for d in deps[key]}


def one_and_grouped(client, algo, dist, tmp_path, iterations: int, seed: int, chain: int
                    ) -> list[tuple[dict, list[dict[str, str]], list[dict]]]:
    """The same run with one iteration per task (``task_s=0``) and grouped (``task_s=0.5``,
    the chain restarted every ``chain`` tasks): summary, metrics rows, task stream each."""
    results = []
    for task_s in (0.0, 0.5):
        out = tmp_path / f"t{task_s}"
        with get_task_stream(client) as ts:
            summary = train(client, algo, dist, RunSettings(
                out=out, steps=iterations * algo.steps_per_iteration, seed=seed, eval=False,
                progress=False, tensorboard=False, task_s=task_s,
                chain=chain if task_s else 64))
        results.append((summary, rows_of(out), ts.data))
    return results


def test_stale_option_is_checked():
    assert get_distribution("actors-learner:stale=1").stale == 1
    with pytest.raises(ValueError, match="stale"):
        get_distribution("actors-learner:stale=2")


def test_stale_rollouts_take_the_weights_from_two_learner_tasks_back(client):
    algo = ppo()
    dist = get_distribution("actors-learner:stale=1")
    placement = place(DaskBackend(client), algo, dist)
    assert placement.workers["rollout"] != placement.workers["learner"]  # apart: they overlap
    its = graphs(dist, algo, placement, 3)
    # iteration 0 acts with the initial weights; iteration 2 with iteration 0's output,
    # so it does not wait for iteration 1's learner
    assert dependencies(its[0], "rollout-0-it0") == {"start"}
    assert dependencies(its[2], "rollout-0-it2") == {"learner-0-it0-run"}
    assert dependencies(its[2], "learner-0-it2") == {"learner-0-it1-run", "rollout-0-it2-run"}


def test_stale_groups_hand_the_next_batch_to_the_task_after(client):
    algo = ppo()
    dist = get_distribution("actors-learner:stale=1")
    placement = place(DaskBackend(client), algo, dist)
    learner_in: object = delayed(lambda: None)(dask_key_name="start")
    built = []
    for k, count in ((0, 1), (1, 3), (4, 1), (5, 2), (7, 2)):
        graph = dist.iteration(IterationInputs(algo, placement, "run", 1, k, 9, learner_in,
                                               count=count))
        built.append(graph)
        learner_in = graph
    # a group after one iteration per task: its first rollout acts with that task's input
    assert dependencies(built[1], "rollout-0-it1") == {"learner-0-it0-run", "start"}
    assert dependencies(built[1], "learner-0-it1") == {"learner-0-it0-run"}
    assert dependencies(built[1], "join-0-it1") == {"learner-0-it1-run", "rollout-0-it1-run"}
    # the group collected iteration 4's batch: its learner task needs no rollout task
    assert set(map(str, built[2].dask)) - set(map(str, built[1].dask)) == {"learner-0-it4-run"}
    assert built[2].dask["learner-0-it4-run"].func.__name__ == "learn_carried"
    # a group after a single iteration, then a group after a group
    assert dependencies(built[3], "rollout-0-it5") == {"join-0-it1-run", "learner-0-it4-run"}
    assert dependencies(built[4], "rollout-0-it7") == {"join-0-it5-run"}


def test_on_policy_rollouts_take_the_latest_weights(client):
    algo = ppo()
    fused, unfused = (get_distribution(d) for d in ("actors-learner", "actors-learner:fuse=0"))
    placement = place(DaskBackend(client), algo, fused)
    assert placement.workers["rollout"] == placement.workers["learner"]
    # co-located and on-policy: the rollout runs inside the learner task, one task per
    # iteration, which takes the previous iteration's output
    its = graphs(fused, algo, placement, 2)
    assert set(map(str, its[1].dask)) == {"learner-0-it1-run"} | set(map(str, its[0].dask))
    assert dependencies(its[1], "learner-0-it1") == {"learner-0-it0-run"}
    its = graphs(unfused, algo, placement, 2)
    assert dependencies(its[1], "rollout-0-it1") == {"learner-0-it0-run"}


def test_stale_run_trains_with_a_lag_of_one_update(client, tmp_path):
    algo = ppo()
    settings = RunSettings(out=tmp_path, steps=4 * algo.steps_per_iteration, eval=False,
                           progress=False, tensorboard=False)
    summary = train(client, algo, get_distribution("actors-learner:stale=1"), settings)
    rows = rows_of(tmp_path)
    assert [int(r["policy_lag"]) for r in rows] == [0, 1, 1, 1]
    assert summary["placement"]["rollout"] != summary["placement"]["learner"]
    assert summary["env_steps"] >= 4 * algo.steps_per_iteration


def test_on_policy_run_in_one_process_has_no_lag(tmp_path):
    algo = ppo(num_actors=2)
    settings = RunSettings(out=tmp_path, steps=3 * algo.steps_per_iteration, eval=False,
                           progress=False, tensorboard=False)
    summary = train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    rows = rows_of(tmp_path)
    assert [int(r["policy_lag"]) for r in rows] == [0, 0, 0]
    assert all(float(r["rollout_s"]) > 0 and float(r["env_s"]) > 0 for r in rows)
    assert summary["env_steps"] >= 3 * algo.steps_per_iteration


def test_short_iterations_share_tasks_and_train_exactly_as_one_per_task(tmp_path):
    """On one worker the rollouts run in the learner's task and the driver puts several
    iterations in each task: same numbers as one task per iteration, one row each."""
    algo = ppo()
    dist = get_distribution("actors-learner")
    cluster = local_cluster([{"CPU": 1}])
    try:
        with Client(cluster) as c:
            (one, rows1, stream1), (grouped, rows2, stream2) = one_and_grouped(
                c, algo, dist, tmp_path, iterations=24, seed=5, chain=3)
    finally:
        cluster.close()
    tasks1, tasks2 = ({r["key"] for r in stream if str(r["key"]).startswith("learner-")}
                      for stream in (stream1, stream2))
    assert [r["iteration"] for r in rows2] == [str(i) for i in range(1, 25)]
    assert len(tasks1) == 24 and len(tasks2) < 12  # several iterations per task
    assert grouped["weights_sha256"] == one["weights_sha256"]
    assert [r["env_steps"] for r in rows2] == [r["env_steps"] for r in rows1]
    assert [r["losses/policy_loss"] for r in rows2] == [r["losses/policy_loss"] for r in rows1]
    assert grouped["dask_overhead_share"] < one["dask_overhead_share"]


def test_stale_groups_pipe_batches_and_weights_and_train_exactly_as_one_per_task(client,
                                                                                  tmp_path):
    """stale=1 with short iterations: a rollout task and a learner task per group of
    iterations, running at once and passing batches and weights directly. Same numbers
    (each rollout acts with the weights of two updates back) as one task per iteration."""
    dist = get_distribution("actors-learner:stale=1,iterations_per_task=5")
    (one, rows1, stream1), (grouped, rows2, stream2) = one_and_grouped(
        client, ppo(), dist, tmp_path, iterations=16, seed=3, chain=2)
    assert [r["iteration"] for r in rows2] == [str(i) for i in range(1, 17)]
    assert [int(r["policy_lag"]) for r in rows2] == [0] + [1] * 15
    assert grouped["weights_sha256"] == one["weights_sha256"]
    assert [r["losses/policy_loss"] for r in rows2] == [r["losses/policy_loss"] for r in rows1]
    assert [r["episode_return_mean"] for r in rows2] == [r["episode_return_mean"] for r in rows1]

    def spans(stream, role):
        return [(ss["start"], ss["stop"], r["key"]) for r in stream
                if str(r["key"]).startswith(role + "-")
                for ss in r["startstops"] if ss["action"] == "compute"]

    learners, rollouts = spans(stream2, "learner"), spans(stream2, "rollout")
    firsts = sorted(int(key.split("-it")[1].split("-")[0]) for *_, key in learners)
    sizes = {a: b - a for a, b in zip(firsts, [*firsts[1:], 16], strict=True)}
    assert len(spans(stream1, "learner")) == 16 and max(sizes.values()) == 5
    assert len(rollouts) == len(learners)  # one rollout task per group
    # a learner task of several iterations runs while its group's rollout task runs
    for start, stop, key in learners:
        if sizes[int(key.split("-it")[1].split("-")[0])] > 1:
            (twin,) = [(a, b) for a, b, k in rollouts
                       if k == key.replace("learner-", "rollout-")]
            assert twin[0] < stop and start < twin[1], key


@pytest.mark.parametrize("where", ["rollout", "learner"])
def test_a_fragment_raising_in_a_stale_group_stops_its_partner_at_once(client, tmp_path, where):
    """An env crash (or a learner error) inside a piped group: the run stops with that one
    error, saved from the inner fragment call, and the partner task returns at once instead
    of waiting out the group's timeout (its worker is free right after)."""
    base = ppo()

    class Crashing:  # raises on its 4th call: inside the first group of 5 iterations
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def _count(self):
            self.calls += 1
            if self.calls == 4:
                raise RuntimeError(f"{where} crashed at its 4th call")

        def rollout(self, steps):
            if where == "rollout":
                self._count()
            return self.inner.rollout(steps)

        def update(self, batches, progress):
            if where == "learner":
                self._count()
            return self.inner.update(batches, progress)

    algo = dataclasses.replace(
        base, make_actor=lambda seed: Crashing(base.make_actor(seed)),
        make_learner=lambda seed, device: Crashing(base.make_learner(seed, device)))
    dist = get_distribution("actors-learner:stale=1,iterations_per_task=5")
    learner_worker = place(DaskBackend(client), algo, dist).worker("learner", 0)
    start = time.monotonic()
    with get_task_stream(client) as ts, pytest.raises(FragmentError, match="crashed at its 4th"):
        train(client, algo, dist, RunSettings(out=tmp_path, steps=12 * algo.steps_per_iteration,
                                              seed=1, eval=False, progress=False,
                                              tensorboard=False, task_s=5.0, env_retries=0))
    assert time.monotonic() - start < 60
    keys = {str(r["key"]).rsplit("-", 1)[0] for r in ts.data}
    # iteration 0 alone, then a group of iterations 1-5 whose failed task is recorded (its
    # partner's may finish after the driver released it): iteration 3 ran inside the group
    assert {"learner-0-it0", f"{where}-0-it1"} <= keys
    assert not keys & {"learner-0-it3", "rollout-0-it3"}
    (saved,) = (tmp_path / "failures").glob("*.pkl")
    assert saved.name.startswith(f"{where}-0-it3-")  # the inner call: replayable alone
    free = client.submit(lambda: 1, workers=[learner_worker], pure=False)
    assert free.result(timeout=15) == 1
