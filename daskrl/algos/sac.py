"""SAC for continuous actions: twin Q-networks, a tanh-squashed Gaussian policy and automatic
entropy tuning (CleanRL's ``sac_continuous_action`` maths), with its replay resident in the
learner as DQN's is (:mod:`daskrl.algos.dqn_learner`).

The learner takes an iteration's minibatches from the replay in one sample, steps fused Adam
optimisers, moves the target critics with one call and reads its losses once per iteration
(:mod:`daskrl.algos.offpolicy`); the actor's loss is differentiated for the actor's
parameters only (the critics' gradients of it were never used).

Until the replay holds ``learning_starts`` transitions the actors act uniformly at random
(:mod:`daskrl.algos.box_control`); the replay's feeding, the gradient-step accounting and the
state are :class:`~daskrl.algos.replay_learner.ReplayLearner`'s.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.box_control import BoxActor, BoxLearner, TwinQ, box_dims
from daskrl.algos.compiled_step import CompiledStep
from daskrl.algos.gradient_update import clipped_step
from daskrl.algos.offpolicy import (
    TensorMeans,
    adam,
    cpu_copy,
    load_optimizer_state,
    optimizer_state,
    polyak_,
)
from daskrl.algos.replay_buffers import make_replay
from daskrl.algos.seeding import seeded_init
from daskrl.algos.squashed_gaussian import SquashedGaussian

Batch = dict[str, Any]

__all__ = ["SACActor", "SACHyper", "SACLearner", "sac_policy"]


class SACActor(BoxActor):
    """Role ``rollout`` for SAC: envs and a policy copy sampling squashed Gaussian actions
    (uniform random ones until the learner's weights say learning started).

    Examples
    --------
    >>> actor = SACActor("Pendulum-v1", 2, seed=0, hidden=(16,))
    >>> batch = actor.rollout(8)
    >>> batch["actions"].shape, batch["actions"].dtype
    ((16, 1), dtype('float32'))
    """

    algo = "SAC"

    def make_module(self, obs_dim: int, low: np.ndarray, high: np.ndarray,
                    hidden: tuple[int, ...]) -> SquashedGaussian:
        """The squashed Gaussian policy."""
        return SquashedGaussian(obs_dim, low, high, hidden)

    def act(self, obs: Tensor) -> Tensor:
        """A sample of the squashed Gaussian (the actor's own generator)."""
        mean, log_std = self.actor(obs)
        noise = torch.randn(mean.shape, generator=self.generator)
        return torch.tanh(mean + log_std.exp() * noise) * self.actor.scale + self.actor.bias


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
    temperature_loss: Literal["alpha", "log_alpha"] = "alpha"
    """What the temperature's loss multiplies: ``alpha`` (CleanRL: its gradient in log space
    shrinks with the temperature) or ``log_alpha`` (the SAC authors' code and SB3: a step of
    the same size in log space whatever the temperature)."""
    save_replay: bool = True
    compile: bool = False


class SACLearner(BoxLearner):
    """Role ``learner`` for SAC: actor, twin critics and their targets, entropy
    temperature, optimisers and the replay (fed and checkpointed by
    :class:`~daskrl.algos.replay_learner.ReplayLearner`).

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
        with seeded_init(seed):  # weights from the seed alone (algos.seeding)
            super().__init__(make_replay(hyper.buffer_size, False, seed=seed),
                             hyper.learning_starts, hyper.train_frequency, hyper.save_replay)
            self.hyper, self.device = hyper, device
            self.actor = SquashedGaussian(obs_dim, low, high, hidden).to(device)
            self.qf = TwinQ(obs_dim, len(low), hidden).to(device)
            self.qf_target = copy.deepcopy(self.qf)
            self.q_params = list(self.qf.parameters())
            self.target_params = list(self.qf_target.parameters())
            self.actor_params = list(self.actor.body.parameters())
            c = hyper.compile
            self.q_optimizer = adam(self.q_params, hyper.q_lr, compiled=c)
            self.actor_optimizer = adam(self.actor_params, hyper.policy_lr, compiled=c)
            self.target_entropy = -float(len(low))
            self.log_alpha = torch.zeros(1, requires_grad=True, device=device)
            if not hyper.autotune:
                self.log_alpha.data.fill_(math.log(hyper.alpha))
            self.a_optimizer = adam([self.log_alpha], hyper.q_lr, compiled=c)
            self.compiled: tuple[CompiledStep, CompiledStep] | None = None
            """The critic's and the actor's (with the temperature's) whole steps compiled
            (``hyper.compile``), else None."""
            if c:
                self.compiled = (CompiledStep(self._critic_fit), CompiledStep(self._actor_fit))
            self.generator = torch.Generator(device=device).manual_seed(seed)
            """The update's own noise (on the learner's device, so a GPU resume is exact too):
            torch's global generator is shared with every other task in the worker's process."""

    def _step(self, b: dict[str, Tensor], means: TensorMeans) -> None:
        """One critic step; every ``policy_frequency`` steps as many actor (and temperature)
        steps; then the targets move by Polyak averaging.

        Compiled or not, the noise is drawn here from the learner's generator in the same
        order (the target's next actions, then each actor step's and temperature step's),
        so both paths see the same numbers."""
        h = self.hyper
        critic, actor = self._critic_fit, self._actor_fit
        if self.compiled is not None:
            critic, actor = self.compiled
        obs, act = b["obs"], b["actions"]
        qf_loss, q1 = critic(obs, act, b["next_obs"], b["rewards"], b["discounts"],
                             self._noise(obs))
        means.add("qf_loss", qf_loss)
        means.add("qf1_values", q1)
        self.gradient_steps += 1
        if self.gradient_steps % h.policy_frequency == 0:
            for _ in range(h.policy_frequency):  # delayed, then as many (CleanRL)
                noise = self._noise(obs)
                actor_loss, alpha = actor(obs, noise, self._noise(obs) if h.autotune else noise)
            means.add("actor_loss", actor_loss)
            means.add("alpha", alpha)
        if self.gradient_steps % h.target_network_frequency == 0:
            polyak_(self.target_params, self.q_params, h.tau)

    def _noise(self, obs: Tensor) -> Tensor:
        """The actor's noise for one action per row of ``obs`` (the learner's generator)."""
        return self.actor.noise(obs.shape[0], self.generator)

    def _critic_fit(self, obs: Tensor, act: Tensor, nxt: Tensor, rewards: Tensor,
                    discounts: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """The critics' whole step: the entropy-regularised target (next actions from
        ``noise``), both critics' loss, its gradients and the Adam step; returns the loss
        and the first critic's mean value."""
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = self.actor.squash(nxt, noise)
            smaller = self.qf_target.both(nxt, next_act).amin(0)
            target = rewards + discounts * (smaller - alpha * next_logp)
        return self._fit_critics(obs, act, target)

    def _actor_fit(self, obs: Tensor, noise: Tensor, alpha_noise: Tensor
                   ) -> tuple[Tensor, Tensor]:
        """One actor step (its own parameters' gradients only: the critics' would be
        unused) and, with ``autotune``, one temperature step on fresh actions from
        ``alpha_noise``; returns the actor's loss and the temperature after the step."""
        alpha = self.log_alpha.exp().detach()
        pi, logp = self.actor.squash(obs, noise)
        actor_loss = (alpha * logp - self.qf.both(obs, pi).amin(0)).mean()
        with torch.no_grad():
            loss_value = actor_loss.clone()
        clipped_step(self.actor_optimizer, self.actor_params,
                     torch.autograd.grad(actor_loss, self.actor_params), [], 0.0)
        if self.hyper.autotune:
            with torch.no_grad():
                _, logp = self.actor.squash(obs, alpha_noise)
            scale = self.log_alpha if self.hyper.temperature_loss == "log_alpha" \
                else self.log_alpha.exp()
            alpha_loss = (-scale * (logp + self.target_entropy)).mean()
            clipped_step(self.a_optimizer, [self.log_alpha],
                         torch.autograd.grad(alpha_loss, [self.log_alpha]), [], 0.0)
            alpha = self.log_alpha.exp().detach()
        return loss_value, alpha

    def model_state(self) -> dict[str, Any]:
        """Networks, optimisers, temperature and the noise generator's state (CPU)."""
        return {
            "model": self.weights(), "qf": cpu_copy(self.qf), "qf_target": cpu_copy(self.qf_target),
            "log_alpha": self.log_alpha.detach().cpu().clone(),
            "q_optimizer": optimizer_state(self.q_optimizer),
            "actor_optimizer": optimizer_state(self.actor_optimizer),
            "a_optimizer": optimizer_state(self.a_optimizer),
            "generator": self.generator.get_state()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`model_state` gave."""
        self.actor.load_state_dict(state["model"])
        self.qf.load_state_dict(state["qf"])
        self.qf_target.load_state_dict(state["qf_target"])
        self.log_alpha.data.copy_(state["log_alpha"])
        load_optimizer_state(self.q_optimizer, state["q_optimizer"])
        load_optimizer_state(self.actor_optimizer, state["actor_optimizer"])
        load_optimizer_state(self.a_optimizer, state["a_optimizer"])
        if "generator" in state:  # a state from before the learner had its own keeps the seed's
            self.generator.set_state(state["generator"])


def sac_policy(env_id: str, hidden: tuple[int, ...], weights: dict[str, Tensor],
               deterministic: bool = True) -> nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``).

    Examples
    --------
    >>> w = SquashedGaussian(3, np.array([-2.0]), np.array([2.0]), (8,)).state_dict()
    >>> sac_policy("Pendulum-v1", (8,), w)(torch.zeros(2, 3)).shape
    torch.Size([2, 1])
    """
    obs_dim, low, high = box_dims(env_id, "SAC")
    actor = SquashedGaussian(obs_dim, low, high, hidden)
    actor.load_state_dict(weights)
    return actor.policy(deterministic).eval()
