"""PPO's settings and its loss on a network's minibatch (CleanRL-equivalent maths).

The loss itself is :func:`daskrl.algos.losses.ppo_loss`; the learner that differentiates it
and steps ``torch.optim.Adam`` is :class:`daskrl.algos.learner.ActorCriticLearner`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from daskrl.algos import losses


@dataclass(frozen=True)
class PPOHyper:
    """PPO update settings, named as in CleanRL."""

    update_epochs: int = 4
    """Passes over the rollout batch per update."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    learning_rate: float = 2.5e-4
    """Adam step size (annealed linearly to 0 when ``anneal_lr``)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly over the run."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient."""
    clip_vloss: bool = True
    """Clip the value loss like the surrogate."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL exceeds this."""


def ppo_loss(net: nn.Module, mb: dict[str, Tensor], hp: PPOHyper
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """Total PPO loss of ``net`` on one minibatch and its named parts.

    ``mb`` holds ``obs, actions, logp, values, advantages, returns`` tensors; ``net`` has
    ``evaluate(obs, actions) -> (logp, entropy, value)``.

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> z = torch.zeros(4)
    >>> mb = {"obs": torch.zeros(4, 3), "actions": z.long(), "logp": z, "values": z,
    ...       "advantages": torch.arange(4.0), "returns": z}
    >>> loss, parts = ppo_loss(DiscreteActorCritic(3, 2), mb, PPOHyper())
    >>> loss.requires_grad, sorted(parts)[0]
    (True, 'losses/approx_kl')
    """
    loss, parts = _loss(net, mb, hp)
    return loss, dict(zip(losses.PPO_PARTS, parts.unbind(), strict=True))


def _loss(net: nn.Module, mb: dict[str, Tensor], hp: PPOHyper) -> tuple[Tensor, Tensor]:
    """:func:`ppo_loss` with the parts stacked in :data:`~daskrl.algos.losses.PPO_PARTS`
    order (what a learner differentiates, compiled or not)."""
    new_logp, entropy, new_values = net.evaluate(mb["obs"], mb["actions"])
    return losses.ppo_loss(new_logp, entropy, new_values, mb["logp"], mb["values"],
                           mb["advantages"], mb["returns"], clip_coef=hp.clip_coef,
                           ent_coef=hp.ent_coef, vf_coef=hp.vf_coef, clip_vloss=hp.clip_vloss,
                           norm_adv=hp.norm_adv)


def explained_variance(returns: Tensor, values: Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` (NaN when the returns do not vary).

    Examples
    --------
    >>> explained_variance(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    1.0
    """
    var_y = torch.var(returns) if len(returns) > 1 else torch.tensor(0.0)
    return float("nan") if var_y == 0 else float(1 - torch.var(returns - values) / var_y)
