"""TD3 (Fujimoto et al. 2018) for continuous actions: a deterministic actor, twin critics
whose smaller value is the target, target policy smoothing (clipped noise on the target
actor's action) and delayed actor and target updates (CleanRL's ``td3_continuous_action``
maths).

Only the maths is here: the replay's feeding, the gradient-step accounting and the state are
:class:`~daskrl.algos.replay_learner.ReplayLearner`'s; the twin critics, the Box checks and
the actors' uniform exploration before learning starts are
:mod:`daskrl.algos.box_control`'s, as SAC's are.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.box_control import BoxActor, BoxLearner, TwinQ, box_dims
from daskrl.algos.compiled_step import CompiledStep
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.gradient_update import clipped_step
from daskrl.algos.layers import run_mlp
from daskrl.algos.offpolicy import (
    TensorMeans,
    adam,
    cpu_copy,
    load_optimizer_state,
    optimizer_state,
    polyak_,
)
from daskrl.algos.qnet import relu_mlp
from daskrl.algos.replay_buffers import make_replay
from daskrl.algos.seeding import seeded_init


class DeterministicActor(nn.Module):
    """``obs -> tanh(MLP(obs))`` scaled to the action bounds, with an ``explore`` buffer
    (1 while the actors should act uniformly at random).

    Examples
    --------
    >>> pi = DeterministicActor(3, np.array([-2.0]), np.array([2.0]), (16,))
    >>> a = pi(torch.zeros(5, 3))
    >>> a.shape, bool((a.abs() <= 2).all())
    (torch.Size([5, 1]), True)
    """

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray,
                 hidden: tuple[int, ...] = (400, 300)) -> None:
        super().__init__()
        self.body = relu_mlp(obs_dim, len(low), hidden)
        low_t = torch.as_tensor(low, dtype=torch.float32)
        high_t = torch.as_tensor(high, dtype=torch.float32)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("bias", (high_t + low_t) / 2)
        self.register_buffer("low", low_t)
        self.register_buffer("high", high_t)
        self.register_buffer("explore", torch.tensor(1.0))

    def forward(self, obs: Tensor) -> Tensor:
        """Actions within the bounds."""
        x = run_mlp(self.body, obs.float().reshape(obs.shape[0], -1))
        return torch.tanh(x) * self.scale + self.bias


class TD3Actor(BoxActor):
    """Role ``rollout`` for TD3: the deterministic actor's action plus Gaussian noise of
    ``exploration_noise`` times the action scale, clipped to the bounds (uniform random
    actions until learning starts).

    Examples
    --------
    >>> actor = TD3Actor("Pendulum-v1", 2, seed=0, hidden=(16,), exploration_noise=0.1)
    >>> actor.rollout(8)["actions"].shape
    (16, 1)
    >>> actor.resized(3, seed=1).settings
    {'exploration_noise': 0.1}
    """

    algo = "TD3"

    def __init__(self, env_id: str, num_envs: int, seed: int,
                 hidden: tuple[int, ...] = (400, 300), n_step: int = 1, gamma: float = 0.99,
                 step_cost: StepCost = NO_COST, exploration_noise: float = 0.1) -> None:
        super().__init__(env_id, num_envs, seed, hidden, n_step, gamma, step_cost,
                         exploration_noise=exploration_noise)
        self.exploration_noise = exploration_noise

    def make_module(self, obs_dim: int, low: np.ndarray, high: np.ndarray,
                    hidden: tuple[int, ...]) -> DeterministicActor:
        """The deterministic actor."""
        return DeterministicActor(obs_dim, low, high, hidden)

    def act(self, obs: Tensor) -> Tensor:
        """The actor's action with exploration noise (the actor's own generator)."""
        mean = self.actor(obs)
        noise = torch.randn(mean.shape, generator=self.generator)
        noise = noise * (self.exploration_noise * self.actor.scale)
        return torch.maximum(torch.minimum(mean + noise, self.actor.high), self.actor.low)


@dataclass(frozen=True)
class TD3Hyper:
    """TD3's update settings (CleanRL's names; see ``graphs/td3.py`` for each flag)."""

    learning_rate: float = 1e-3
    batch_size: int = 256
    buffer_size: int = 200_000
    learning_starts: int = 10_000
    tau: float = 0.005
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_frequency: int = 2
    train_frequency: int = 1
    save_replay: bool = True
    compile: bool = False

    def __post_init__(self) -> None:
        if self.policy_frequency < 1:
            raise ValueError(f"policy_frequency must be >= 1, got {self.policy_frequency}")


class TD3Learner(BoxLearner):
    """Role ``learner`` for TD3: actor and twin critics, their targets, two optimisers and
    the replay.

    Examples
    --------
    >>> learner = TD3Learner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(16,),
    ...                      hyper=TD3Hyper(learning_starts=8, batch_size=4))
    >>> m = learner.update([TD3Actor("Pendulum-v1", 2, 0, (16,)).rollout(8)], 0.0)
    >>> m["gradient_steps"], "losses/actor_loss" in m
    (16, True)
    """

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, seed: int,
                 hidden: tuple[int, ...] = (400, 300), hyper: TD3Hyper = TD3Hyper(),
                 device: str = "cpu") -> None:
        with seeded_init(seed):  # weights from the seed alone (algos.seeding)
            super().__init__(make_replay(hyper.buffer_size, False, seed=seed),
                             hyper.learning_starts, hyper.train_frequency, hyper.save_replay)
            self.hyper, self.device = hyper, device
            self.actor = DeterministicActor(obs_dim, low, high, hidden).to(device)
            self.actor_target = copy.deepcopy(self.actor)
            self.qf = TwinQ(obs_dim, len(low), hidden).to(device)
            self.qf_target = copy.deepcopy(self.qf)
            self.actor_params = list(self.actor.body.parameters())
            self.q_params = list(self.qf.parameters())
            self.targets = [*self.actor_target.body.parameters(), *self.qf_target.parameters()]
            self.sources = [*self.actor_params, *self.q_params]
            self.q_optimizer = adam(self.q_params, hyper.learning_rate, compiled=hyper.compile)
            self.actor_optimizer = adam(self.actor_params, hyper.learning_rate,
                                        compiled=hyper.compile)
            self.generator = torch.Generator(device=device).manual_seed(seed)
            """The target smoothing noise's own generator (on the learner's device)."""
            self.compiled: tuple[CompiledStep, CompiledStep] | None = None
            """The critic's and the actor's whole steps compiled (``hyper.compile``), else
            None."""
            if hyper.compile:
                self.compiled = (CompiledStep(self._critic_fit), CompiledStep(self._actor_fit))

    def _step(self, b: dict[str, Tensor], means: TensorMeans) -> None:
        """One critic step towards the smoothed target; every ``policy_frequency`` steps an
        actor step on the first critic, then every target moves by Polyak averaging.

        The smoothing noise is drawn here from the learner's generator, compiled or not, so
        both paths see the same numbers."""
        h = self.hyper
        critic, actor = self._critic_fit, self._actor_fit
        if self.compiled is not None:
            critic, actor = self.compiled
        act = b["actions"]
        noise = torch.randn(act.shape, generator=self.generator, device=act.device)
        qf_loss, q1 = critic(b["obs"], act, b["next_obs"], b["rewards"], b["discounts"], noise)
        means.add("qf_loss", qf_loss)
        means.add("qf1_values", q1)
        self.gradient_steps += 1
        if self.gradient_steps % h.policy_frequency == 0:
            means.add("actor_loss", actor(b["obs"]))
            polyak_(self.targets, self.sources, h.tau)

    def _critic_fit(self, obs: Tensor, act: Tensor, nxt: Tensor, rewards: Tensor,
                    discounts: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """The critics' whole step: the target actor's action smoothed by the clipped
        ``noise``, the smaller target critic's value, both critics' loss, its gradients and
        the Adam step; returns the loss and the first critic's mean value."""
        h, actor = self.hyper, self.actor
        with torch.no_grad():
            noise = (noise * h.policy_noise).clamp(-h.noise_clip, h.noise_clip) * actor.scale
            next_act = torch.maximum(torch.minimum(self.actor_target(nxt) + noise, actor.high),
                                     actor.low)
            target = rewards + discounts * self.qf_target.both(nxt, next_act).amin(0)
        return self._fit_critics(obs, act, target)

    def _actor_fit(self, obs: Tensor) -> Tensor:
        """One actor step up the first critic (the actor's gradients only: the critics'
        would be unused); returns its loss."""
        actor_loss = -self.qf.both(obs, self.actor(obs))[0].mean()
        with torch.no_grad():
            loss_value = actor_loss.clone()
        clipped_step(self.actor_optimizer, self.actor_params,
                     torch.autograd.grad(actor_loss, self.actor_params), [], 0.0)
        return loss_value

    def model_state(self) -> dict[str, Any]:
        """Networks, their targets, optimisers and the noise generator's state (CPU)."""
        return {"model": self.weights(), "actor_target": cpu_copy(self.actor_target),
                "qf": cpu_copy(self.qf), "qf_target": cpu_copy(self.qf_target),
                "q_optimizer": optimizer_state(self.q_optimizer),
                "actor_optimizer": optimizer_state(self.actor_optimizer),
                "generator": self.generator.get_state()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`model_state` gave."""
        self.actor.load_state_dict(state["model"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.qf.load_state_dict(state["qf"])
        self.qf_target.load_state_dict(state["qf_target"])
        load_optimizer_state(self.q_optimizer, state["q_optimizer"])
        load_optimizer_state(self.actor_optimizer, state["actor_optimizer"])
        self.generator.set_state(state["generator"])


def td3_policy(env_id: str, hidden: tuple[int, ...], weights: dict[str, Tensor],
               deterministic: bool = True) -> nn.Module:
    """The trained actor of ``weights`` alone (``Algorithm.make_policy``); TD3's policy is
    deterministic either way (its exploration noise belongs to training).

    Examples
    --------
    >>> w = DeterministicActor(3, np.array([-2.0]), np.array([2.0]), (8,)).state_dict()
    >>> td3_policy("Pendulum-v1", (8,), w)(torch.zeros(2, 3)).shape
    torch.Size([2, 1])
    """
    obs_dim, low, high = box_dims(env_id, "TD3")
    actor = DeterministicActor(obs_dim, low, high, hidden)
    actor.load_state_dict(weights)
    return actor.eval()
