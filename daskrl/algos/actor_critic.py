"""Actor and learner for actor-critic methods on vector envs (gymnasium's or EnvPool's).

An actor is two halves that distributions may place apart: an :class:`EnvRunner` (the
vector env and its episode bookkeeping; role ``env``; :mod:`daskrl.algos.env_runner`) and a
:class:`RolloutRecorder` (the policy copy, the rollout buffers and GAE; role ``inference``;
:mod:`daskrl.algos.rollout`). :class:`VecEnvActor` runs both in one loop (``actors-learner``,
``single``, ``data-parallel``); ``central-inference`` steps runners on CPU workers and feeds a
recorder on the learner's worker. The learner,
:class:`~daskrl.algos.learner.ActorCriticLearner`, is importable from here too.

The network is chosen from the env's spaces (:func:`~daskrl.algos.networks.actor_critic_for`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from daskrl.algos.env_runner import NO_COST, EnvRunner, StepCost, burn_cpu
from daskrl.algos.evaluation import evaluate_module
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.networks import DiscreteActorCritic, actor_critic_for
from daskrl.algos.normalize import Normalization
from daskrl.algos.rollout import RolloutRecorder
from daskrl.core.envs import Backend, EnvStep, env_spaces

__all__ = ["ActorCriticLearner", "DiscreteActorCritic", "EnvRunner", "EnvStep", "RolloutRecorder",
           "VecEnvActor", "burn_cpu", "evaluate_policy", "policy_module", "spaces_of"]


class VecEnvActor:
    """A vector env and a policy copy that collect rollouts with GAE applied.

    Handles gymnasium's next-step auto-reset: the step after an episode ends is a reset
    step (action ignored, reward 0); it is dropped from the batch, and the value of the
    final observation bootstraps truncated episodes. The env is built on first use, so a
    distribution can take only the policy half (:attr:`recorder`) or make a resized copy
    (:meth:`resized`) without building envs it will not step.

    Examples
    --------
    >>> actor = VecEnvActor("CartPole-v1", num_envs=2, seed=0)
    >>> batch = actor.rollout(16)
    >>> batch["obs"].shape[1], batch["stats"]["env_steps"] >= 32
    (4, True)
    >>> actor.resized(8, seed=1).num_envs
    8
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        step_cost: StepCost = NO_COST,
        normalization: Normalization | None = None,
        backend: Backend = "gymnasium",
    ) -> None:
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.hidden, self.step_cost = hidden, step_cost
        self.normalization, self.backend = normalization or Normalization(), backend
        net = actor_critic_for(*spaces_of(env_id, backend), hidden, self.normalization)
        self.recorder = RolloutRecorder(net, seed, gamma, gae_lambda,
                                        self.normalization.sign_reward)
        self._runner: EnvRunner | None = None

    @property
    def runner(self) -> EnvRunner:
        """The env half, built on first use."""
        if self._runner is None:
            self._runner = EnvRunner(self.env_id, self.num_envs, self.seed, self.step_cost,
                                     self.backend)
        return self._runner

    @property
    def env(self) -> Any:
        """The gymnasium vector env."""
        return self.runner.env

    @property
    def net(self) -> nn.Module:
        """The policy copy (the head :func:`~daskrl.algos.networks.actor_critic_for` chose)."""
        return self.recorder.net

    @property
    def version(self) -> int:
        """Version of the loaded weights (-1 before the first :meth:`set_weights`)."""
        return self.recorder.version

    def resized(self, num_envs: int, seed: int) -> VecEnvActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed`` (fusion, env groups)."""
        rec = self.recorder
        return VecEnvActor(self.env_id, num_envs, seed, self.hidden, rec.gamma, rec.gae_lambda,
                           self.step_cost, self.normalization, self.backend)

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        self.recorder.set_weights(weights, version)

    def env_part(self) -> EnvRunner:
        """The env half (:class:`~daskrl.core.algorithm.SplitActor`; ``central-inference``)."""
        return self.runner

    def inference_part(self) -> RolloutRecorder:
        """The policy half (:class:`~daskrl.core.algorithm.SplitActor`; ``central-inference``)."""
        return self.recorder

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Collect at least ``num_steps * num_envs`` transitions; return them and stats.

        Every env steps ``num_steps`` times, then all envs step again until the valid
        transitions reach ``num_steps * num_envs``: the auto-reset steps that fell inside
        the rollout carry no transition, so without the extra steps a run would end short of
        the env steps it asked for. ``env_steps`` in the stats counts transitions (what the
        batch holds); ``rollout_steps`` the vector-env steps taken; ``env_s`` and
        ``inference_s`` the seconds spent in the envs and in the policy.
        """
        runner, rec = self.runner, self.recorder
        env_s = runner.step_s
        rec.begin(num_steps + max(2, num_steps // 8), runner.obs)
        for _ in range(num_steps):
            rec.record(runner.step(rec.act(runner.obs)))
        missing = num_steps * self.num_envs - int(np.count_nonzero(rec.valid[: rec.t]))
        while missing > 0:
            step = runner.step(rec.act(runner.obs))
            rec.record(step)
            missing -= int(np.count_nonzero(step.valid))
        batch = rec.finish(runner.obs)
        batch["stats"]["env_s"] = runner.step_s - env_s
        return batch

    def close(self) -> None:
        """Close the envs."""
        if self._runner is not None:
            self._runner.close()


_SPACES: dict[tuple[str, str], tuple[gym.Space, gym.Space]] = {}


def spaces_of(env_id: str, backend: Backend = "gymnasium") -> tuple[gym.Space, gym.Space]:
    """Single observation and action spaces of ``env_id`` (probed once per process).

    Examples
    --------
    >>> spaces_of("CartPole-v1")[1]
    Discrete(2)
    """
    if (env_id, backend) not in _SPACES:
        _SPACES[env_id, backend] = env_spaces(env_id, backend)
    return _SPACES[env_id, backend]


def policy_module(env_id: str, hidden: tuple[int, ...], weights: dict[str, torch.Tensor],
                  deterministic: bool = True, normalization: Normalization | None = None
                  ) -> torch.nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``): observations in,
    actions out (normalised by the running statistics in ``weights``, when it has them).

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> pi = policy_module("CartPole-v1", (64, 64), net.state_dict())
    >>> pi(torch.zeros(5, 4)).shape
    torch.Size([5])
    """
    net = actor_critic_for(*spaces_of(env_id), hidden, normalization)
    net.load_state_dict(weights)
    return net.policy(deterministic).eval()


def evaluate_policy(
    env_id: str,
    weights: dict[str, torch.Tensor],
    seed: int,
    episodes: int = 10,
    hidden: tuple[int, ...] = (64, 64),
    normalization: Normalization | None = None,
) -> dict[str, float]:
    """Mean and std of the return of ``episodes`` greedy episodes on a fresh env.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> evaluate_policy("CartPole-v1", net.state_dict(), seed=0, episodes=2)["eval_episodes"]
    2
    """
    obs_space, action_space = env_spaces(env_id)
    net = actor_critic_for(obs_space, action_space, hidden, normalization)
    net.load_state_dict(weights)
    return evaluate_module(env_id, net.policy(True), seed, episodes)
