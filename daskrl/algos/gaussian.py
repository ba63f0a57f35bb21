"""The Gaussian head for Box actions (CleanRL's ``ppo_continuous_action``): a state-independent
log std, observation normalisation by running statistics, and the policy alone for eval and
export (:class:`GaussianPolicy`)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.layers import mlp, run_mlp
from daskrl.algos.normalize import Normalization, RunningMeanStd
from daskrl.algos.twin_mlp import NumpyActing, TwinMLP

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_logp(actions: Tensor, mean: Tensor, logstd: Tensor) -> Tensor:
    """Log-density of ``actions`` under independent normals, summed over the last axis.

    Examples
    --------
    >>> round(gaussian_logp(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1)).item(), 4)
    -0.9189
    """
    z = (actions - mean) * torch.exp(-logstd)
    return (-0.5 * z * z - logstd - LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(logstd: Tensor) -> Tensor:
    """Entropy of independent normals with log std ``logstd``, summed over the last axis.

    Examples
    --------
    >>> round(gaussian_entropy(torch.zeros(1, 2)).item(), 4)
    2.8379
    """
    return (0.5 + LOG_SQRT_2PI + logstd).sum(-1)


class GaussianPolicy(nn.Module):
    """A Gaussian policy alone: ``forward(obs) -> actions`` (the mean, or a sample), clipped
    to the action bounds, observation normalisation included.

    Examples
    --------
    >>> net = GaussianActorCritic(3, 1, (8,), low=-2.0, high=2.0)
    >>> pi = torch.jit.script(net.policy(deterministic=True))
    >>> pi(torch.zeros(4, 3)).shape
    torch.Size([4, 1])
    """

    def __init__(self, normalize: nn.Module, mean: nn.Module, logstd: Tensor, low: Tensor,
                 high: Tensor, deterministic: bool = True) -> None:
        super().__init__()
        self.normalize, self.mean = normalize, mean
        self.register_buffer("logstd", logstd.detach().clone())
        self.register_buffer("low", low.detach().clone())
        self.register_buffer("high", high.detach().clone())
        self.deterministic = deterministic

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (float32) for a batch of observations."""
        mean = self.mean(self.normalize(obs.float().reshape(obs.shape[0], -1)))
        if not self.deterministic:
            mean = mean + torch.exp(self.logstd) * torch.randn_like(mean)
        return torch.maximum(torch.minimum(mean, self.high), self.low)


class GaussianActorCritic(NumpyActing, nn.Module):
    """Gaussian policy with a state-independent log std, and a state-value function (CleanRL's
    ``ppo_continuous_action`` network), over flat observations.

    With ``normalization.obs`` the network normalises its inputs by :attr:`obs_rms`; with
    ``normalization.reward`` the actors scale rewards by :attr:`ret_rms`. Both are buffers: the
    learner merges the actors' statistics into them, and they travel with the weights.

    ``act`` gives the mean or a sample, not clipped (the env runner clips what it sends to
    the env; the log-density is of the unclipped sample, as in CleanRL); a small CPU batch
    runs in numpy (:class:`~daskrl.algos.twin_mlp.NumpyActing`).

    Examples
    --------
    >>> net = GaussianActorCritic(3, 2, (8,), normalization=Normalization(obs=True))
    >>> a, logp, v = net.act(np.zeros((4, 3)), torch.Generator().manual_seed(0))
    >>> a.shape, logp.shape, v.shape
    (torch.Size([4, 2]), torch.Size([4]), torch.Size([4]))
    >>> sorted(k for k in net.state_dict() if "rms" in k)
    ['obs_rms.count', 'obs_rms.mean', 'obs_rms.var']
    """

    action_dtype: type = np.float32

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (64, 64),
                 low: float | np.ndarray = -np.inf, high: float | np.ndarray = np.inf,
                 normalization: Normalization | None = None) -> None:
        super().__init__()
        norm = normalization or Normalization()
        self.critic = mlp(obs_dim, 1, hidden, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, hidden, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))
        self.towers = TwinMLP(self.actor_mean, self.critic)
        """Mean and value networks run as one for acting
        (:class:`~daskrl.algos.twin_mlp.TwinMLP`)."""
        self.obs_rms: RunningMeanStd | None = (
            RunningMeanStd((obs_dim,), norm.clip) if norm.obs else None)
        self.ret_rms: RunningMeanStd | None = RunningMeanStd((), norm.clip) if norm.reward else None
        bounds = [np.array(np.broadcast_to(b, (act_dim,)), np.float32) for b in (low, high)]
        self.register_buffer("low", torch.from_numpy(bounds[0]))  # fresh arrays: unit strides
        self.register_buffer("high", torch.from_numpy(bounds[1]))
        self.action_shape = (act_dim,)

    def features(self, obs: Tensor) -> Tensor:
        """Flat float32 observations, normalised when :attr:`obs_rms` is kept."""
        x = obs.to(torch.float32).reshape(obs.shape[0], -1)
        return self.obs_rms(x) if self.obs_rms is not None else x

    def policy(self, deterministic: bool = True) -> GaussianPolicy:
        """The policy alone (normaliser, mean network, log std, bounds), for eval and export."""
        norm = self.obs_rms if self.obs_rms is not None else nn.Identity()
        return GaussianPolicy(norm, self.actor_mean, self.actor_logstd, self.low, self.high,
                              deterministic)

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""
        return self.critic(self.features(obs)).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-densities of ``actions``, policy entropies and values, each ``(B,)``."""
        x = self.features(obs)
        mean = run_mlp(self.actor_mean, x)
        logstd = self.actor_logstd.expand_as(mean)
        return (gaussian_logp(actions, mean, logstd), gaussian_entropy(logstd),
                run_mlp(self.critic, x).squeeze(-1))

    def _act_numpy(self, obs: np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`act` in numpy (:meth:`TwinMLP.run_numpy
        <daskrl.algos.twin_mlp.TwinMLP.run_numpy>`, the noise from torch), or None for a
        network it cannot run."""
        if self.low.device.type != "cpu":  # before normalising: a GPU network's torch path
            return None
        x = np.asarray(obs, np.float32).reshape(obs.shape[0], -1)
        if self.obs_rms is not None:
            x = self.obs_rms.normalize_numpy(x)
        out = self.towers.run_numpy(self.actor_mean, self.critic, x)
        if out is None:
            return None
        mean, value = out
        logstd = self.actor_logstd.detach().numpy()
        const = (logstd + np.float32(LOG_SQRT_2PI)).sum()
        if deterministic:
            actions, logp = mean, np.full(mean.shape[0], -const, np.float32)
        else:
            noise = torch.randn(mean.shape, generator=generator).numpy()
            actions = mean + np.exp(logstd) * noise
            logp = np.square(noise).sum(-1)
            logp *= -0.5
            logp -= const
        return actions, logp, value[:, 0]

    @torch.inference_mode()
    def _act_torch(self, obs: Tensor | np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`act` in torch, on the network's device."""
        x = self.features(torch.as_tensor(obs).to(self.low.device))
        mean, value = self.towers.run(self.actor_mean, self.critic, x)
        logstd = self.actor_logstd
        # the log-density from the standard-normal draw itself: (actions - mean) / std is the
        # draw (up to rounding), so half the ops of gaussian_logp on a one-env step
        const = (logstd + LOG_SQRT_2PI).sum()
        if deterministic:
            actions, logp = mean, const.neg().expand(len(mean))
        else:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
            actions = mean + torch.exp(logstd) * noise
            logp = noise.square().sum(-1).mul_(-0.5).sub_(const)
        return actions, logp, value.squeeze(-1)
