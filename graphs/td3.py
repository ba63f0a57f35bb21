"""TD3 on gymnasium envs with continuous (Box) actions: a deterministic actor, twin critics,
target policy smoothing and delayed actor and target updates; CleanRL's flag names. The
replay lives with the learner, so ``single`` and ``actors-learner`` serve it.

Run: ``daskrl train graphs/td3.py --env Pendulum-v1 --steps 20000``. The defaults are RL
Zoo's tuned Pendulum-v1 settings for Stable-Baselines3's TD3 (which its MuJoCo settings share
but for ``--gamma 0.99`` and ``--buffer-size 1000000``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from daskrl import Algorithm, Resources, setting
from daskrl.algos.box_control import box_dims
from daskrl.algos.env_runner import StepCost
from daskrl.algos.evaluation import evaluate_module
from daskrl.algos.replay_buffers import transition_nbytes
from daskrl.algos.td3 import TD3Actor, TD3Hyper, TD3Learner, td3_policy
from daskrl.core.sizes import Sizes, mlp_params


@dataclass
class Config:
    """TD3 settings; each field is a ``--flag`` of ``daskrl train graphs/td3.py``."""

    env: str = setting("gymnasium env id (continuous actions, flat observations)",
                       "Pendulum-v1")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 1)
    num_steps: int = setting("steps per env per rollout (an iteration)", 200)
    buffer_size: int = setting("replay capacity in transitions", 200_000)
    gamma: float = setting("discount factor", 0.98)
    tau: float = setting("target networks' Polyak rate", 0.005)
    batch_size: int = setting("transitions per gradient step", 256)
    learning_starts: int = setting("transitions in the replay before learning starts (until "
                                   "then the actors act uniformly at random)", 10_000)
    learning_rate: float = setting("Adam learning rate of the actor and the critics", 1e-3)
    exploration_noise: float = setting("std of the actors' Gaussian action noise, in units "
                                       "of half the action range", 0.1)
    policy_noise: float = setting("std of the noise on the target actor's actions (target "
                                  "policy smoothing), in units of half the action range", 0.2)
    noise_clip: float = setting("bound of that noise, in the same units", 0.5)
    policy_frequency: int = setting("critic steps per (delayed) actor and target update", 2)
    train_frequency: int = setting("env steps per gradient step", 1)
    n_step: int = setting("env steps folded into each transition (n-step returns)", 1)
    hidden: tuple[int, ...] = setting("hidden units of each ReLU layer of the actor and of "
                                      "each critic", (400, 300))
    save_replay: bool = setting("checkpoint the replay's contents (off: a resumed run starts "
                                "with an empty buffer)", True)
    eval_episodes: int = setting("episodes of the actor's action in the final evaluation", 10)
    compile: bool = setting(
        "compile each whole gradient step (the critics' step and the actor's: the smoothed "
        "target, losses, their gradients and the Adam steps) with torch.compile: the first "
        "steps compile (tens of seconds; inductor's on-disk cache in $TORCHINDUCTOR_CACHE_DIR "
        "spares later runs most of it)", False)
    env_step_cost: float = setting("extra CPU seconds each env step burns (a stand-in for an "
                                   "expensive simulator)", 0.0)
    env_step_sleep: float = setting("wall seconds each step of an actor's envs sleeps, using no "
                                    "CPU (a stand-in for simulators on other hosts)", 0.0)

    def hyper(self) -> TD3Hyper:
        """The learner's settings."""
        return TD3Hyper(
            learning_rate=self.learning_rate, batch_size=self.batch_size,
            buffer_size=self.buffer_size, learning_starts=self.learning_starts, tau=self.tau,
            policy_noise=self.policy_noise, noise_clip=self.noise_clip,
            policy_frequency=self.policy_frequency, train_frequency=self.train_frequency,
            save_replay=self.save_replay, compile=self.compile)


def make_learner(config: Config, seed: int, device: str) -> TD3Learner:
    """Role ``learner``: actor, critics, their targets, optimisers and the resident replay."""
    obs_dim, low, high = box_dims(config.env, "TD3")
    return TD3Learner(obs_dim, low, high, seed, tuple(config.hidden), config.hyper(), device)


def make_actor(config: Config, seed: int) -> TD3Actor:
    """Role ``rollout``: one replica's envs and actor copy."""
    return TD3Actor(config.env, config.num_envs, seed, tuple(config.hidden), config.n_step,
                    config.gamma, StepCost(config.env_step_cost, config.env_step_sleep),
                    config.exploration_noise)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: episodes of the actor's action (no noise) on fresh envs."""
    policy = td3_policy(config.env, tuple(config.hidden), weights)
    return evaluate_module(config.env, policy, seed, config.eval_episodes)


def build(config: Config) -> Algorithm:
    """TD3 as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    obs_dim, low, _ = box_dims(config.env, "TD3")  # one line when the actions are not a Box
    act_dim, hidden = len(low), tuple(config.hidden)
    per = transition_nbytes((obs_dim,), np.float32, (act_dim,), np.float32, False)
    params = (2 * mlp_params(obs_dim, act_dim, hidden)  # actor and its target
              + 4 * mlp_params(obs_dim + act_dim, 1, hidden))  # twin Q and targets
    return Algorithm(
        name="td3",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config),
        evaluate=partial(evaluate, config),
        make_policy=partial(td3_policy, config.env, hidden),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
        },
        env_id=config.env,
        sizes=Sizes(per, params, replay_bytes=config.buffer_size * per),
        capabilities={"resizable-actor", "light-state"},
        distribution="single",
    )
