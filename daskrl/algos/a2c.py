"""Advantage actor-critic (A2C/A3C) losses, a gradient-computing actor and its learner.

A3C: each :class:`GradientActor` rolls out ``rollout_steps`` steps with its copy of the
weights and returns the loss gradient; :class:`A2CLearner` applies gradients as they
arrive (``apply_gradients``). Under a synchronous distribution the same learner does one
A2C step per iteration on the actors' batches (``update``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .actor_critic import ActorCriticLearner, VecEnvActor
from .networks import DiscreteActorCritic
from .ppo import PPOHyper, clip_grad_norm


@dataclass(frozen=True)
class A2CHyper:
    """A2C settings."""

    learning_rate: float = 1e-3
    """Adam step size (annealed linearly to 0 when ``anneal_lr``)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly over the run."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (applied by the learner to each gradient it applies)."""
    norm_adv: bool = False
    """Normalise advantages per batch."""


def a2c_loss(net: DiscreteActorCritic, batch: dict[str, np.ndarray], hp: A2CHyper
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient + value + entropy loss on one batch, and its parts.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> b = {"obs": np.zeros((3, 4), np.float32), "actions": np.zeros(3, np.int64),
    ...      "advantages": np.ones(3, np.float32), "returns": np.ones(3, np.float32)}
    >>> loss, parts = a2c_loss(net, b, A2CHyper())
    >>> loss.shape, sorted(parts)[0]
    (torch.Size([]), 'losses/entropy')
    """
    dev = next(net.parameters()).device
    obs = torch.as_tensor(batch["obs"], device=dev)
    actions = torch.as_tensor(batch["actions"], device=dev)
    adv = torch.as_tensor(batch["advantages"], device=dev)
    returns = torch.as_tensor(batch["returns"], device=dev)
    if hp.norm_adv and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    logp, entropy, values = net.evaluate(obs, actions)
    pg = -(adv * logp).mean()
    vf = 0.5 * ((returns - values) ** 2).mean()
    ent = entropy.mean()
    loss = pg + hp.vf_coef * vf - hp.ent_coef * ent
    return loss, {"losses/policy_loss": pg.item(), "losses/value_loss": vf.item(),
                  "losses/entropy": ent.item()}


class GradientActor(VecEnvActor):
    """A :class:`VecEnvActor` that also returns the A2C gradient of its own rollout.

    Examples
    --------
    >>> actor = GradientActor("CartPole-v1", num_envs=2, seed=0, rollout_steps=4)
    >>> grads, stats = actor.gradients()
    >>> len(grads) == len(list(actor.net.parameters())), stats["rollout_steps"]
    (True, 4)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (64, 64),
                 gamma: float = 0.99, gae_lambda: float = 1.0, step_cost: float = 0.0,
                 rollout_steps: int = 8, hp: A2CHyper | None = None) -> None:
        super().__init__(env_id, num_envs, seed, hidden, gamma, gae_lambda, step_cost)
        self.rollout_steps = rollout_steps
        self.hp = hp or A2CHyper()

    def resized(self, num_envs: int, seed: int) -> GradientActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        rec = self.recorder
        return GradientActor(self.env_id, num_envs, seed, self.hidden, rec.gamma, rec.gae_lambda,
                             self.step_cost, self.rollout_steps, self.hp)

    def gradients(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Roll out ``rollout_steps`` steps; return the loss gradients (CPU) and the stats."""
        batch = self.rollout(self.rollout_steps)
        loss, parts = a2c_loss(self.net, batch, self.hp)
        params = list(self.net.parameters())
        grads = torch.autograd.grad(loss, params)
        stats = batch["stats"]
        stats.update(parts, rollout_steps=self.rollout_steps)
        return [g.detach() for g in grads], stats


class A2CLearner(ActorCriticLearner):
    """Actor-critic network and Adam optimiser stepped by A2C gradients.

    Examples
    --------
    >>> learner = A2CLearner(4, 2, seed=0)
    >>> actor = GradientActor("CartPole-v1", 2, seed=0, rollout_steps=4)
    >>> actor.set_weights(learner.weights(), 0)
    >>> learner.apply_gradients(actor.gradients()[0], progress=0.0)["charts/learning_rate"]
    0.001
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (64, 64), hp: A2CHyper | None = None,
                 device: str = "cpu") -> None:
        self.a2c = hp or A2CHyper()
        base = PPOHyper(learning_rate=self.a2c.learning_rate, anneal_lr=self.a2c.anneal_lr)
        super().__init__(obs_dim, num_actions, seed, hidden, base, device)

    def _step(self, progress: float) -> float:
        lr = self.a2c.learning_rate * ((1.0 - progress) if self.a2c.anneal_lr else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clip_grad_norm([self.flat.tensor.grad], self.a2c.max_grad_norm)
        self.optimizer.step()
        self._weights = None
        return lr

    def apply_gradients(self, grads: list[torch.Tensor], progress: float) -> dict[str, float]:
        """One Adam step with gradients computed by an actor (clipped here)."""
        self.flat.attach()
        params = list(self.net.parameters())
        if len(grads) != len(params):
            raise ValueError(f"got {len(grads)} gradients for {len(params)} parameters")
        for p, g in zip(params, grads, strict=True):
            p.grad.copy_(g)  # into the flat gradient the optimiser steps with
        return {"charts/learning_rate": self._step(progress)}

    def update(self, batches: list[dict[str, Any]], progress: float,
               grad_hook: Any = None) -> dict[str, float]:
        """Synchronous A2C: one step on the concatenated batches."""
        keys = [k for k in batches[0] if k != "stats"]
        batch = {k: np.concatenate([b[k] for b in batches]) for k in keys}
        self.flat.attach()
        self.optimizer.zero_grad(set_to_none=False)
        loss, parts = a2c_loss(self.net, batch, self.a2c)
        loss.backward()
        if grad_hook is not None:
            grad_hook([self.flat.tensor.grad])
        parts["charts/learning_rate"] = self._step(progress)
        return parts

    def gradient_steps(self) -> int:
        """One backward pass per :meth:`update`."""
        return 1
