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

    def act(
        self, obs: np.ndarray, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or argmax) actions for a batch of observations; numpy in, numpy out.

        Runs on numpy copies of the CPU weights (refreshed whenever a parameter changes):
        for the small batches of a rollout step this is several times faster than torch's
        per-op dispatch. Sampling is Gumbel-max with noise from ``generator``.
        """
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        actor, critic = self._numpy_layers()
        logits = _numpy_mlp(actor, x)
        z = logits - logits.max(-1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
        if deterministic:
            actions = logp_all.argmax(-1)
        else:
            u = torch.rand(logp_all.shape, generator=generator).numpy().clip(1e-12, 1.0)
            actions = (logp_all - np.log(-np.log(u))).argmax(-1)  # Gumbel-max sample
        logp = np.take_along_axis(logp_all, actions[:, None], -1)[:, 0]
        return actions, logp, _numpy_mlp(critic, x)[:, 0]

    def _numpy_layers(self) -> tuple[list[tuple[np.ndarray, np.ndarray]], ...]:
        # Tensor._version counts in-place changes (optimiser steps, load_state_dict), so the
        # cache is rebuilt exactly when a weight changed.
        params = list(self.parameters())
        stamp = tuple((id(p), p._version) for p in params)
        cached = getattr(self, "_np_cache", None)
        if cached is None or cached[0] != stamp:
            layers = tuple(
                [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy())
                 for m in seq if isinstance(m, nn.Linear)]
                for seq in (self.actor, self.critic)
            )
            cached = (stamp, layers)
            self._np_cache = cached
        return cached[1]


def _numpy_mlp(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """A tanh MLP forward pass in numpy (the layout :func:`mlp` builds)."""
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = np.tanh(x)
    return x
