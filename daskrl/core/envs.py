"""Gymnasium vector environments built from env ids, checked before any long work."""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np


def check_env_id(env_id: str) -> None:
    """Raise ``ValueError`` naming ``env_id`` if gymnasium does not know it.

    Examples
    --------
    >>> check_env_id("CartPole-v1")
    """
    try:
        gym.spec(env_id)
    except Exception as exc:  # gymnasium raises several error types here
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())]
        hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
        raise ValueError(f"unknown env id {env_id!r}{hint}: {exc}") from None


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies, numpy-vectorised when the env offers it.

    Uses the env's own vector entry point (e.g. CartPole's numpy implementation) when it
    has one, else a synchronous vector env. Auto-reset follows gymnasium's default
    next-step mode: the step after an episode ends returns the reset observation.

    Examples
    --------
    >>> env = make_vector_env("CartPole-v1", 4, seed=0)
    >>> env.observation_space.shape
    (4, 4)
    """
    check_env_id(env_id)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    spec = gym.spec(env_id)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def space_dims(env: gym.vector.VectorEnv) -> tuple[int, int]:
    """Flat observation size and number of discrete actions of a vector env.

    Raises
    ------
    ValueError
        If the single observation space is not a flat Box or the action space not Discrete.
    """
    obs_space, act_space = env.single_observation_space, env.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observation space {obs_space} is not a Box: use a flattening wrapper")
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"action space {act_space} is not Discrete: PPO here needs discrete")
    return int(np.prod(obs_space.shape)), int(act_space.n)


@dataclass
class EnvStep:
    """What one step of a vector env returns, with the episodes it finished.

    ``obs`` is the observation after the step (the final observation when an episode ended
    there; gymnasium resets it on the next step, which is then not ``valid``).
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    done: np.ndarray
    valid: np.ndarray
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
