"""A3C on gymnasium envs: actors send gradients of their own rollouts, the learner applies each
as it arrives.

Run: ``daskrl train graphs/a3c.py --steps 500000`` (the graph's distribution is ``async``).
Under a synchronous distribution (e.g. ``--distribution actors-learner``) the same fragments
run synchronous A2C: one step per iteration on all actors' batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from daskrl import Algorithm, Resources, setting
from daskrl.algos.a2c import A2CActor, A2CHyper, A2CLearner
from daskrl.algos.actor_critic import evaluate_policy, policy_module
from daskrl.algos.networks import actor_critic_for
from daskrl.core.envs import env_spaces


@dataclass
class Config:
    """A3C settings; each field is a ``--flag`` of ``daskrl train graphs/a3c.py``."""

    MID_RUN: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "vf_coef",
                                         "max_grad_norm")
    """Settings ``daskrl sweep --pbt`` may change mid-run: the learner, rebuilt from a
    checkpoint, takes them as they are (the learning rate is set at every update)."""

    env: str = setting("gymnasium env id (discrete or Box actions, flat observations)",
                       "CartPole-v1")
    num_actors: int = setting("gradient actors (each with its own envs)", 2)
    num_envs: int = setting("envs per actor", 8)
    rollout_steps: int = setting("steps per env behind each gradient (n-step returns)", 8)
    num_steps: int = setting("steps per env per actor per iteration (a multiple of rollout_steps)",
                           64)
    learning_rate: float = setting("Adam learning rate", 1e-3)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", True)
    gamma: float = setting("discount factor", 0.99)
    gae_lambda: float = setting("GAE lambda (1.0: plain n-step returns)", 1.0)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float = setting("value loss coefficient", 0.5)
    max_grad_norm: float = setting("gradient-norm clip", 0.5)
    norm_adv: bool = setting("normalise advantages per gradient", False)
    hidden: int = setting("hidden units in each of the two layers", 64)
    eval_episodes: int = setting("greedy episodes in the final evaluation", 10)
    compile: bool = setting(
        "compile each whole gradient step (loss, gradients, clip and Adam step) with "
        "torch.compile: the first step compiles (seconds; inductor's on-disk cache in "
        "$TORCHINDUCTOR_CACHE_DIR spares later runs most of it)", False)

    def hyper(self) -> A2CHyper:
        """The loss and optimiser settings."""
        return A2CHyper(learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
                        ent_coef=self.ent_coef, vf_coef=self.vf_coef,
                        max_grad_norm=self.max_grad_norm, norm_adv=self.norm_adv)


def make_actor(config: Config, seed: int) -> A2CActor:
    """Role ``rollout``/``grad``: one actor's envs and policy copy."""
    return A2CActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                         config.gae_lambda, rollout_steps=config.rollout_steps, hp=config.hyper())


def make_learner(config: Config, spaces: tuple, seed: int, device: str) -> A2CLearner:
    """Role ``learner``: the network (the head for ``spaces``) and optimiser, on ``device``."""
    network = partial(actor_critic_for, *spaces, (config.hidden,) * 2)
    return A2CLearner(0, 0, seed, (config.hidden,) * 2, config.hyper(), device,
                      compile=config.compile, network=network)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes on fresh envs."""
    return evaluate_policy(config.env, weights, seed, config.eval_episodes, (config.hidden,) * 2)


def build(config: Config) -> Algorithm:
    """A3C as an :class:`~daskrl.Algorithm`; its default distribution, ``async``, applies its
    gradients as they arrive."""
    if config.num_steps % config.rollout_steps:
        raise ValueError(f"--num-steps {config.num_steps} must be a multiple of "
                         f"--rollout-steps {config.rollout_steps}")
    spaces = env_spaces(config.env)  # checks the env id and reads its spaces
    with torch.device("meta"):  # shapes only: no memory, no draw from torch's generator
        actor_critic_for(*spaces)  # refuses spaces no head serves, in one line
    return Algorithm(
        name="a3c",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config, spaces),
        evaluate=partial(evaluate, config),
        make_policy=partial(policy_module, config.env, (config.hidden,) * 2),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
        },
        env_id=config.env,
        # A2CActor is a VecEnvActor, A2CLearner an autograd learner: every distribution
        capabilities={"gradient-actor", "gradients", "resizable-actor", "split-actor"},
        distribution="async",
    )
