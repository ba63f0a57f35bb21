"""Actor-critic networks (CleanRL layout: separate tanh MLPs, orthogonal init)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def layer(n_in: int, n_out: int, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """A linear layer with orthogonal weights and constant bias.

    Examples
    --------
    >>> layer(4, 8).weight.shape
    torch.Size([8, 4])
    """
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, bias)
    return lin


def mlp(n_in: int, n_out: int, hidden: tuple[int, ...], out_std: float) -> nn.Sequential:
    """A tanh MLP ending in a linear head initialised with ``out_std``."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [layer(n_in, h), nn.Tanh()]
        n_in = h
    layers.append(layer(n_in, n_out, std=out_std))
    return nn.Sequential(*layers)


class DiscreteActorCritic(nn.Module):
    """Categorical policy and state-value function over flat observations.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> a, logp, v = net.act(np.zeros((3, 4), np.float32))
    >>> a.shape, logp.shape, v.shape
    ((3,), (3,), (3,))
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.actor = mlp(obs_dim, num_actions, hidden, out_std=0.01)
        self.critic = mlp(obs_dim, 1, hidden, out_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape ``(B,)``."""
        return self.critic(obs).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions``, policy entropies and values, each ``(B,)``."""
        logp_all = torch.log_softmax(self.actor(obs), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.value(obs)

    @torch.inference_mode()
    def act(
        self, obs: np.ndarray, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or argmax) actions for a batch of observations; numpy in, numpy out."""
        x = torch.as_tensor(obs, dtype=torch.float32)
        logp_all = torch.log_softmax(self.actor(x), dim=-1)
        if deterministic:
            actions = logp_all.argmax(-1)
        else:
            u = torch.rand(logp_all.shape, generator=generator).clamp_(1e-12, 1.0)
            actions = (logp_all - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max sample
        logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions.numpy(), logp.numpy(), self.value(x).numpy()
