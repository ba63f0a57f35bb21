"""N-step transitions folded on the actor, so the learner's target is
``rewards + discounts * Q(next_obs)`` whatever ``n``; vectorised over steps and envs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Batch = dict[str, Any]


def nstep_transitions(steps: Mapping[str, np.ndarray], n: int, gamma: float
                      ) -> tuple[Batch, dict[str, np.ndarray]]:
    """Fold env steps into ``n``-step transitions; return them and the steps kept for later.

    ``steps`` holds time-major arrays ``[T, E]`` (``E`` envs): ``obs``, ``actions``,
    ``rewards``, ``next_obs`` (the observation after the step: the final one when the
    episode ended there), ``terminated``, ``done`` (terminated or truncated) and ``pending``
    (a step that starts a transition not yet emitted: not a reset step, and not emitted by
    an earlier call). A transition from step ``t`` covers steps ``t .. t + k - 1`` with
    ``k = n``, or fewer when its episode ends first; its ``rewards`` is the discounted sum
    and ``discounts`` is ``gamma ** k``, or 0 when it ended in a terminal state. A step whose
    ``n`` steps are not all in ``steps`` yet (nor its episode's end) is not emitted: the last
    ``n - 1`` steps come back with their ``pending`` flags, to be put in front of the next
    call's steps. Loops over ``n``, never over steps or envs.

    Examples
    --------
    >>> T, E = 4, 1
    >>> steps = {"obs": np.arange(T, dtype=np.float32).reshape(T, E, 1),
    ...          "actions": np.zeros((T, E), np.int64), "rewards": np.ones((T, E)),
    ...          "next_obs": np.arange(1, T + 1, dtype=np.float32).reshape(T, E, 1),
    ...          "terminated": np.array([[0], [1], [0], [0]], bool),
    ...          "pending": np.array([[1], [1], [0], [1]], bool)}
    >>> steps["done"] = steps["terminated"].copy()
    >>> out, keep = nstep_transitions(steps, n=2, gamma=0.5)
    >>> out["rewards"].tolist(), out["discounts"].tolist(), keep["pending"][:, 0].tolist()
    ([1.5, 1.0], [0.0, 0.0], [True])
    """
    T = len(steps["rewards"])
    t = np.arange(T)[:, None]
    done = steps["done"].astype(bool)
    rewards = steps["rewards"].astype(np.float64)
    ret = np.zeros(rewards.shape)
    end = np.broadcast_to(t, rewards.shape).copy()
    alive = np.ones(rewards.shape, bool)  # no episode end before step t + k
    for k in range(n):
        idx = t + k
        inside = idx < T
        safe = np.minimum(idx, T - 1)
        use = alive & inside
        ret += np.where(use, (gamma ** k) * np.take_along_axis(rewards, np.broadcast_to(
            safe, rewards.shape), 0), 0.0)
        end = np.where(use, np.broadcast_to(safe, end.shape), end)
        alive = use & ~np.take_along_axis(done, np.broadcast_to(safe, done.shape), 0)
    ended = np.take_along_axis(done, end, 0)  # stopped at an episode's end
    ready = ended | (t + n - 1 < T)
    emit = ready & steps["pending"].astype(bool)
    length = end - t + 1
    term = np.take_along_axis(steps["terminated"].astype(bool), end, 0)
    discounts = np.where(term, 0.0, gamma ** length)
    rows, envs = np.nonzero(emit)
    out: Batch = {
        "obs": steps["obs"][rows, envs],
        "actions": steps["actions"][rows, envs],
        "rewards": ret[rows, envs].astype(np.float32),
        "next_obs": steps["next_obs"][end[rows, envs], envs],
        "discounts": discounts[rows, envs].astype(np.float32),
    }
    cut = max(0, T - (n - 1))
    keep = {k: v[cut:] for k, v in steps.items()}
    keep["pending"] = (steps["pending"].astype(bool) & ~emit)[cut:]
    return out, keep


def concat_steps(before: Mapping[str, np.ndarray] | None, after: Mapping[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """``before``'s steps (kept by :func:`nstep_transitions`) followed by ``after``'s.

    Examples
    --------
    >>> concat_steps({"r": np.zeros((1, 2))}, {"r": np.ones((3, 2))})["r"].shape
    (4, 2)
    """
    if not before:
        return dict(after)
    return {k: np.concatenate([before[k], v]) for k, v in after.items()}
