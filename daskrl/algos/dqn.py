"""DQN (double Q, target network, n-step, Huber loss): one import for its parts.

- :mod:`daskrl.algos.qnet`: the Q-network, its epsilon-greedy policy and the Q-learning
  target (:class:`QNetwork`, :func:`q_policy`, :func:`td_errors`).
- :mod:`daskrl.algos.transitions`: envs stepped into n-step transitions
  (:class:`TransitionCollector`, shared with SAC).
- :mod:`daskrl.algos.q_actor`: role ``rollout``, epsilon-greedy (:class:`QActor`); for Ape-X
  it also computes the transitions' initial priorities.
- :mod:`daskrl.algos.dqn_learner`: role ``learner`` with the replay resident in it under
  ``single`` and ``actors-learner`` (:class:`DQNLearner`, :class:`DQNHyper`).
"""

from __future__ import annotations

from daskrl.algos.dqn_learner import DQNHyper, DQNLearner, linear_schedule
from daskrl.algos.q_actor import QActor
from daskrl.algos.qnet import (
    EpsilonGreedy,
    QNetwork,
    discrete_dims,
    q_and_target,
    q_policy,
    relu_mlp,
    td_errors,
)
from daskrl.algos.transitions import TransitionCollector

__all__ = ["DQNHyper", "DQNLearner", "EpsilonGreedy", "QActor", "QNetwork", "TransitionCollector",
           "discrete_dims", "linear_schedule", "q_and_target", "q_policy", "relu_mlp",
           "td_errors"]
