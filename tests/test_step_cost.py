"""The stand-in simulators: ``--env-step-cost`` burns CPU per env step, ``--env-step-sleep``
sleeps once per vector step (simulators on other hosts stepping an actor's envs at once)."""

from __future__ import annotations

import time

import pytest

from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.env_runner import StepCost
from daskrl.algos.q_actor import QActor
from daskrl.algos.vtrace import SequenceActor
from daskrl.core.script import load_graph


def _timed_rollout(actor, steps: int) -> tuple[float, float]:
    actor.rollout(1)  # the envs are built on first use: not timed
    wall, cpu = time.perf_counter(), time.thread_time()
    actor.rollout(steps)
    return time.perf_counter() - wall, time.thread_time() - cpu


@pytest.mark.parametrize("make", [
    lambda cost, envs: VecEnvActor("CartPole-v1", envs, 0, step_cost=cost),
    lambda cost, envs: SequenceActor("CartPole-v1", envs, 0, step_cost=cost),
    lambda cost, envs: QActor("CartPole-v1", envs, 0, hidden=(16,), step_cost=cost),
], ids=["ppo", "vtrace", "dqn"])
def test_a_sleeping_step_sleeps_once_per_vector_step_and_costs_no_cpu(make, monkeypatch
                                                                     ) -> None:
    steps, sleep = 20, 0.01
    wall, cpu = _timed_rollout(make(StepCost(sleep_s=sleep), 1), steps)
    assert wall >= steps * sleep
    assert cpu < 0.5 * wall, "a sleep must cost no CPU"
    slept: list[float] = []
    real = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (slept.append(s), real(s)))
    actor = make(StepCost(sleep_s=sleep), 16)
    vector_steps = actor.rollout(steps)["stats"].get("rollout_steps", steps)
    # 16 envs step in one sleep, not 16 (simulators on other hosts step at once)
    assert vector_steps >= steps and slept == [sleep] * vector_steps


def test_a_burning_step_costs_cpu_per_env() -> None:
    steps, cost = 10, 0.001
    _, cpu = _timed_rollout(VecEnvActor("CartPole-v1", 4, 0, step_cost=StepCost(cpu_s=cost)),
                            steps)
    assert cpu >= steps * 4 * cost


def test_the_graphs_take_the_sleep_as_a_flag() -> None:
    for name in ("ppo", "impala", "dqn", "sac"):
        graph = load_graph(f"graphs/{name}.py")
        env = {"sac": "Pendulum-v1"}.get(name, "CartPole-v1")
        algo = graph.build(graph.Config(env=env, env_step_sleep=0.002, num_envs=1))
        actor = algo.make_actor(0)
        wall, _ = _timed_rollout(actor, 10)
        assert wall >= 10 * 0.002, name


def test_a_negative_cost_is_one_line_naming_its_flag() -> None:
    with pytest.raises(ValueError, match="--env-step-sleep must be >= 0 seconds, got -1"):
        StepCost(sleep_s=-1)
    with pytest.raises(ValueError, match="--env-step-cost must be >= 0"):
        StepCost(cpu_s=-0.5)
