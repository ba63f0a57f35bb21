"""Advantage actor-critic (A2C/A3C): settings, a gradient-computing actor and its learner.

A3C: each :class:`A2CActor` rolls out ``rollout_steps`` steps with its copy of the
weights and returns the gradient of :func:`a2c_gradients` on them; :class:`A2CLearner`
applies gradients as they arrive (``schedule`` then ``apply_gradients``). Under a
synchronous distribution the same learner does one A2C step per iteration on the actors'
batches (``update``: a plan of one minibatch, the whole batch). Actor and learner compute
gradients with the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from daskrl.algos import losses
from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.learner import ActorCriticLearner, Minibatch, batch_tensors
from daskrl.algos.ppo import PPOHyper


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


def a2c_loss(net: nn.Module, mb: Minibatch, hp: A2CHyper) -> tuple[Tensor, Tensor]:
    """:func:`daskrl.algos.losses.a2c_loss` of ``net`` on one batch of tensors.

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> net = DiscreteActorCritic(4, 2)
    >>> mb = {"obs": torch.zeros(3, 4), "actions": torch.zeros(3, dtype=torch.long),
    ...       "advantages": torch.ones(3), "returns": torch.ones(3)}
    >>> loss, parts = a2c_loss(net, mb, A2CHyper())
    >>> loss.shape, parts.shape
    (torch.Size([]), torch.Size([3]))
    """
    logp, entropy, values = net.evaluate(mb["obs"], mb["actions"])
    return losses.a2c_loss(logp, entropy, values, mb["advantages"], mb["returns"],
                           ent_coef=hp.ent_coef, vf_coef=hp.vf_coef, norm_adv=hp.norm_adv)


def a2c_gradients(loss: Any, params: list[Tensor], mb: Minibatch
                  ) -> tuple[list[Tensor], dict[str, float]]:
    """Autograd gradients of ``loss(mb)`` for ``params``, and its named parts.

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> net = DiscreteActorCritic(4, 2)
    >>> mb = {"obs": torch.zeros(3, 4), "actions": torch.zeros(3, dtype=torch.long),
    ...       "advantages": torch.ones(3), "returns": torch.ones(3)}
    >>> grads, parts = a2c_gradients(lambda b: a2c_loss(net, b, A2CHyper()),
    ...                              list(net.parameters()), mb)
    >>> len(grads), sorted(parts)
    (12, ['losses/entropy', 'losses/policy_loss', 'losses/value_loss'])
    """
    value, parts = loss(mb)
    grads = torch.autograd.grad(value, params)
    return list(grads), dict(zip(losses.A2C_PARTS, parts.tolist(), strict=True))


class A2CActor(VecEnvActor):
    """A :class:`VecEnvActor` that also returns the A2C gradient of its own rollout.

    Examples
    --------
    >>> actor = A2CActor("CartPole-v1", num_envs=2, seed=0, rollout_steps=4)
    >>> grads, stats = actor.gradients()
    >>> len(grads) == len(list(actor.net.parameters())), stats["rollout_steps"]
    (True, 4)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (64, 64),
                 gamma: float = 0.99, gae_lambda: float = 1.0, step_cost: StepCost = NO_COST,
                 rollout_steps: int = 8, hp: A2CHyper | None = None) -> None:
        super().__init__(env_id, num_envs, seed, hidden, gamma, gae_lambda, step_cost)
        self.rollout_steps = rollout_steps
        self.hp = hp or A2CHyper()

    def resized(self, num_envs: int, seed: int) -> A2CActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        rec = self.recorder
        return A2CActor(self.env_id, num_envs, seed, self.hidden, rec.gamma, rec.gae_lambda,
                             self.step_cost, self.rollout_steps, self.hp)

    def gradients(self) -> tuple[list[Tensor], dict[str, Any]]:
        """Roll out ``rollout_steps`` steps; return the loss gradients (CPU) and the stats."""
        batch = self.rollout(self.rollout_steps)
        net = self.net
        grads, parts = a2c_gradients(lambda mb: a2c_loss(net, mb, self.hp),
                                     list(net.parameters()), batch_tensors([batch], "cpu"))
        stats = batch["stats"]
        stats.update(parts, rollout_steps=self.rollout_steps)
        return [g.detach() for g in grads], stats


class A2CLearner(ActorCriticLearner):
    """Actor-critic network and Adam optimiser stepped by A2C gradients.

    Examples
    --------
    >>> learner = A2CLearner(4, 2, seed=0)
    >>> actor = A2CActor("CartPole-v1", 2, seed=0, rollout_steps=4)
    >>> actor.set_weights(learner.weights(), 0)
    >>> learner.schedule(0.0)
    {'charts/learning_rate': 0.001}
    >>> learner.apply_gradients(actor.gradients()[0])
    >>> learner.update_plan()
    UpdatePlan(steps=1, statistics=False)
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (64, 64), hp: A2CHyper | None = None,
                 device: str = "cpu", compile: bool = False,
                 network: Callable[[], nn.Module] | None = None) -> None:
        self.a2c = hp or A2CHyper()
        base = PPOHyper(learning_rate=self.a2c.learning_rate, anneal_lr=self.a2c.anneal_lr,
                        max_grad_norm=self.a2c.max_grad_norm, update_epochs=1,
                        num_minibatches=1)
        super().__init__(obs_dim, num_actions, seed, hidden, base, device, compile, network)
        self.parts = losses.A2C_PARTS

    def _loss(self, mb: Minibatch) -> tuple[Tensor, Tensor]:
        return a2c_loss(self.net, mb, self.a2c)

    def minibatches(self, batches: list[Any], progress: float,
                    statistics: Tensor | None = None) -> list[Minibatch]:
        """Synchronous A2C: one step on the concatenated batches, in rollout order."""
        self.schedule(progress)
        self._merge_later(batches, statistics)
        self._data = batch_tensors(batches, self.device)
        return [self._data]
