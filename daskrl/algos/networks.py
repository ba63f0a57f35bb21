"""Actor-critic networks (CleanRL layout: separate tanh MLPs, orthogonal init) and sampling."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn


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
    """A tanh MLP ending in a linear head initialised with ``out_std``.

    Examples
    --------
    >>> mlp(4, 2, (8,), out_std=0.01)
    Sequential(
      (0): Linear(in_features=4, out_features=8, bias=True)
      (1): Tanh()
      (2): Linear(in_features=8, out_features=2, bias=True)
    )
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [layer(n_in, h), nn.Tanh()]
        n_in = h
    layers.append(layer(n_in, n_out, std=out_std))
    return nn.Sequential(*layers)


def sample(logits: Tensor, generator: torch.Generator | None, deterministic: bool = False
           ) -> tuple[Tensor, Tensor]:
    """Categorical sample (or argmax) of each row of ``logits``, and its log-probability.

    The sample is Gumbel-max (``argmax(log p - log(-log u))``, an exact draw from the
    categorical distribution) with uniform noise ``u`` from ``generator``, so a seeded
    generator makes a rollout reproducible on any device.

    Examples
    --------
    >>> a, lp = sample(torch.tensor([[0.0, 50.0]]), None, deterministic=True)
    >>> a.tolist(), abs(round(lp.item(), 4))
    ([1], 0.0)
    >>> g = torch.Generator().manual_seed(0)
    >>> sample(torch.zeros(1000, 2), g)[0].float().mean().item() > 0.4
    True
    """
    logp_all = torch.log_softmax(logits.float(), -1)
    if deterministic:
        actions = logp_all.argmax(-1)
    else:
        u = torch.rand(logp_all.shape, generator=generator, device=logits.device)
        actions = (logp_all - (-u.clamp_min(1e-12).log()).log()).argmax(-1)
    return actions, logp_all.gather(-1, actions[:, None]).squeeze(-1)


class CategoricalPolicy(nn.Module):
    """A categorical policy head alone: ``forward(obs) -> actions`` (argmax, or a sample).

    What ``daskrl eval``/``export`` run; a scriptable module with no RL bookkeeping.

    Examples
    --------
    >>> pi = CategoricalPolicy(mlp(4, 2, (8,), out_std=0.01), deterministic=True)
    >>> pi(torch.zeros(3, 4)).shape
    torch.Size([3])
    """

    def __init__(self, logits: nn.Module, deterministic: bool = True) -> None:
        super().__init__()
        self.logits = logits
        self.deterministic = deterministic

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (int64) for a batch of observations."""
        logits = self.logits(obs.float().reshape(obs.shape[0], -1))
        if self.deterministic:
            return logits.argmax(-1)
        return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)


class DiscreteActorCritic(nn.Module):
    """Categorical policy and state-value function over flat observations.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> a, logp, v = net.act(np.zeros((3, 4), np.float32), torch.Generator().manual_seed(0))
    >>> a.shape, logp.shape, v.shape
    (torch.Size([3]), torch.Size([3]), torch.Size([3]))
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.actor = mlp(obs_dim, num_actions, hidden, out_std=0.01)
        self.critic = mlp(obs_dim, 1, hidden, out_std=1.0)

    def policy(self, deterministic: bool = True) -> CategoricalPolicy:
        """The policy alone (shares this network's actor), for eval and export."""
        return CategoricalPolicy(self.actor, deterministic)

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""
        return self.critic(obs).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, policy entropies and values, each ``(B,)``."""
        logp_all = torch.log_softmax(self.actor(obs), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.value(obs)

    @torch.inference_mode()
    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sampled (or greedy) actions, their log-probabilities and the values of ``obs``.

        Runs without autograd; a numpy ``obs`` is used in place (no copy when it is
        ``float32``). Sampling is :func:`sample` with ``generator``'s noise.
        """
        x = torch.as_tensor(obs, dtype=torch.float32)
        x = x.reshape(len(x), -1).to(self.critic[0].weight.device)
        actions, logp = sample(self.actor(x), generator, deterministic)
        return actions, logp, self.value(x)
