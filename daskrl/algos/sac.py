"""SAC for continuous actions: twin Q-networks, a tanh-squashed Gaussian policy and automatic
entropy tuning (CleanRL's ``sac_continuous_action`` maths), with its replay resident in the
learner as DQN's is (:mod:`daskrl.algos.dqn_learner`).

The learner takes an iteration's minibatches from the replay in one sample, steps fused Adam
optimisers, moves the target critics with one call and reads its losses once per iteration
(:mod:`daskrl.algos.offpolicy`); the actor's loss is differentiated for the actor's
parameters only (the critics' gradients of it were never used).

Until the replay holds ``learning_starts`` transitions the actors act uniformly at random:
the learner says so through a buffer of the policy (``explore``) that travels with the
weights, as DQN's epsilon does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from daskrl.algos.ensemble import StackedMLP
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.offpolicy import (
    TensorMeans,
    adam,
    as_tensors,
    minibatches,
    optimizer_state,
    polyak_,
    restore_replay,
)
from daskrl.algos.qnet import relu_mlp
from daskrl.algos.replay_buffers import make_replay
from daskrl.algos.squashed_gaussian import (  # re-exported
    LOG_STD_MAX,
    LOG_STD_MIN,
    SquashedGaussian,
    SquashedPolicy,
)
from daskrl.algos.transitions import TransitionCollector

Batch = dict[str, Any]
FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")

__all__ = ["FIELDS", "LOG_STD_MAX", "LOG_STD_MIN", "SACActor", "SACHyper", "SACLearner",
           "SquashedGaussian", "SquashedPolicy", "TwinQ", "box_dims", "sac_policy"]


def box_dims(env_id: str) -> tuple[int, np.ndarray, np.ndarray]:
    """Flat observation size and the action bounds of ``env_id``; one line naming the action
    space when it is not a Box.

    Examples
    --------
    >>> obs_dim, low, high = box_dims("Pendulum-v1")
    >>> obs_dim, low.tolist(), high.tolist()
    (3, [-2.0], [2.0])
    >>> box_dims("CartPole-v1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: SAC needs a continuous (Box) action space, but CartPole-v1's is Discrete(2): use ...
    """
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Box):
        raise ValueError(f"SAC needs a continuous (Box) action space, but {env_id}'s is "
                         f"{act_space}: use graphs/dqn.py for discrete actions")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"SAC needs a Box observation space, but {env_id}'s is {obs_space}: "
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


class SACActor:
    """Role ``rollout`` for SAC: envs and a policy copy (uniform random actions until the
    learner's weights say learning started).

    Examples
    --------
    >>> actor = SACActor("Pendulum-v1", 2, seed=0, hidden=(16,))
    >>> batch = actor.rollout(8)
    >>> batch["actions"].shape, batch["actions"].dtype
    ((16, 1), dtype('float32'))
    """

    def __init__(self, env_id: str, num_envs: int, seed: int,
                 hidden: tuple[int, ...] = (256, 256), n_step: int = 1, gamma: float = 0.99,
                 step_cost: StepCost = NO_COST) -> None:
        self.env_id, self.num_envs, self.seed, self.hidden = env_id, num_envs, seed, hidden
        self.collector = TransitionCollector(env_id, num_envs, seed, n_step, gamma, step_cost)
        obs_dim, self.low, self.high = box_dims(env_id)
        self.actor = SquashedGaussian(obs_dim, self.low, self.high, hidden)
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's actor weights unless this version is already loaded."""
        if version != self.version:
            self.actor.load_state_dict(weights)
            self.version = version

    def resized(self, num_envs: int, seed: int) -> SACActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        col = self.collector
        return SACActor(self.env_id, num_envs, seed, self.hidden, col.n_step, col.gamma,
                        col.step_cost)

    def rollout(self, num_steps: int) -> Batch:
        """``num_steps`` steps of every env with sampled actions, as transitions."""
        explore = bool(self.actor.explore)

        def choose(obs: np.ndarray) -> np.ndarray:
            if explore:
                return self.rng.uniform(self.low, self.high, (len(obs), len(self.low))).astype(
                    np.float32)
            with torch.inference_mode():
                mean, log_std = self.actor(torch.as_tensor(obs, dtype=torch.float32))
                noise = torch.randn(mean.shape, generator=self.generator)
                act = torch.tanh(mean + log_std.exp() * noise) * self.actor.scale + self.actor.bias
            return act.numpy()

        batch = self.collector.collect(num_steps, choose)
        batch["stats"].update(policy_version=self.version, random_actions=int(explore))
        return batch

    def close(self) -> None:
        """Close the envs."""
        self.collector.close()


@dataclass(frozen=True)
class SACHyper:
    """SAC's update settings (CleanRL's names; see ``graphs/sac.py`` for each flag)."""

    policy_lr: float = 1e-3
    q_lr: float = 1e-3
    batch_size: int = 256
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    tau: float = 0.005
    train_frequency: int = 1
    policy_frequency: int = 1
    target_network_frequency: int = 1
    autotune: bool = True
    alpha: float = 0.2
    save_replay: bool = True


class SACLearner:
    """Role ``learner`` for SAC: actor, twin critics and their targets, entropy
    temperature, optimisers and the replay.

    Examples
    --------
    >>> learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(16,),
    ...                      hyper=SACHyper(learning_starts=8, batch_size=4))
    >>> m = learner.update([SACActor("Pendulum-v1", 2, 0, (16,)).rollout(8)], 0.0)
    >>> m["gradient_steps"], "losses/qf_loss" in m
    (16, True)
    """

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, seed: int,
                 hidden: tuple[int, ...] = (256, 256), hyper: SACHyper = SACHyper(),
                 device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.hyper, self.device = hyper, device
        self.actor = SquashedGaussian(obs_dim, low, high, hidden).to(device)
        self.qf = TwinQ(obs_dim, len(low), hidden).to(device)
        self.qf_target = copy.deepcopy(self.qf)
        self.q_params = list(self.qf.parameters())
        self.target_params = list(self.qf_target.parameters())
        self.actor_params = list(self.actor.body.parameters())
        self.q_optimizer = adam(self.q_params, hyper.q_lr)
        self.actor_optimizer = adam(self.actor_params, hyper.policy_lr)
        self.target_entropy = -float(len(low))
        self.log_alpha = torch.zeros(1, requires_grad=True, device=device)
        if not hyper.autotune:
            self.log_alpha.data.fill_(math.log(hyper.alpha))
        self.a_optimizer = adam([self.log_alpha], hyper.q_lr)
        self.replay = make_replay(hyper.buffer_size, False, seed=seed)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        """The update's own noise (on the learner's device, so a GPU resume is exact too):
        torch's global generator is shared with every other task in the worker's process."""
        self.env_steps = 0
        self.gradient_steps = 0
        self.replay_lost = 0
        """Transitions lost when this learner was restored from a state without its replay;
        reported (then reset) by the next update."""

    def update(self, batches: list[Batch], progress: float) -> dict[str, float]:
        """Add the batches to the replay, then one gradient step per ``train_frequency`` new
        env steps once the replay holds ``learning_starts`` transitions."""
        h = self.hyper
        for batch in batches:
            self.replay.add(batch)
        before = self.env_steps
        self.env_steps += sum(int(b["stats"]["env_steps"]) for b in batches)
        means = TensorMeans()
        random_actions = float(self.actor.explore)  # what this update's batches acted with
        steps = 0
        if len(self.replay) >= max(1, h.learning_starts):
            self.actor.explore.fill_(0.0)
            tf = max(1, h.train_frequency)
            steps = self.env_steps // tf - before // tf
            if steps:
                mb = minibatches(self.replay, steps, h.batch_size, FIELDS, self.device)
                for i in range(steps):
                    self._step({k: v[i] for k, v in mb.items()}, means)
        metrics = {f"losses/{k}": v for k, v in means.means().items()}
        metrics.update(gradient_steps=steps, learner_env_steps=self.env_steps,
                       random_actions=random_actions,
                       replay_size=len(self.replay), replay_bytes=self.replay.nbytes,
                       replay_capacity=self.replay.capacity, replay_lost=self.replay_lost)
        self.replay_lost = 0
        return metrics

    def gradient_step(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """One gradient step on ``sample`` (see :meth:`_step`); its losses and values."""
        means = TensorMeans()
        self._step(as_tensors(sample, FIELDS, self.device), means)
        return {f"losses/{k}": v for k, v in means.means().items()}

    def _step(self, b: dict[str, Tensor], means: TensorMeans) -> None:
        """One critic step; every ``policy_frequency`` steps as many actor (and temperature)
        steps; then the targets move by Polyak averaging."""
        h = self.hyper
        obs, act, nxt = b["obs"], b["actions"], b["next_obs"]
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = self.actor.sample(nxt, self.generator)
            smaller = self.qf_target.both(nxt, next_act).amin(0)
            target = b["rewards"] + b["discounts"] * (smaller - alpha * next_logp)
        q = self.qf.both(obs, act)  # [2, B]: both critics' losses as one mean, doubled
        qf_loss = 2 * F.mse_loss(q, target.expand_as(q))
        self.q_optimizer.zero_grad()
        qf_loss.backward()
        self.q_optimizer.step()
        means.add("qf_loss", qf_loss)
        means.add("qf1_values", q[0])
        self.gradient_steps += 1
        if self.gradient_steps % h.policy_frequency == 0:
            for _ in range(h.policy_frequency):  # delayed, then as many (CleanRL)
                pi, logp = self.actor.sample(obs, self.generator)
                actor_loss = (alpha * logp - self.qf.both(obs, pi).amin(0)).mean()
                self.actor_optimizer.zero_grad()
                # the actor's gradients only: the critics' would be cleared unused
                torch.autograd.backward(actor_loss, inputs=self.actor_params)
                self.actor_optimizer.step()
                if h.autotune:
                    with torch.no_grad():
                        _, logp = self.actor.sample(obs, self.generator)
                    alpha_loss = (-self.log_alpha.exp() * (logp + self.target_entropy)).mean()
                    self.a_optimizer.zero_grad()
                    alpha_loss.backward()
                    self.a_optimizer.step()
                    alpha = self.log_alpha.exp().detach()
            means.add("actor_loss", actor_loss)
            means.add("alpha", alpha)
        if self.gradient_steps % h.target_network_frequency == 0:
            polyak_(self.target_params, self.q_params, h.tau)

    def weights(self) -> dict[str, Tensor]:
        """A CPU copy of the actor (with its ``explore`` flag) for the actors."""
        return {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimisers, temperature, counters, the noise generator's state and
        (unless ``save_replay`` is off) the replay."""
        state = self._state()
        if self.hyper.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def light_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` without the replay's contents (capability ``light-state``):
        what outputs between checkpoints carry, instead of a copy of the whole buffer."""
        return {**self._state(), "light": True}

    def _state(self) -> dict[str, Any]:
        def cpu(module: nn.Module) -> dict[str, Tensor]:
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}

        return {
            "model": self.weights(), "qf": cpu(self.qf), "qf_target": cpu(self.qf_target),
            "log_alpha": self.log_alpha.detach().cpu().clone(),
            "q_optimizer": optimizer_state(self.q_optimizer),
            "actor_optimizer": optimizer_state(self.actor_optimizer),
            "a_optimizer": optimizer_state(self.a_optimizer), "env_steps": self.env_steps,
            "gradient_steps": self.gradient_steps, "replay_size": len(self.replay),
            "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` or :meth:`light_state_dict`; without the replay's
        contents the buffer restarts empty, says so, and the next update reports the
        transitions lost (``replay_lost``)."""
        self.actor.load_state_dict(state["model"])
        self.qf.load_state_dict(state["qf"])
        self.qf_target.load_state_dict(state["qf_target"])
        self.log_alpha.data.copy_(state["log_alpha"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.a_optimizer.load_state_dict(state["a_optimizer"])
        self.env_steps, self.gradient_steps = int(state["env_steps"]), int(state["gradient_steps"])
        if "generator" in state:  # a state from before the learner had its own keeps the seed's
            self.generator.set_state(state["generator"])
        self.replay_lost = restore_replay(self.replay, state)


def sac_policy(env_id: str, hidden: tuple[int, ...], weights: dict[str, Tensor],
               deterministic: bool = True) -> nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``).

    Examples
    --------
    >>> w = SquashedGaussian(3, np.array([-2.0]), np.array([2.0]), (8,)).state_dict()
    >>> sac_policy("Pendulum-v1", (8,), w)(torch.zeros(2, 3)).shape
    torch.Size([2, 1])
    """
    obs_dim, low, high = box_dims(env_id)
    actor = SquashedGaussian(obs_dim, low, high, hidden)
    actor.load_state_dict(weights)
    return actor.policy(deterministic).eval()
