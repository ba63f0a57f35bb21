"""Categorical heads: an MLP over flat observations (:class:`DiscreteActorCritic`), the
Nature-DQN CNN over uint8 frames (:class:`CNNActorCritic`), Gumbel-max sampling, and the policy
alone for eval and export (:class:`CategoricalPolicy`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.layers import layer, mlp, nature_cnn, run_mlp
from daskrl.algos.normalize import RunningMeanStd
from daskrl.algos.twin_mlp import NumpyActing, TwinMLP


def sample(logits: Tensor, generator: torch.Generator | None, deterministic: bool = False
           ) -> tuple[Tensor, Tensor]:
    """Categorical sample (or argmax) of each row of ``logits``, and its log-probability.

    The sample is Gumbel-max (``argmax(log p - log e)`` with ``e`` standard exponential,
    i.e. ``-log u`` for uniform ``u``: an exact draw from the categorical distribution), the
    noise from ``generator``, so a seeded generator makes a rollout reproducible on any device.

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
        # one exponential draw instead of a uniform, a clamp and two logs: on a few envs every
        # op is dispatch overhead. With finite logits a draw of exactly 0 (chance 2**-53 on
        # the CPU) picks its action, an event of that probability; a -inf logit (a masked
        # action) would meet it as NaN, so masks must stay finite here.
        noise = torch.empty_like(logp_all).exponential_(generator=generator)
        actions = (logp_all - noise.log_()).argmax(-1)
    return actions, logp_all.gather(-1, actions[:, None]).squeeze(-1)


def sample_numpy(logits: np.ndarray, generator: torch.Generator | None,
                 deterministic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sample` for float32 numpy ``logits``: the same draws from ``generator`` (CPU)
    and the same maths in numpy's float32 arithmetic.

    Examples
    --------
    >>> logits = np.array([[0.0, 1.0], [2.0, -1.0]], np.float32)
    >>> a, lp = sample_numpy(logits, torch.Generator().manual_seed(0))
    >>> a_t, lp_t = sample(torch.from_numpy(logits), torch.Generator().manual_seed(0))
    >>> a.tolist() == a_t.tolist(), bool(np.allclose(lp, lp_t.numpy(), atol=1e-6))
    (True, True)
    """
    shifted = logits - logits.max(-1, keepdims=True)
    logp_all = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    if deterministic:
        actions = logp_all.argmax(-1)
    else:
        noise = torch.empty(logp_all.shape).exponential_(generator=generator).numpy()
        actions = (logp_all - np.log(noise)).argmax(-1)
    return actions, np.take_along_axis(logp_all, actions[:, None], -1)[:, 0]


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


class DiscreteActorCritic(NumpyActing, nn.Module):
    """Categorical policy and state-value function over flat observations.

    ``act`` samples with :func:`sample` (Gumbel-max, the noise from its generator); a small
    CPU batch runs in numpy (:class:`~daskrl.algos.twin_mlp.NumpyActing`).

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
        self.towers = TwinMLP(self.actor, self.critic)
        """Actor and critic run as one for acting (:class:`~daskrl.algos.twin_mlp.TwinMLP`)."""

    def policy(self, deterministic: bool = True) -> CategoricalPolicy:
        """The policy alone (shares this network's actor), for eval and export."""
        return CategoricalPolicy(self.actor, deterministic)

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""
        return run_mlp(self.critic, obs).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, policy entropies and values, each ``(B,)``."""
        logp_all = torch.log_softmax(run_mlp(self.actor, obs), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.value(obs)

    def _act_numpy(self, obs: np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`act` in numpy (:meth:`TwinMLP.run_numpy
        <daskrl.algos.twin_mlp.TwinMLP.run_numpy>` and :func:`sample_numpy`), or None for a
        network it cannot run."""
        x = np.asarray(obs, np.float32).reshape(obs.shape[0], -1)
        out = self.towers.run_numpy(self.actor, self.critic, x)
        if out is None:
            return None
        actions, logp = sample_numpy(out[0], generator, deterministic)
        return actions, logp, out[1][:, 0]

    @torch.inference_mode()
    def _act_torch(self, obs: Tensor | np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`act` in torch, on the network's device: a numpy ``obs`` is used in place
        (no copy when it is ``float32``), the sample is :func:`sample`."""
        x = torch.as_tensor(obs, dtype=torch.float32)
        x = x.reshape(x.shape[0], -1).to(self.towers.device)  # shape[0]: len() is Python
        logits, value = self.towers.run(self.actor, self.critic, x)
        actions, logp = sample(logits, generator, deterministic)
        return actions, logp, value.squeeze(-1)


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
