"""What SAC and TD3 share: Box action spaces, twin critics, an actor that acts uniformly at
random until its learner's weights say learning started, and the learner's gradient steps on
uniform replay samples (:class:`BoxLearner`).

The actors' policy module carries an ``explore`` buffer (1 until the learner's replay holds
``learning_starts`` transitions) that travels with the weights, as DQN's epsilon does; the
learner clears it (:meth:`BoxActor.rollout` reads it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from daskrl.algos.ensemble import StackedMLP
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.gradient_update import clipped_step
from daskrl.algos.offpolicy import TensorMeans, as_tensors, cpu_copy, minibatches
from daskrl.algos.qnet import relu_mlp
from daskrl.algos.replay_learner import ReplayLearner
from daskrl.algos.transitions import TransitionCollector

FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")
"""What a continuous-action learner trains on, from its replay."""

Batch = dict[str, Any]


def box_dims(env_id: str, algo: str) -> tuple[int, np.ndarray, np.ndarray]:
    """Flat observation size and the action bounds of ``env_id``; one line naming the action
    space (and ``algo``, the algorithm that needs a Box) when it is not a Box.

    Examples
    --------
    >>> obs_dim, low, high = box_dims("Pendulum-v1", "SAC")
    >>> obs_dim, low.tolist(), high.tolist()
    (3, [-2.0], [2.0])
    >>> box_dims("CartPole-v1", "SAC")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: SAC needs a continuous (Box) action space, but CartPole-v1's is Discrete(2): use ...
    """
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Box):
        raise ValueError(f"{algo} needs a continuous (Box) action space, but {env_id}'s is "
                         f"{act_space}: use graphs/dqn.py for discrete actions")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{algo} needs a Box observation space, but {env_id}'s is {obs_space}: "
                         "use a flattening wrapper")
    return (int(np.prod(obs_space.shape)), act_space.low.astype(np.float32).reshape(-1),
            act_space.high.astype(np.float32).reshape(-1))


class TwinQ(nn.Module):
    """Two independent Q-networks over (observation, action), evaluated as one
    (:class:`~daskrl.algos.ensemble.StackedMLP`: one batched product per layer for both).

    Each critic is initialised as its own ``relu_mlp`` (PyTorch's default), then stacked.

    Examples
    --------
    >>> q1, q2 = TwinQ(3, 1, (16,))(torch.zeros(4, 3), torch.zeros(4, 1))
    >>> q1.shape, q2.shape
    (torch.Size([4]), torch.Size([4]))
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] = (256, 256)) -> None:
        super().__init__()
        self.q = StackedMLP([relu_mlp(obs_dim + act_dim, 1, hidden) for _ in range(2)])

    def both(self, obs: Tensor, act: Tensor) -> Tensor:
        """Both Q-values, ``[2, B]``."""
        x = torch.cat([obs.reshape(obs.shape[0], -1), act.reshape(act.shape[0], -1)], -1)
        return self.q(x).squeeze(-1)

    def forward(self, obs: Tensor, act: Tensor) -> tuple[Tensor, Tensor]:
        """Both Q-values, each ``[B]``."""
        q1, q2 = self.both(obs, act)
        return q1, q2

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any
                              ) -> None:
        # a checkpoint of the two critics as separate MLPs (q1.0.weight, ...): stack them
        if f"{prefix}q1.0.weight" in state_dict:
            for name in [k for k in state_dict if k.startswith((f"{prefix}q1.", f"{prefix}q2."))]:
                member, layer, kind = name[len(prefix):].split(".")
                value = state_dict.pop(name)
                i, j = int(layer) // 2, int(member[1]) - 1
                key = f"{prefix}q.{'weights' if kind == 'weight' else 'biases'}.{i}"
                parts = state_dict.setdefault(key, [None, None])
                parts[j] = value.t() if kind == "weight" else value.unsqueeze(0)
            for key in [k for k in state_dict if k.startswith(f"{prefix}q.")]:
                if isinstance(state_dict[key], list):
                    state_dict[key] = torch.stack(state_dict[key]).contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args)


def stop_exploring(module: nn.Module, ready: bool) -> dict[str, float]:
    """``random_actions``: whether the batches just received acted uniformly (``module``'s
    ``explore`` flag); the flag is cleared once the learner is ``ready`` to learn.

    Examples
    --------
    >>> m = nn.Module(); m.register_buffer("explore", torch.tensor(1.0))
    >>> stop_exploring(m, ready=True), float(m.explore)
    ({'random_actions': 1.0}, 0.0)
    """
    random_actions = float(module.explore)
    if ready:
        module.explore.fill_(0.0)
    return {"random_actions": random_actions}


class BoxLearner(ReplayLearner):
    """A continuous-action learner's shared part (SAC's, TD3's): an iteration's gradient
    steps on one uniform sample of the replay, each by the subclass's :meth:`_step`; the
    actors told to stop exploring once learning starts; ``actor``'s weights for them.

    A subclass sets ``actor`` (the policy module, with an ``explore`` buffer), ``hyper``
    (with ``batch_size``), ``device``, the twin critics ``qf`` with their parameters
    ``q_params`` and optimiser ``q_optimizer``, and writes :meth:`_step`.
    """

    actor: nn.Module
    hyper: Any
    device: str
    qf: TwinQ
    q_params: list[Tensor]
    q_optimizer: torch.optim.Optimizer

    def _fit_critics(self, obs: Tensor, act: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Both critics' loss towards ``target``, its gradients and the Adam step (part of a
        compiled step as of an eager one); returns the loss and the first critic's mean
        value."""
        q = self.qf.both(obs, act)  # [2, B]: both critics' losses as one mean, doubled
        qf_loss = 2 * F.mse_loss(q, target.expand_as(q))
        with torch.no_grad():  # outside the graph autograd.grad consumes: no graph break
            loss_value, q1 = qf_loss.clone(), q[0].mean()
        clipped_step(self.q_optimizer, self.q_params,
                     torch.autograd.grad(qf_loss, self.q_params), [], 0.0)
        return loss_value, q1

    @abstractmethod
    def _step(self, b: dict[str, Tensor], means: TensorMeans) -> None:
        """One gradient step on the minibatch ``b`` (tensors of :data:`FIELDS`)."""

    def schedule(self, progress: float) -> dict[str, float]:
        """``random_actions`` of this update's batches; exploring stops once ready."""
        return stop_exploring(self.actor, self.ready)

    def train(self, ends: list[int], progress: float, means: TensorMeans) -> None:
        """``len(ends)`` gradient steps on one sample of the replay (:meth:`_step`)."""
        mb = minibatches(self.replay, len(ends), self.hyper.batch_size, FIELDS, self.device)
        for i in range(len(ends)):
            self._step({k: v[i] for k, v in mb.items()}, means)

    def gradient_step(self, sample: dict[str, Any]) -> dict[str, float]:
        """One gradient step on ``sample`` (see :meth:`_step`); its losses and values."""
        means = TensorMeans()
        self._step(as_tensors(sample, FIELDS, self.device), means)
        return {f"losses/{k}": v for k, v in means.means().items()}

    def weights(self) -> dict[str, Tensor]:
        """A CPU copy of the actor (with its ``explore`` flag) for the actors."""
        return cpu_copy(self.actor)


class BoxActor(ABC):
    """Role ``rollout`` of a continuous-action off-policy algorithm: envs, a copy of the
    learner's policy module, and uniform random actions while its ``explore`` flag is set.

    A subclass says how its module is built (:meth:`make_module`) and how it acts
    (:meth:`act`); ``**settings`` are its own (kept by :meth:`resized`).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int,
                 hidden: tuple[int, ...] = (256, 256), n_step: int = 1, gamma: float = 0.99,
                 step_cost: StepCost = NO_COST, **settings: Any) -> None:
        self.env_id, self.num_envs, self.seed, self.hidden = env_id, num_envs, seed, hidden
        self.settings = settings
        self.collector = TransitionCollector(env_id, num_envs, seed, n_step, gamma, step_cost)
        obs_dim, self.low, self.high = box_dims(env_id, self.algo)
        self.actor = self.make_module(obs_dim, self.low, self.high, hidden)
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1

    algo = "an off-policy continuous-control algorithm"
    """The algorithm's name, for the one line refusing a non-Box env."""

    @abstractmethod
    def make_module(self, obs_dim: int, low: np.ndarray, high: np.ndarray,
                    hidden: tuple[int, ...]) -> nn.Module:
        """The policy module the learner's weights load into (with an ``explore`` buffer)."""

    @abstractmethod
    def act(self, obs: Tensor) -> Tensor:
        """Actions (within the bounds) for ``obs`` when learning has started."""

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's actor weights unless this version is already loaded."""
        if version != self.version:
            self.actor.load_state_dict(weights)
            self.version = version

    def resized(self, num_envs: int, seed: int) -> BoxActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        col = self.collector
        return type(self)(self.env_id, num_envs, seed, self.hidden, col.n_step, col.gamma,
                          col.step_cost, **self.settings)

    def rollout(self, num_steps: int) -> Batch:
        """``num_steps`` steps of every env (uniform random actions while exploring), as
        transitions."""
        explore = bool(self.actor.explore)

        def choose(obs: np.ndarray) -> np.ndarray:
            if explore:
                return self.rng.uniform(self.low, self.high, (len(obs), len(self.low))).astype(
                    np.float32)
            with torch.inference_mode():
                return self.act(torch.as_tensor(obs, dtype=torch.float32)).numpy()

        batch = self.collector.collect(num_steps, choose)
        batch["stats"].update(policy_version=self.version, random_actions=int(explore))
        return batch

    def close(self) -> None:
        """Close the envs."""
        self.collector.close()
