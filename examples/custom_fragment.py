"""A graph script of your own: PPO on Acrobot with two rollout replicas and a custom resource.

Run: ``daskrl train examples/custom_fragment.py --steps 100000``. The learner asks for a
GPU and falls back to a CPU; rollouts ask for one CPU slot each. Change them on the command
line, e.g. ``--resources rollout=CPU:1,fast_env:1`` for workers started with
``dask worker --resources "CPU=1,fast_env=1"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from daskrl import Algorithm, Resources
from daskrl.algos.actor_critic import ActorCriticLearner, VecEnvActor, evaluate_policy


@dataclass
class Config:
    """Settings of this graph (each is a --flag)."""

    env: str = "Acrobot-v1"
    num_envs: int = 8
    num_steps: int = 64
    num_actors: int = 2


def make_actor(config: Config, seed: int) -> VecEnvActor:
    """Role ``rollout``: envs plus a policy copy."""
    return VecEnvActor(config.env, config.num_envs, seed)


def make_learner(seed: int, device: str) -> ActorCriticLearner:
    """Role ``learner``: Acrobot has 6 observation values and 3 actions."""
    return ActorCriticLearner(6, 3, seed, device=device)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes."""
    return evaluate_policy(config.env, weights, seed, episodes=5)


def build(config: Config) -> Algorithm:
    """The algorithm; ``daskrl train`` hands it to the chosen distribution."""
    return Algorithm(
        name="ppo-acrobot",
        make_actor=partial(make_actor, config),
        make_learner=make_learner,
        evaluate=partial(evaluate, config),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={"rollout": Resources(cpu=1),
                   "learner": Resources(gpu=1, fallback=Resources(cpu=1))},
        env_id=config.env,
        # what VecEnvActor and ActorCriticLearner offer: every synchronous distribution
        capabilities={"gradients", "resizable-actor", "split-actor"},
    )
