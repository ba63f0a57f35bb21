"""The Q-network of DQN and Ape-X, its epsilon-greedy policy, and the (double) Q-learning
target both the learner and, for initial priorities, the actors compute.

The target is ``rewards + discounts * Q_target(next_obs, a*)`` with ``a*`` the online
network's argmax (double Q) or the target's; ``discounts`` already folds ``gamma ** n`` and
termination (:func:`~daskrl.algos.nstep.nstep_transitions`), so one formula serves any
``n``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.layers import run_mlp

Batch = dict[str, Any]


def relu_mlp(n_in: int, n_out: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """A ReLU MLP (PyTorch's default initialisation, as CleanRL's and SB3's Q-networks).

    Examples
    --------
    >>> relu_mlp(4, 2, (8,))(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), nn.ReLU()]
        n_in = h
    layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


class EpsilonGreedy(nn.Module):
    """A Q-network's policy alone: ``forward(obs) -> actions``, argmax of Q, or with
    probability ``epsilon`` a uniformly random action (scriptable, no numpy).

    Examples
    --------
    >>> pi = EpsilonGreedy(relu_mlp(4, 2, (8,)), epsilon=0.0)
    >>> pi(torch.zeros(3, 4)).shape
    torch.Size([3])
    """

    def __init__(self, q: nn.Module, epsilon: float = 0.0) -> None:
        super().__init__()
        self.q = q
        self.epsilon = float(epsilon)

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (int64) for a batch of observations."""
        q = self.q(obs.float().reshape(obs.shape[0], -1))
        greedy = q.argmax(-1)
        if self.epsilon <= 0:
            return greedy
        explore = torch.rand(greedy.shape, device=q.device) < self.epsilon
        random = torch.randint(0, q.shape[-1], greedy.shape, device=q.device)
        return torch.where(explore, random, greedy)


class QNetwork(nn.Module):
    """Action values over flat observations, and the exploration rate the actors use.

    ``epsilon`` is a buffer, so it travels in the ``state_dict`` with the weights: the
    learner sets it from the run's progress, every actor reads it when it loads weights.

    Examples
    --------
    >>> net = QNetwork(4, 2, (16, 16))
    >>> net(torch.zeros(5, 4)).shape, float(net.epsilon)
    (torch.Size([5, 2]), 1.0)
    >>> net.policy(deterministic=True)(torch.zeros(5, 4)).shape
    torch.Size([5])
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (256, 256)
                 ) -> None:
        super().__init__()
        self.q = relu_mlp(obs_dim, num_actions, hidden)
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, obs: Tensor) -> Tensor:
        """Q-values ``[B, num_actions]`` (``self.q``'s maths, see
        :func:`~daskrl.algos.layers.run_mlp`)."""
        return run_mlp(self.q, obs.reshape(obs.shape[0], -1))

    def policy(self, deterministic: bool = True) -> EpsilonGreedy:
        """Greedy (``deterministic``) or epsilon-greedy with the current epsilon."""
        return EpsilonGreedy(self.q, 0.0 if deterministic else float(self.epsilon))


def discrete_dims(env_id: str) -> tuple[int, int]:
    """Flat observation size and action count of ``env_id``; one line naming the action
    space when it is not Discrete.

    Examples
    --------
    >>> discrete_dims("CartPole-v1")
    (4, 2)
    >>> discrete_dims("Pendulum-v1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: DQN needs a Discrete action space, but Pendulum-v1's is Box(-2.0, 2.0, (1,), ...
    """
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"DQN needs a Discrete action space, but {env_id}'s is {act_space}: "
                         "use graphs/sac.py for continuous actions")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"DQN needs a Box observation space, but {env_id}'s is {obs_space}: "
                         "use a flattening wrapper")
    return int(np.prod(obs_space.shape)), int(act_space.n)


def td_errors(net: nn.Module, target: nn.Module, batch: Batch, double_q: bool) -> np.ndarray:
    """``|rewards + discounts * Q_target(next_obs, a*) - Q(obs, actions)|`` without autograd;
    ``a*`` is the online network's argmax (double Q) or the target's.

    Examples
    --------
    >>> net = QNetwork(4, 2, (8,))
    >>> b = {"obs": np.zeros((3, 4), np.float32), "actions": np.zeros(3, np.int64),
    ...      "rewards": np.ones(3, np.float32), "next_obs": np.zeros((3, 4), np.float32),
    ...      "discounts": np.zeros(3, np.float32)}
    >>> td_errors(net, net, b, True).shape
    (3,)
    """
    b = {k: torch.as_tensor(np.asarray(batch[k])) for k in
         ("obs", "actions", "rewards", "next_obs", "discounts")}
    with torch.inference_mode():
        next_target = target(b["next_obs"].float())
        q, target_q = q_and_target(net, b["obs"].float(), b["next_obs"].float(), b["actions"],
                                   b["rewards"].float(), b["discounts"].float(), next_target,
                                   double_q)
    return (target_q - q).abs().numpy().astype(np.float64)


def q_and_target(net: nn.Module, obs: Tensor, next_obs: Tensor, actions: Tensor,
                 rewards: Tensor, discounts: Tensor, next_target: Tensor, double_q: bool,
                 both: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The online network's ``Q(obs, actions)`` (with autograd) and the Q-learning target.

    ``next_target`` is the target network's Q of ``next_obs`` (computed by the caller: the
    target network does not change between its updates, so a learner computes it for many
    gradient steps in one pass). With ``double_q`` the online network's Q of ``obs`` and
    ``next_obs`` comes from one forward pass over ``both`` (their concatenation; made here
    when not given).

    Examples
    --------
    >>> net = QNetwork(4, 2, (8,))
    >>> obs = torch.zeros(3, 4)
    >>> q, t = q_and_target(net, obs, obs, torch.zeros(3, dtype=torch.long), torch.ones(3),
    ...                     torch.zeros(3), net(obs), double_q=True)
    >>> q.shape, t.tolist()
    (torch.Size([3]), [1.0, 1.0, 1.0])
    """
    if double_q:
        if both is None:
            both = torch.cat([obs, next_obs])
        q_all = net(both)
        q_all, next_online = q_all[:len(obs)], q_all[len(obs):].detach()
        best = next_online.argmax(1, keepdim=True)
    else:
        q_all = net(obs)
        best = next_target.argmax(1, keepdim=True)
    q = q_all.gather(1, actions.long().reshape(-1, 1)).squeeze(1)
    with torch.no_grad():
        target_q = rewards + discounts * next_target.gather(1, best).squeeze(1)
    return q, target_q


def q_policy(env_id: str, hidden: tuple[int, ...], weights: dict[str, Tensor],
             deterministic: bool = True) -> nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``).

    Examples
    --------
    >>> w = QNetwork(4, 2, (8,)).state_dict()
    >>> q_policy("CartPole-v1", (8,), w)(torch.zeros(2, 4)).shape
    torch.Size([2])
    """
    net = QNetwork(*discrete_dims(env_id), hidden)
    net.load_state_dict(weights)
    return net.policy(deterministic).eval()
