"""SAC's actor: a Gaussian over pre-squash actions, ``tanh``-squashed and scaled to the
action bounds, with the log-probability of the squashed action (tanh's Jacobian included).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.layers import run_mlp
from daskrl.algos.qnet import relu_mlp

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""Bounds of the policy's log standard deviation (CleanRL's)."""


class SquashedGaussian(nn.Module):
    """The SAC actor: a Gaussian over pre-squash actions, ``tanh`` then scaled to the bounds.

    ``policy(deterministic)`` is the ``obs -> actions`` module for eval and export.

    Examples
    --------
    >>> pi = SquashedGaussian(3, np.array([-2.0]), np.array([2.0]), (16,))
    >>> a, logp = pi.sample(torch.zeros(5, 3))
    >>> a.shape, logp.shape, bool((a.abs() <= 2).all())
    (torch.Size([5, 1]), torch.Size([5]), True)
    >>> pi.policy(True)(torch.zeros(5, 3)).shape
    torch.Size([5, 1])
    """

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray,
                 hidden: tuple[int, ...] = (256, 256)) -> None:
        super().__init__()
        act_dim = len(low)
        self.body = relu_mlp(obs_dim, 2 * act_dim, hidden)
        low_t, high_t = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(
            high, dtype=torch.float32)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("bias", (high_t + low_t) / 2)
        self.register_buffer("explore", torch.tensor(1.0))
        """1 while the actors should act uniformly at random (before learning starts)."""

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and log-std (bounded) of the pre-squash Gaussian."""
        mean, log_std = run_mlp(self.body, obs.reshape(obs.shape[0], -1)).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def sample(self, obs: Tensor, generator: torch.Generator | None = None
               ) -> tuple[Tensor, Tensor]:
        """Reparameterised actions and their log-probabilities (tanh's Jacobian included),
        the noise drawn from ``generator`` (on the module's device; torch's global one when
        None)."""
        return self.squash(obs, self.noise(obs.shape[0], generator))

    def noise(self, rows: int, generator: torch.Generator | None = None) -> Tensor:
        """Standard normal noise for ``rows`` actions (on the module's device), drawn from
        ``generator``: what :meth:`sample` draws, for a caller of :meth:`squash`."""
        return torch.randn((rows, *self.scale.shape), generator=generator,
                           device=self.scale.device, dtype=self.scale.dtype)

    def squash(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`sample` with the standard normal ``noise`` given (shape: the actions'):
        what a compiled step calls, its noise drawn outside from the learner's generator.

        Examples
        --------
        >>> pi = SquashedGaussian(3, np.array([-2.0]), np.array([2.0]), (16,))
        >>> obs, g = torch.zeros(5, 3), torch.Generator().manual_seed(0)
        >>> a, _ = pi.sample(obs, g)
        >>> noise = torch.randn((5, 1), generator=torch.Generator().manual_seed(0))
        >>> bool(torch.equal(pi.squash(obs, noise)[0], a))
        True
        """
        mean, log_std = self(obs)
        std = log_std.exp()
        x = mean + std * noise
        y = torch.tanh(x)
        logp = (-0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - torch.log(self.scale * (1 - y.pow(2)) + 1e-6).sum(-1)
        return y * self.scale + self.bias, logp

    def policy(self, deterministic: bool = True) -> SquashedPolicy:
        """The policy alone (shares this module's weights)."""
        return SquashedPolicy(self, deterministic)


class SquashedPolicy(nn.Module):
    """``obs -> actions`` of a :class:`SquashedGaussian`: its squashed mean, or a sample."""

    def __init__(self, actor: SquashedGaussian, deterministic: bool = True) -> None:
        super().__init__()
        self.actor = actor
        self.deterministic = deterministic

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (float32) for a batch of observations."""
        mean, log_std = self.actor(obs.float())
        if not self.deterministic:
            mean = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(mean) * self.actor.scale + self.actor.bias
