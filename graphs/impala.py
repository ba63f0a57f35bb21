"""IMPALA on gymnasium envs: free-running actors, a V-trace actor-critic learner.

Run: ``daskrl train graphs/impala.py --env CartPole-v1 --steps 500000`` (the graph's
distribution is ``impala``: each actor keeps rollouts in flight, the learner updates on each
batch as it lands and V-trace corrects for the policy lag). Under a synchronous distribution
(``--distribution actors-learner``) the same fragments run with lag 0 or 1.

Discrete actions, or continuous ones (1-D Box: Pendulum-v1, MuJoCo) from a Gaussian policy
whose per-step log-probability is the log-density of the whole action vector (summed over
its dimensions), as V-trace's importance weights need:
``daskrl train graphs/impala.py --env Pendulum-v1``. With Box actions the observations are
normalised and the rewards scaled by running statistics (``--normalize``, as in
``graphs/ppo.py``): the actors act with the statistics that came with their weights and
return their moments, which the learner merges after each update.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch

from daskrl import Algorithm, Resources, setting
from daskrl.algos.actor_critic import evaluate_policy, policy_module
from daskrl.algos.env_runner import StepCost
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.normalize import Normalization
from daskrl.algos.ppo import PPOHyper
from daskrl.algos.vtrace import SequenceActor, VTraceLearner
from daskrl.core.envs import env_spaces
from daskrl.core.sizes import Sizes, transition_bytes


@dataclass
class Config:
    """IMPALA settings; each field is a ``--flag`` of ``daskrl train graphs/impala.py``."""

    env: str = setting("gymnasium env id (flat observations; discrete or 1-D Box actions)",
                       "CartPole-v1")
    num_actors: int = setting("actors (each with its own envs and rollouts in flight)", 2)
    num_envs: int = setting("envs per actor", 8)
    num_steps: int = setting("steps per env per rollout (the V-trace sequence length)", 32)
    update_epochs: int = setting("passes over each update's batches (1: IMPALA's one step; "
                                 "more reuse them as APPO does, giving the learner more work "
                                 "per env step)", 1)
    num_minibatches: int = setting("minibatches each pass is cut into", 1)
    learning_rate: float = setting("Adam learning rate", 1e-3)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", True)
    gamma: float = setting("discount factor", 0.99)
    rho_bar: float = setting("V-trace truncation of the importance weights (rho-bar)", 1.0)
    c_bar: float = setting("V-trace truncation of the traces (c-bar)", 1.0)
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
        "running observation normalisation and reward scaling (auto: on for Box actions, as "
        "graphs/ppo.py; the statistics travel with the weights)", "auto")

    def normalization(self, action_space: gym.Space) -> Normalization:
        """Running statistics kept for ``action_space`` (``--normalize``)."""
        on = (self.normalize == "on"
              or (self.normalize == "auto" and isinstance(action_space, gym.spaces.Box)))
        return Normalization(obs=on, reward=on)

    def hyper(self) -> PPOHyper:
        """``update_epochs`` x ``num_minibatches`` gradient steps per update (IMPALA's one by
        default), with these loss and optimiser settings."""
        return PPOHyper(update_epochs=self.update_epochs, num_minibatches=self.num_minibatches,
                        learning_rate=self.learning_rate,
                        anneal_lr=self.anneal_lr, ent_coef=self.ent_coef, vf_coef=self.vf_coef,
                        max_grad_norm=self.max_grad_norm, norm_adv=False)


def make_actor(config: Config, norm: Normalization, seed: int) -> SequenceActor:
    """Role ``rollout``: one actor's envs and policy copy, recording sequences."""
    return SequenceActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                         StepCost(config.env_step_cost, config.env_step_sleep), norm)


def make_learner(config: Config, spaces: tuple[gym.Space, gym.Space], seed: int, device: str
                 ) -> VTraceLearner:
    """Role ``learner``: the network (the head for ``spaces``) and optimiser, on ``device``."""
    hidden = (config.hidden,) * 2
    return VTraceLearner(0, 0, seed, hidden, config.hyper(), device, config.compile,
                         rho_bar=config.rho_bar, c_bar=config.c_bar, loss="actor-critic",
                         replicas=config.num_actors,
                         network=partial(actor_critic_for, *spaces, hidden,
                                         config.normalization(spaces[1])))


def evaluate(config: Config, norm: Normalization, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes on fresh envs."""
    return evaluate_policy(config.env, weights, seed, config.eval_episodes, (config.hidden,) * 2,
                           norm)


def build(config: Config) -> Algorithm:
    """IMPALA as an :class:`~daskrl.Algorithm`; its default distribution, ``impala``, keeps
    the actors running while the learner updates."""
    for flag, value in (("--rho-bar", config.rho_bar), ("--c-bar", config.c_bar),
                        ("--update-epochs", config.update_epochs),
                        ("--num-minibatches", config.num_minibatches)):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    spaces = env_spaces(config.env)  # checks the env id and reads its spaces
    hidden = (config.hidden,) * 2
    norm = config.normalization(spaces[1])
    with torch.device("meta"):  # shapes only: no memory, no draw from torch's generator
        net = actor_critic_for(*spaces, hidden, norm)  # refuses spaces no head serves
    if not net.action_shape and (norm.obs or norm.reward):
        raise ValueError("--normalize on serves Box actions (the discrete heads keep no "
                         "running statistics): drop --normalize on for this env")
    if len(spaces[0].shape) != 1:
        raise ValueError(f"--env {config.env}: observations of shape {spaces[0].shape}; "
                         "graphs/impala.py serves flat observations (use graphs/ppo.py for "
                         "images)")
    obs_dim = int(np.prod(spaces[0].shape))
    params = sum(p.numel() for p in net.parameters())
    action_bytes = 4 * int(np.prod(net.action_shape)) if net.action_shape else 8
    return Algorithm(
        name="impala",
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
        sizes=Sizes(transition_bytes(obs_dim, action_bytes=action_bytes), params),
        capabilities={"vtrace", "gradients", "resizable-actor"},
        distribution="impala",
    )
