"""``impala``'s learner on its own clock: batches staged on the learner's device update the
learner exactly as the host batches do; the resident learner loop goes on between learner
tasks, stops a task's worth ahead, restarts from an earlier output, and ends with the run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from distributed import Client

from daskrl.algos.ppo import PPOHyper
from daskrl.algos.vtrace import SequenceActor, VTraceLearner
from daskrl.cluster.local import local_cluster
from daskrl.core.algorithm import LearnerOutput
from daskrl.core.roles import TaskContext
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.core.worker_state import PLUGIN_NAME
from daskrl.distributions.free_running import ActorSpec
from daskrl.distributions.learner_clock import AHEAD, impala_learn
from daskrl.distributions.prefetch import DeviceStager

ROOT = Path(__file__).resolve().parents[1]


def test_a_staged_batch_updates_the_learner_as_the_host_batch_does() -> None:
    actor = SequenceActor("CartPole-v1", num_envs=3, seed=0)
    hp = PPOHyper(update_epochs=1, num_minibatches=1)
    host, staged = (VTraceLearner(4, 2, seed=0, hp=hp) for _ in range(2))
    actor.set_weights(host.weights(), 0)
    batch = actor.rollout(16)
    ready = DeviceStager("cpu")(batch).ready()
    assert ready["stats"] is batch["stats"]
    for key, value in batch.items():
        if isinstance(value, np.ndarray):
            assert torch.is_tensor(ready[key]) and ready[key].device.type == "cpu"
            assert torch.equal(ready[key], torch.as_tensor(value)), key
    for _ in range(2):
        m_host, m_staged = host.update([batch], 0.0), staged.update([ready], 0.0)
    assert m_host == m_staged
    for key, value in host.weights().items():
        assert torch.equal(value, staged.weights()[key]), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_batch_staged_on_cuda_is_the_host_batch() -> None:
    batch = {"obs": np.random.default_rng(0).normal(size=(8, 32, 4)).astype(np.float32),
             "actions": np.arange(256).reshape(8, 32), "stats": {"env_steps": 256}}
    ready = DeviceStager("cuda")(batch).ready()
    assert ready["obs"].is_cuda and ready["stats"] is batch["stats"]
    assert torch.equal(ready["obs"].cpu(), torch.from_numpy(batch["obs"]))
    assert torch.equal(ready["actions"].cpu(), torch.from_numpy(batch["actions"]))


def _clock_position(run: str, dask_worker: Any = None
                    ) -> tuple[int, int, bool, bool] | None:
    """The clock's next iteration, its horizon, and whether its feeder and its learner
    threads are alive."""
    objects = dask_worker.plugins[PLUGIN_NAME].objects
    clock = objects.get(("impala", "clocks"), {}).get(run)
    if clock is None:
        return None
    feeder, learner = (t.is_alive() for t in clock.threads)
    return clock.iteration, clock.horizon, feeder, learner


def _wait(predicate: Any, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class _Rig:
    """A learner worker ``w0`` and two actors on ``w1``: learner tasks of one run of
    ``total`` iterations, submitted as the driver would, and where the run's clock stands."""

    def __init__(self, client: Client, run: str, total: int) -> None:
        impala = load_graph(str(ROOT / "graphs" / "impala.py"))
        self.algo = impala.build(impala.Config(num_actors=2, num_envs=2, num_steps=8))
        learner = self.algo.make_learner(0, "cpu")
        self.start = LearnerOutput(0, learner.state_dict(), learner.weights(), {})
        self.client, self.run, self.total = client, run, total
        names = {str(w["name"]): a for a, w in scheduler_workers(client).items()}
        self.home = names["w0"]

    def learn(self, out: LearnerOutput, first: int, count: int, batch: int = 1
              ) -> LearnerOutput:
        ctx = TaskContext(self.run, 0, 0, first, self.total)
        actors = tuple(ActorSpec("w1", {"CPU": 1}, (a,)) for a in range(2))
        return self.client.submit(impala_learn, ctx, self.algo, out, actors, 2, None, count,
                                  batch, workers=[self.home], pure=False).result(timeout=120)

    def position(self) -> tuple[int, int, bool, bool] | None:
        return self.client.run(_clock_position, self.run, workers=[self.home])[self.home]

    def rollouts(self) -> list[str]:
        return self.client.run_on_scheduler(
            lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks
                                    if str(k).startswith("rollout-")])


def test_the_learner_runs_between_tasks_and_stops_a_bounded_way_ahead() -> None:
    with local_cluster([{"CPU": 1}, {"CPU": 1}], processes=False,
                       dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        rig = _Rig(client, "clocktest", 2 + AHEAD + 6)
        learn, position, total = rig.learn, rig.position, rig.total
        first = learn(rig.start, 0, 2)
        assert first.version == 2 and len(first.history) == 1
        assert [len(m["policy_lags"].split()) for m in [*first.history, first.metrics]] == [2, 2]
        # no task runs now, yet the learner goes on: AHEAD iterations past the task (tasks of
        # 2 iterations are shorter than that), no further
        bound = 2 + AHEAD
        _wait(lambda: (position() or (0,))[0] >= bound, f"the clock stood still: {position()}")
        time.sleep(1.0)
        assert position() == (bound, bound, True, True)
        # its rollouts in flight are the run's tasks to the watchdog and the timeline
        _wait(lambda: rig.rollouts(), "no rollouts in flight")
        assert all(k.endswith("-clocktest") for k in rig.rollouts()), rig.rollouts()
        second = learn(first, 2, 2)
        assert second.version == 4 and second.metrics["learner_ahead"] == 2
        assert second.metrics["learner_worker"] == "w0"
        # a task from an earlier output (a retry) restarts the clock from that output
        retry = learn(first, 2, 2)
        assert retry.version == 4 and retry.metrics["learner_ahead"] == 0
        assert retry.metrics["learner_built"] is False  # the resident learner, reloaded
        last = learn(retry, 4, total - 4)
        assert last.version == total and len(last.history) == total - 5
        # the run's last task closes the clock: its threads end and its rollouts are let go
        _wait(lambda: not any(position()[2:]), f"the clock's threads go on: {position()}")
        _wait(lambda: not rig.rollouts(), "rollouts were left in flight")


def test_a_clock_that_reaches_the_end_of_the_run_ahead_still_serves_its_last_task() -> None:
    # a run no longer than the clock may run ahead: the learner runs to its end before the
    # last task asks; the actors stop there, and that task takes its iterations from the same
    # clock (it used to close itself, and a fresh clock started over from the task's input)
    total = 4
    assert total <= 2 + AHEAD
    with local_cluster([{"CPU": 1}, {"CPU": 1}], processes=False,
                       dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        rig = _Rig(client, "clockend", total)
        position = rig.position
        first = rig.learn(rig.start, 0, 2)
        # the feeder ends there; the learner thread waits for the last task (or IDLE_S)
        _wait(lambda: position() == (total, total, False, True),
              f"the clock went on: {position()}")
        _wait(lambda: not rig.rollouts(), "the actors went on after the run's last iteration")
        last = rig.learn(first, 2, 2)
        assert last.version == total and last.metrics["learner_ahead"] == 2
        _wait(lambda: not any(position()[2:]), f"the clock's threads go on: {position()}")


def test_closing_the_weights_channel_does_not_stall_the_clients_stream() -> None:
    # a reader that has the weights' future and has not yet confirmed it (a rollout on the
    # learner's own worker, between its get and its confirmation) must not hold up what the
    # publisher's client sends next: deleting the variable waited for that confirmation on
    # the client's stream, and the confirmation of a reader on the same client came behind it
    from distributed import Variable

    from daskrl.distributions.free_running import (
        ChannelClosed,
        Publisher,
        channel_name,
        newest_weights,
    )

    with local_cluster([{"CPU": 1}], processes=False,
                       dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        address = next(iter(scheduler_workers(client)))
        publisher = Publisher(client, "stalltest", address)
        publisher.publish_now(1, {"w": torch.zeros(3)})
        record = client.sync(client.scheduler.variable_get, name=channel_name("stalltest"),
                             client=client.id)
        assert record["type"] == "Future"  # its token stays open: no confirmation yet
        publisher.close()
        assert client.submit(abs, -3, pure=False).result(timeout=20) == 3
        assert Variable(channel_name("stalltest", "version"), client=client).get() is None
        with pytest.raises(ChannelClosed, match="closed its weights channel stalltest"):
            client.submit(newest_weights, "run", "stalltest", pure=False).result(timeout=20)
        client._send_to_scheduler({"op": "variable-future-received-confirm",
                                   "name": channel_name("stalltest"), "key": record["value"],
                                   "token": record["token"]})


def test_a_clock_with_batch_2_makes_one_update_of_both_actors_batches() -> None:
    with local_cluster([{"CPU": 1}, {"CPU": 1}], processes=False,
                       dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        rig = _Rig(client, "clockbatch", 3)
        out = rig.learn(rig.start, 0, 3, batch=2)
        rows = [*out.history, out.metrics]
        assert [m["weights_version"] for m in rows] == [1, 2, 3]  # one update per iteration
        assert all(len(m["policy_lags"].split()) == 2 for m in rows)  # both batches in it
