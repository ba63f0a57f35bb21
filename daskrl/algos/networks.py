"""Actor-critic networks (CleanRL layouts, orthogonal init) and sampling, chosen from spaces.

:func:`actor_critic_for` picks the head: a categorical MLP (:class:`DiscreteActorCritic`) for
discrete actions on flat observations, a Gaussian MLP with a state-independent log std
(:class:`GaussianActorCritic`) for a 1-D Box of actions, and the Nature-DQN CNN
(:class:`CNNActorCritic`) for discrete actions on uint8 images. Every head offers
``act``/``evaluate``/``value`` and ``policy(deterministic)``: the module ``daskrl eval`` and
``daskrl export`` run (observation normalisation included).
"""

from __future__ import annotations

import math
from typing import Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from daskrl.algos.normalize import Normalization, RunningMeanStd

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


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


def run_mlp(net: nn.Sequential, x: Tensor) -> Tensor:
    """``net(x)`` for a Sequential of ``Linear`` and ``Tanh`` layers, called as functions.

    The same ops as ``net(x)`` (``F.linear``, ``torch.tanh``), so the same bits, without
    ``nn.Module.__call__``'s hook dispatch per layer: on an actor's one-env forward pass
    (a few microseconds of maths per layer) that dispatch costs more than the maths.

    Examples
    --------
    >>> net = mlp(4, 2, (8,), out_std=1.0)
    >>> x = torch.randn(3, 4)
    >>> torch.equal(run_mlp(net, x), net(x))
    True
    """
    for module in net:
        if isinstance(module, nn.Linear):
            x = F.linear(x, module.weight, module.bias)
        elif isinstance(module, nn.Tanh):
            x = torch.tanh(x)
        else:
            x = module(x)
    return x


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

    def __init__(self, logits: nn.Module, deterministic: bool = True, flatten: bool = True
                 ) -> None:
        super().__init__()
        self.logits = logits
        self.deterministic = deterministic
        self.flatten = flatten
        """Flatten each observation to a vector (MLPs); images go in as they are."""

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (int64) for a batch of observations."""
        logits = self.logits(obs.float().reshape(obs.shape[0], -1) if self.flatten else obs)
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

    action_shape: tuple[int, ...] = ()
    """Shape of one env's action."""
    action_dtype: type = np.int64
    obs_rms: RunningMeanStd | None = None
    """Running observation statistics the network normalises with (None: raw inputs)."""
    ret_rms: RunningMeanStd | None = None
    """Running statistics of the discounted return that rewards are scaled by (None: unscaled)."""

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
        actions, logp = sample(run_mlp(self.actor, x), generator, deterministic)
        return actions, logp, run_mlp(self.critic, x).squeeze(-1)


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


class GaussianActorCritic(nn.Module):
    """Gaussian policy with a state-independent log std, and a state-value function (CleanRL's
    ``ppo_continuous_action`` network), over flat observations.

    With ``normalization.obs`` the network normalises its inputs by :attr:`obs_rms`; with
    ``normalization.reward`` the actors scale rewards by :attr:`ret_rms`. Both are buffers: the
    learner merges the actors' statistics into them, and they travel with the weights.

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
        self.obs_rms: RunningMeanStd | None = (
            RunningMeanStd((obs_dim,), norm.clip) if norm.obs else None)
        self.ret_rms: RunningMeanStd | None = RunningMeanStd((), norm.clip) if norm.reward else None
        bounds = [np.array(np.broadcast_to(b, (act_dim,)), np.float32) for b in (low, high)]
        self.register_buffer("low", torch.from_numpy(bounds[0]))  # fresh arrays: unit strides
        self.register_buffer("high", torch.from_numpy(bounds[1]))
        self.action_shape = (act_dim,)

    def features(self, obs: Tensor) -> Tensor:
        """Flat float32 observations, normalised when :attr:`obs_rms` is kept."""
        x = obs.to(torch.float32).reshape(len(obs), -1)
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

    @torch.inference_mode()
    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sampled actions (or the mean), their log-densities and the values of ``obs``.

        The noise comes from ``generator``; actions are not clipped here (the env runner
        clips what it sends to the env; the log-density is of the unclipped sample, as in
        CleanRL).
        """
        x = self.features(torch.as_tensor(obs).to(self.low.device))
        mean = run_mlp(self.actor_mean, x)
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
        return actions, logp, run_mlp(self.critic, x).squeeze(-1)


class ScaleBytes(nn.Module):
    """uint8 pixels to float32 in [0, 1], inside the network: frames stay uint8 (4x smaller)
    until they reach the device that runs it."""

    def forward(self, x: Tensor) -> Tensor:
        """``x / 255`` as float32."""
        return x.to(torch.float32) / 255.0


def conv(n_in: int, n_out: int, kernel: int, stride: int) -> nn.Conv2d:
    """A convolution with orthogonal weights (gain sqrt 2) and zero bias.

    Examples
    --------
    >>> conv(4, 32, 8, 4).weight.shape
    torch.Size([32, 4, 8, 8])
    """
    c = nn.Conv2d(n_in, n_out, kernel, stride)
    nn.init.orthogonal_(c.weight, math.sqrt(2))
    nn.init.constant_(c.bias, 0.0)
    return c


def nature_cnn(in_channels: int, size: int = 84) -> nn.Sequential:
    """The Nature-DQN torso: uint8 frames ``(B, in_channels, size, size)`` in, 512 features
    out (scaled by 1/255 inside, so callers pass the frames as they are).

    Examples
    --------
    >>> nature_cnn(4)(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 512])
    """
    convs = nn.Sequential(ScaleBytes(), conv(in_channels, 32, 8, 4), nn.ReLU(),
                          conv(32, 64, 4, 2), nn.ReLU(), conv(64, 64, 3, 1), nn.ReLU(),
                          nn.Flatten())
    with torch.no_grad():
        flat = convs(torch.zeros(1, in_channels, size, size)).shape[1]
    return nn.Sequential(*convs, layer(flat, 512), nn.ReLU())


class CNNActorCritic(nn.Module):
    """Categorical policy and value on a shared Nature-DQN torso (CleanRL's ``ppo_atari``).

    Takes uint8 frames ``(B, C, H, W)``: they are converted to float on the network's device.

    Examples
    --------
    >>> net = CNNActorCritic((4, 84, 84), 6)
    >>> a, logp, v = net.act(np.zeros((2, 4, 84, 84), np.uint8))
    >>> a.shape, net.policy()(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    (torch.Size([2]), torch.Size([2]))
    """

    action_shape: tuple[int, ...] = ()
    action_dtype: type = np.int64
    obs_rms: RunningMeanStd | None = None
    ret_rms: RunningMeanStd | None = None

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        channels, size = obs_shape[0], obs_shape[-1]
        self.network = nature_cnn(channels, size)
        self.actor = layer(512, num_actions, std=0.01)
        self.critic = layer(512, 1, std=1.0)

    def policy(self, deterministic: bool = True) -> CategoricalPolicy:
        """The policy alone (torso and actor head), for eval and export."""
        return CategoricalPolicy(nn.Sequential(self.network, self.actor), deterministic,
                                 flatten=False)

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""
        return self.critic(self.network(obs)).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, policy entropies and values, each ``(B,)``."""
        hidden = self.network(obs)
        logp_all = torch.log_softmax(self.actor(hidden), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.critic(hidden).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sampled (or greedy) actions, their log-probabilities and the values of ``obs``."""
        x = torch.as_tensor(obs).to(self.critic.weight.device)
        hidden = self.network(x)
        actions, logp = sample(self.actor(hidden), generator, deterministic)
        return actions, logp, self.critic(hidden).squeeze(-1)


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
