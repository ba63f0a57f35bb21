"""Greedy (or sampled) episodes of a trained policy module on fresh envs: the evaluation every
graph's ``evaluate`` role runs, whatever its network."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from daskrl.core.envs import make_vector_env


def evaluate_module(env_id: str, policy: nn.Module, seed: int, episodes: int = 10
                    ) -> dict[str, float]:
    """Mean and std of the return of ``episodes`` episodes of ``policy`` (an
    ``obs -> actions`` module, ``Algorithm.make_policy``'s) on fresh envs, one per episode.

    Box actions are clipped to the space's bounds before the env, as in training.

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> pi = DiscreteActorCritic(4, 2).policy(True)
    >>> evaluate_module("CartPole-v1", pi, seed=0, episodes=2)["eval_episodes"]
    2
    """
    env = make_vector_env(env_id, episodes, seed)
    space = env.single_action_space
    obs, _ = env.reset(seed=seed)
    total = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        x = torch.as_tensor(obs)  # uint8 frames stay uint8: the CNN scales them itself
        with torch.inference_mode():
            actions = policy(x.float() if x.is_floating_point() else x).numpy()
        if isinstance(space, gym.spaces.Box):
            actions = np.clip(actions, space.low, space.high)
        obs, rew, term, trunc, _ = env.step(actions)
        total += rew * running
        running &= ~(term | trunc)
    env.close()
    return {"eval_return_mean": float(total.mean()), "eval_return_std": float(total.std()),
            "eval_episodes": episodes}
