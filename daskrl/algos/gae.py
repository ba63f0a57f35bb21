"""Generalised advantage estimation over a rollout of shape ``(num_steps, num_envs)``."""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    done: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns by GAE(lambda).

    Parameters
    ----------
    rewards, values : ndarray, shape (T, N)
        Reward of step ``t`` and value estimate of the observation it acted on.
    next_values : ndarray, shape (T, N)
        Value of the observation that followed step ``t`` (the final observation
        when an episode ended there, so truncation bootstraps correctly).
    terminated : ndarray of bool, shape (T, N)
        The episode ended in a terminal state at step ``t`` (no bootstrap).
    done : ndarray of bool, shape (T, N)
        The episode ended at step ``t`` for any reason (the recursion is cut).
    gamma, gae_lambda : float
        Discount and GAE mixing factor.

    Returns
    -------
    advantages, returns : ndarray, shape (T, N)
        ``returns = advantages + values``.

    Examples
    --------
    >>> r = np.ones((2, 1)); v = np.zeros((2, 1)); z = np.zeros((2, 1), bool)
    >>> adv, ret = gae(r, v, np.zeros((2, 1)), z, z, 0.5, 1.0)
    >>> adv[:, 0].tolist()
    [1.5, 1.0]
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    carry = gamma * gae_lambda * (1.0 - done)
    adv = np.zeros_like(deltas, dtype=np.float32)
    last = np.zeros(deltas.shape[1:], dtype=np.float32)
    for t in range(deltas.shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        adv[t] = last
    return adv, (adv + values).astype(np.float32)
