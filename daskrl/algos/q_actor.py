"""Role ``rollout`` of DQN and Ape-X: envs and an epsilon-greedy copy of the Q-network.

The exploration rate is the learner's (a buffer of :class:`~daskrl.algos.qnet.QNetwork` that
travels with the weights) or, for Ape-X, this actor's own rung of the epsilon ladder.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.qnet import QNetwork, discrete_dims, td_errors
from daskrl.algos.transitions import TransitionCollector

Batch = dict[str, Any]


class QActor:
    """Role ``rollout`` for DQN: envs and an epsilon-greedy Q-network copy.

    Parameters
    ----------
    env_id, num_envs, seed : str, int, int
        The envs.
    hidden : tuple of int
        The Q-network's hidden layers.
    n_step, gamma : int, float
        Transitions fold ``n_step`` env steps, discounted by ``gamma``.
    epsilon : float, optional
        A fixed exploration rate (Ape-X's per-actor ladder); None: the learner's, read from
        the weights.
    priorities : bool
        Add each transition's initial priority, ``|n-step TD error|`` under this actor's
        weights (Ape-X), as ``priorities``.
    step_cost : StepCost
        What each env step costs beyond the env's own work (a stand-in simulator).

    Examples
    --------
    >>> actor = QActor("CartPole-v1", 2, seed=0, hidden=(16,), priorities=True)
    >>> batch = actor.rollout(8)
    >>> batch["obs"].shape[1], batch["priorities"].shape == batch["rewards"].shape
    (4, True)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (256, 256),
                 n_step: int = 1, gamma: float = 0.99, epsilon: float | None = None,
                 priorities: bool = False, step_cost: StepCost = NO_COST) -> None:
        self.env_id, self.num_envs, self.seed, self.hidden = env_id, num_envs, seed, hidden
        self.epsilon, self.priorities = epsilon, priorities
        self.collector = TransitionCollector(env_id, num_envs, seed, n_step, gamma, step_cost)
        self.net = QNetwork(*discrete_dims(env_id), hidden)
        self.rng = np.random.default_rng(seed)
        self.version = -1

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version

    def explore(self, epsilon: float) -> None:
        """Act with ``epsilon`` (Ape-X's per-actor rate) and add initial priorities."""
        self.epsilon, self.priorities = float(epsilon), True

    def resized(self, num_envs: int, seed: int) -> QActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        col = self.collector
        return QActor(self.env_id, num_envs, seed, self.hidden, col.n_step, col.gamma,
                      self.epsilon, self.priorities, col.step_cost)

    def rollout(self, num_steps: int) -> Batch:
        """``num_steps`` epsilon-greedy steps of every env, as n-step transitions."""
        eps = float(self.net.epsilon) if self.epsilon is None else self.epsilon

        def choose(obs: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                greedy = self.net(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
            explore = self.rng.random(len(obs)) < eps
            return np.where(explore, self.rng.integers(0, self.net.q[-1].out_features,
                                                       len(obs)), greedy)

        batch = self.collector.collect(num_steps, choose)
        if self.priorities:
            batch["priorities"] = td_errors(self.net, self.net, batch, double_q=True)
        batch["stats"].update(epsilon=eps, policy_version=self.version)
        return batch

    def close(self) -> None:
        """Close the envs."""
        self.collector.close()
