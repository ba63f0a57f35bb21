"""The actor-critic head for an env's spaces, and what every head offers.

The heads live in :mod:`daskrl.algos.categorical` and :mod:`daskrl.algos.gaussian`, the layers
they are built from in :mod:`daskrl.algos.layers`; their names are importable from here too.
:func:`actor_critic_for` picks the head: a categorical MLP (:class:`DiscreteActorCritic`) for
discrete actions on flat observations, a Gaussian MLP with a state-independent log std
(:class:`GaussianActorCritic`) for a 1-D Box of actions, and the Nature-DQN CNN
(:class:`CNNActorCritic`) for discrete actions on uint8 images. Every head offers
``act``/``evaluate``/``value`` and ``policy(deterministic)``: the module ``daskrl eval`` and
``daskrl export`` run (observation normalisation included).
"""

from __future__ import annotations

from typing import Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.categorical import (
    CategoricalPolicy,
    CNNActorCritic,
    DiscreteActorCritic,
    sample,
)
from daskrl.algos.gaussian import (
    LOG_SQRT_2PI,
    GaussianActorCritic,
    GaussianPolicy,
    gaussian_entropy,
    gaussian_logp,
)
from daskrl.algos.layers import ScaleBytes, conv, layer, mlp, nature_cnn, run_mlp
from daskrl.algos.normalize import Normalization, RunningMeanStd

__all__ = ["LOG_SQRT_2PI", "SUPPORTED", "ActorCritic", "CNNActorCritic", "CategoricalPolicy",
           "DiscreteActorCritic", "GaussianActorCritic", "GaussianPolicy", "ScaleBytes",
           "actor_critic_for", "conv", "gaussian_entropy", "gaussian_logp", "layer", "mlp",
           "nature_cnn", "run_mlp", "sample"]


class ActorCritic(Protocol):
    """What every head offers the actors and learners (:class:`DiscreteActorCritic`,
    :class:`GaussianActorCritic`, :class:`CNNActorCritic`), besides being an ``nn.Module``."""

    action_shape: tuple[int, ...]
    """Shape of one env's action (``()`` for a discrete index)."""
    action_dtype: type
    """numpy dtype of the actions (int64 indices, float32 vectors)."""
    obs_rms: RunningMeanStd | None
    """Running observation statistics the network normalises with (None: raw inputs)."""
    ret_rms: RunningMeanStd | None
    """Running return statistics the actors scale rewards by (None: unscaled)."""

    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Actions, their log-probabilities and the values of ``obs`` (no autograd)."""

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, entropies and values (differentiable)."""

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""

    def policy(self, deterministic: bool = True) -> nn.Module:
        """The policy alone: observations in, actions out (for eval and export)."""


SUPPORTED = ("Box observations (flat vectors, or uint8 images of shape (channels, height, "
             "width)) with Discrete actions, or flat Box observations with 1-D Box actions")


def actor_critic_for(obs_space: gym.Space, action_space: gym.Space,
                     hidden: tuple[int, ...] = (64, 64),
                     normalization: Normalization | None = None) -> nn.Module:
    """The actor-critic head for an env's single observation and action spaces.

    Raises
    ------
    ValueError
        In one line, naming the space no head serves and what is supported.

    Examples
    --------
    >>> from gymnasium.spaces import Box, Discrete, MultiDiscrete
    >>> type(actor_critic_for(Box(-1, 1, (3,)), Box(-2, 2, (1,)))).__name__
    'GaussianActorCritic'
    >>> type(actor_critic_for(Box(0, 255, (4, 84, 84), np.uint8), Discrete(4))).__name__
    'CNNActorCritic'
    >>> actor_critic_for(Box(-1, 1, (3,)), MultiDiscrete([2, 3]))
    Traceback (most recent call last):
    ...
    ValueError: action space MultiDiscrete([2 3]) is not served: supported are Box observations (flat vectors, or uint8 images of shape (channels, height, width)) with Discrete actions, or flat Box observations with 1-D Box actions
    """  # noqa: E501
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observation space {obs_space} is not served: supported are "
                         f"{SUPPORTED} (gymnasium.wrappers.FlattenObservation flattens a Dict "
                         "or Tuple)")
    image = len(obs_space.shape) == 3 and obs_space.dtype == np.uint8
    if isinstance(action_space, gym.spaces.Discrete):
        if image:
            return CNNActorCritic(tuple(obs_space.shape), int(action_space.n))
        return DiscreteActorCritic(int(np.prod(obs_space.shape)), int(action_space.n), hidden)
    if (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
            and not image):
        return GaussianActorCritic(int(np.prod(obs_space.shape)), action_space.shape[0], hidden,
                                   action_space.low, action_space.high, normalization)
    space = f"action space {action_space}" + (" with image observations" if image else "")
    raise ValueError(f"{space} is not served: supported are {SUPPORTED}")
