"""PPO on gymnasium envs (CleanRL-equivalent maths), as fragments any distribution can place.

Run: ``daskrl train graphs/ppo.py --env CartPole-v1 --steps 500000``.

The policy head follows the env's spaces: categorical for discrete actions, Gaussian (with
observation normalisation and reward scaling, CleanRL's ``ppo_continuous_action``) for a Box
of actions, the Nature-DQN CNN for Atari frames.

``--vtrace`` (flat observations) keeps the same heads and running statistics: the actors
record sequences with the acting policy's log-probability of each step's whole action (a
Gaussian's summed over the action dimensions) and the learner takes V-trace targets under its
own, e.g. ``daskrl train graphs/ppo.py --env Hopper-v5 --vtrace --distribution
actors-learner:stale=1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch

from daskrl import Algorithm, Resources, setting
from daskrl.algos.actor_critic import (
    ActorCriticLearner,
    VecEnvActor,
    evaluate_policy,
    policy_module,
)
from daskrl.algos.env_runner import StepCost
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.normalize import Normalization
from daskrl.algos.ppo import PPOHyper
from daskrl.algos.vtrace import SequenceActor, VTraceLearner
from daskrl.core.envs import env_spaces, is_atari
from daskrl.core.sizes import Sizes, transition_bytes


@dataclass
class Config:
    """PPO settings; each field is a ``--flag`` of ``daskrl train graphs/ppo.py``."""

    MID_RUN: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "clip_coef", "vf_coef",
                                         "max_grad_norm")
    """Settings ``daskrl sweep --pbt`` may change mid-run: the learner, rebuilt from a
    checkpoint, takes them as they are (the learning rate is set at every update)."""

    env: str = setting("gymnasium env id: discrete or Box actions, flat observations or Atari "
                       "frames", "CartPole-v1")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 8)
    num_steps: int = setting("steps per env per rollout", 128)
    update_epochs: int = setting("passes over each batch", 4)
    num_minibatches: int = setting("minibatches per epoch", 4)
    minibatch_size: int = setting("minibatch size; overrides --num-minibatches when > 0", 0)
    learning_rate: float = setting("Adam learning rate", 2.5e-4)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", True)
    gamma: float = setting("discount factor", 0.99)
    gae_lambda: float = setting("GAE lambda", 0.95)
    clip_coef: float = setting("surrogate clipping coefficient", 0.2)
    clip_vloss: bool = setting("clip the value loss around the old values like the surrogate",
                               True)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float = setting("value loss coefficient", 0.5)
    max_grad_norm: float = setting("gradient-norm clip", 0.5)
    hidden: int = setting("hidden units in each of the two layers", 64)
    eval_episodes: int = setting("greedy episodes in the final evaluation", 10)
    compile: bool = setting(
        "compile each whole gradient step (loss, gradients, clip and Adam step) with "
        "torch.compile: the first step compiles (seconds; inductor's on-disk cache in "
        "$TORCHINDUCTOR_CACHE_DIR spares later runs most of it)", False)
    env_step_cost: float = setting("extra CPU seconds each env step burns (a stand-in for an "
                                   "expensive simulator)", 0.0)
    env_step_sleep: float = setting("wall seconds each step of an actor's envs sleeps, using no "
                                    "CPU (a stand-in for simulators on other hosts)", 0.0)
    normalize: Literal["auto", "on", "off"] = setting(
        "running observation normalisation and reward scaling (statistics merged every "
        "iteration, saved with the weights); auto: on for Box actions", "auto")
    env_backend: Literal["gymnasium", "envpool"] = setting(
        "who steps the envs: gymnasium's vector envs, or EnvPool's C++ pool", "gymnasium")
    vtrace: bool = setting("correct for the policy lag with V-trace: actors record sequences, "
                           "the learner recomputes advantages and value targets (for stale "
                           "or free-running actors, e.g. --distribution impala)", False)

    def normalization(self, action_space: gym.Space) -> Normalization:
        """Running statistics kept for ``action_space`` (``--normalize``); Atari rewards are
        clipped to their sign."""
        on = (self.normalize == "on"
              or (self.normalize == "auto" and isinstance(action_space, gym.spaces.Box)))
        return Normalization(obs=on, reward=on, sign_reward=is_atari(self.env))

    def hyper(self) -> PPOHyper:
        """The update settings, with ``--minibatch-size`` turned into a minibatch count."""
        batch = self.num_actors * self.num_envs * self.num_steps
        num_mb = max(1, batch // self.minibatch_size) if self.minibatch_size > 0 else (
            self.num_minibatches)
        return PPOHyper(
            update_epochs=self.update_epochs, num_minibatches=num_mb,
            learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
            clip_coef=self.clip_coef, clip_vloss=self.clip_vloss, ent_coef=self.ent_coef,
            vf_coef=self.vf_coef,
            max_grad_norm=self.max_grad_norm,
        )


def make_learner(config: Config, spaces: tuple[gym.Space, gym.Space], seed: int, device: str
                 ) -> ActorCriticLearner:
    """Role ``learner``: the network (the head for ``spaces``) and optimiser, on ``device``."""
    hidden = (config.hidden,) * 2
    network = partial(actor_critic_for, *spaces, hidden, config.normalization(spaces[1]))
    if config.vtrace:  # the same head: categorical, or Gaussian with its running statistics
        return VTraceLearner(0, 0, seed, hidden, config.hyper(), device, config.compile,
                             loss="ppo", network=network, replicas=config.num_actors)
    return ActorCriticLearner(0, 0, seed, hidden, config.hyper(), device,
                              compile=config.compile, network=network,
                              replicas=config.num_actors)


def make_actor(config: Config, norm: Normalization, seed: int) -> VecEnvActor | SequenceActor:
    """Role ``rollout``: one replica's envs and policy copy."""
    cost = StepCost(config.env_step_cost, config.env_step_sleep)
    if config.vtrace:
        return SequenceActor(config.env, config.num_envs, seed, (config.hidden,) * 2,
                             config.gamma, cost, norm)
    return VecEnvActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                       config.gae_lambda, cost, norm, config.env_backend)


def evaluate(config: Config, norm: Normalization, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes on fresh envs."""
    return evaluate_policy(config.env, weights, seed, config.eval_episodes, (config.hidden,) * 2,
                           norm)


def build(config: Config) -> Algorithm:
    """PPO as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    spaces = env_spaces(config.env, config.env_backend)  # checks the env id, reads its spaces
    norm = config.normalization(spaces[1])
    hidden = (config.hidden,) * 2
    with torch.device("meta"):  # shapes only: no memory, no draw from torch's generator
        net = actor_critic_for(*spaces, hidden, norm)  # refuses spaces no head serves
    if config.vtrace and len(spaces[0].shape) != 1:
        raise ValueError(f"--vtrace serves flat observations, not {config.env}'s of shape "
                         f"{spaces[0].shape}: drop --vtrace for this env")
    if config.vtrace and not net.action_shape and (norm.obs or norm.reward):
        raise ValueError("--vtrace with --normalize on serves Box actions (the discrete heads "
                         "keep no running statistics): drop --normalize on for this env")
    if config.vtrace and config.env_backend != "gymnasium":
        raise ValueError("--vtrace steps gymnasium's vector envs: drop --env-backend "
                         f"{config.env_backend} or --vtrace")
    params = sum(p.numel() for p in net.parameters())
    obs_space = spaces[0]
    image = obs_space.dtype == np.uint8  # frames travel as uint8
    step_bytes = transition_bytes(int(np.prod(obs_space.shape)), obs_itemsize=1 if image else 4,
                                  action_bytes=4 * int(np.prod(net.action_shape))
                                  if net.action_shape else 8)  # float32 vector, or int64
    return Algorithm(
        name="ppo",
        make_actor=partial(make_actor, config, norm),
        make_learner=partial(make_learner, config, spaces),
        evaluate=partial(evaluate, config, norm),
        make_policy=partial(policy_module, config.env, hidden, normalization=norm),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
        },
        env_id=config.env,
        sizes=Sizes(step_bytes, params),  # for the memory check at launch
        capabilities={"gradients", "resizable-actor",  # VecEnvActor or SequenceActor, PPO
                      "vtrace" if config.vtrace else "split-actor"},
    )
