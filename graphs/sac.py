"""SAC on gymnasium envs with continuous (Box) actions: twin Q, a tanh-squashed Gaussian policy,
automatic entropy tuning; CleanRL's flag names. The replay lives with the learner, so
``single`` and ``actors-learner`` serve it.

Run: ``daskrl train graphs/sac.py --env Pendulum-v1 --steps 20000``. The defaults are RL Zoo's
tuned Pendulum-v1 settings for Stable-Baselines3's SAC.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np

from daskrl import Algorithm, Resources, setting
from daskrl.algos.box_control import box_dims
from daskrl.algos.env_runner import StepCost
from daskrl.algos.evaluation import evaluate_module
from daskrl.algos.replay_buffers import transition_nbytes
from daskrl.algos.sac import SACActor, SACHyper, SACLearner, sac_policy
from daskrl.core.sizes import Sizes, mlp_params


@dataclass
class Config:
    """SAC settings; each field is a ``--flag`` of ``daskrl train graphs/sac.py``."""

    env: str = setting("gymnasium env id (continuous actions, flat observations)",
                       "Pendulum-v1")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 1)
    num_steps: int = setting("steps per env per rollout (an iteration)", 200)
    buffer_size: int = setting("replay capacity in transitions", 1_000_000)
    gamma: float = setting("discount factor", 0.99)
    tau: float = setting("target networks' Polyak rate", 0.005)
    batch_size: int = setting("transitions per gradient step", 256)
    learning_starts: int = setting("transitions in the replay before learning starts (until "
                                   "then the actors act uniformly at random)", 100)
    policy_lr: float = setting("actor's Adam learning rate", 1e-3)
    q_lr: float = setting("critics' (and the temperature's) Adam learning rate", 1e-3)
    train_frequency: int = setting("env steps per gradient step", 1)
    policy_frequency: int = setting("critic steps per (delayed) batch of actor steps", 1)
    target_network_frequency: int = setting("gradient steps between target updates", 1)
    alpha: float = setting("entropy temperature when --no-autotune", 0.2)
    autotune: bool = setting("tune the entropy temperature towards -dim(actions)", True)
    temperature_loss: Literal["alpha", "log_alpha"] = setting(
        "what the temperature's loss multiplies: alpha (CleanRL) or log_alpha (the SAC "
        "authors' code, SB3: the temperature moves as fast in log space when it is small)",
        "alpha")
    n_step: int = setting("env steps folded into each transition (n-step returns)", 1)
    hidden: int = setting("hidden units in each of the two ReLU layers", 256)
    save_replay: bool = setting("checkpoint the replay's contents (off: a resumed run starts "
                                "with an empty buffer)", True)
    eval_episodes: int = setting("deterministic episodes in the final evaluation", 10)
    compile: bool = setting(
        "compile each whole gradient step (the critics' step, and the actor's with the "
        "temperature's: targets, losses, their gradients and the Adam steps) with "
        "torch.compile: the first steps compile (tens of seconds; inductor's on-disk cache "
        "in $TORCHINDUCTOR_CACHE_DIR spares later runs most of it)", False)
    env_step_cost: float = setting("extra CPU seconds each env step burns (a stand-in for an "
                                   "expensive simulator)", 0.0)
    env_step_sleep: float = setting("wall seconds each step of an actor's envs sleeps, using no "
                                    "CPU (a stand-in for simulators on other hosts)", 0.0)

    def hyper(self) -> SACHyper:
        """The learner's settings."""
        return SACHyper(
            policy_lr=self.policy_lr, q_lr=self.q_lr, batch_size=self.batch_size,
            buffer_size=self.buffer_size, learning_starts=self.learning_starts, tau=self.tau,
            train_frequency=self.train_frequency, policy_frequency=self.policy_frequency,
            target_network_frequency=self.target_network_frequency, autotune=self.autotune,
            alpha=self.alpha, temperature_loss=self.temperature_loss,
            save_replay=self.save_replay, compile=self.compile)


def make_learner(config: Config, seed: int, device: str) -> SACLearner:
    """Role ``learner``: actor, critics, temperature, optimisers and the resident replay."""
    obs_dim, low, high = box_dims(config.env, "SAC")
    return SACLearner(obs_dim, low, high, seed, (config.hidden,) * 2, config.hyper(), device)


def make_actor(config: Config, seed: int) -> SACActor:
    """Role ``rollout``: one replica's envs and policy copy."""
    return SACActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.n_step,
                    config.gamma, StepCost(config.env_step_cost, config.env_step_sleep))


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: episodes of the squashed mean action on fresh envs."""
    policy = sac_policy(config.env, (config.hidden,) * 2, weights, deterministic=True)
    return evaluate_module(config.env, policy, seed, config.eval_episodes)


def build(config: Config) -> Algorithm:
    """SAC as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    obs_dim, low, _ = box_dims(config.env, "SAC")  # one line when the actions are not a Box
    act_dim, hidden = len(low), (config.hidden,) * 2
    per = transition_nbytes((obs_dim,), np.float32, (act_dim,), np.float32, False)
    params = (mlp_params(obs_dim, 2 * act_dim, hidden)
              + 4 * mlp_params(obs_dim + act_dim, 1, hidden))  # actor, twin Q and targets
    return Algorithm(
        name="sac",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config),
        evaluate=partial(evaluate, config),
        make_policy=partial(sac_policy, config.env, hidden),
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
