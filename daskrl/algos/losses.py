"""The losses of every actor-critic learner (PPO, A2C/A3C, MAPPO, IMPALA), as plain torch functions.

Each takes the network's outputs on a minibatch (log-probabilities of the taken actions,
policy entropies, values) and the rollout's tensors, and returns a scalar loss for
autograd to differentiate plus its parts (detached, for the metrics). The maths follows
CleanRL's ``ppo.py`` (clipped surrogate, value loss clipped around the old values, entropy
bonus) and its ``a2c``; :func:`vtrace` follows the IMPALA paper (Espeholt et al. 2018,
section 4.1) and DeepMind's ``scalable_agent/vtrace.py``; nothing here knows a network's
shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

PPO_PARTS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
             "losses/clipfrac")
"""Names of :func:`ppo_loss`'s parts, in the order of its stacked tensor."""
A2C_PARTS = ("losses/policy_loss", "losses/value_loss", "losses/entropy")
"""Names of :func:`a2c_loss`'s parts, in the order of its stacked tensor."""


def normalize(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero-mean, unit-std copy of ``x`` (unbiased std, as CleanRL).

    Examples
    --------
    >>> [round(v, 4) for v in normalize(torch.tensor([1.0, 3.0])).tolist()]
    [-0.7071, 0.7071]
    """
    return (x - x.mean()) / (x.std() + eps)


def policy_loss(advantages: Tensor, ratio: Tensor, clip_coef: float) -> Tensor:
    """Clipped surrogate objective, as a loss to minimise.

    Examples
    --------
    >>> policy_loss(torch.tensor([1.0]), torch.tensor([1.5]), 0.2).item()
    -1.2000000476837158
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(unclipped, clipped).mean()


def value_loss(new_values: Tensor, old_values: Tensor, returns: Tensor, clip_coef: float,
               clip: bool = True) -> Tensor:
    """Half mean squared error to the returns, optionally clipped around the old values.

    Examples
    --------
    >>> value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.2).item()
    2.0
    """
    unclipped = (new_values - returns) ** 2
    if not clip:
        return 0.5 * unclipped.mean()
    v_clipped = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    return 0.5 * torch.max(unclipped, (v_clipped - returns) ** 2).mean()


def ppo_loss(new_logp: Tensor, entropy: Tensor, new_values: Tensor, old_logp: Tensor,
             old_values: Tensor, advantages: Tensor, returns: Tensor, *, clip_coef: float,
             ent_coef: float, vf_coef: float, clip_vloss: bool = True, norm_adv: bool = True
             ) -> tuple[Tensor, Tensor]:
    """PPO's loss on one minibatch, and its :data:`PPO_PARTS` stacked (detached).

    ``loss = policy_loss - ent_coef * entropy + vf_coef * value_loss``; advantages are
    normalised per minibatch when ``norm_adv`` and the minibatch has more than one sample.

    Examples
    --------
    >>> z = torch.zeros(4)
    >>> loss, parts = ppo_loss(z, z + 0.5, z, z, z, torch.ones(4), z, clip_coef=0.2,
    ...                        ent_coef=0.01, vf_coef=0.5, norm_adv=False)
    >>> round(loss.item(), 4), [round(v, 4) for v in parts.tolist()]
    (-1.005, [-1.0, 0.0, 0.5, 0.0, 0.0])
    """
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    adv = normalize(advantages) if norm_adv and advantages.numel() > 1 else advantages
    pg = policy_loss(adv, ratio, clip_coef)
    vf = value_loss(new_values, old_values, returns, clip_coef, clip_vloss)
    ent = entropy.mean()
    loss = pg - ent_coef * ent + vf_coef * vf
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
        parts = torch.stack([pg, vf, ent, approx_kl, clipfrac]).detach()
    return loss, parts


def a2c_loss(logp: Tensor, entropy: Tensor, values: Tensor, advantages: Tensor,
             returns: Tensor, *, ent_coef: float, vf_coef: float, norm_adv: bool = False
             ) -> tuple[Tensor, Tensor]:
    """Advantage actor-critic loss on one batch, and its :data:`A2C_PARTS` stacked (detached).

    ``loss = -mean(A * log pi) + vf_coef * 0.5 * mean((R - V)^2) - ent_coef * entropy``.

    Examples
    --------
    >>> z = torch.zeros(3)
    >>> loss, parts = a2c_loss(z - 1.0, z, z, torch.ones(3), torch.ones(3), ent_coef=0.01,
    ...                        vf_coef=0.5)
    >>> loss.item(), parts.tolist()
    (1.25, [1.0, 0.5, 0.0])
    """
    adv = normalize(advantages) if norm_adv and advantages.numel() > 1 else advantages
    pg = -(adv * logp).mean()
    vf = 0.5 * ((returns - values) ** 2).mean()
    ent = entropy.mean()
    loss = pg + vf_coef * vf - ent_coef * ent
    return loss, torch.stack([pg, vf, ent]).detach()


def vtrace(behaviour_logp: Tensor, target_logp: Tensor, rewards: Tensor, values: Tensor,
           bootstrap_value: Tensor, discounts: Tensor, rho_bar: float = 1.0,
           c_bar: float = 1.0, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """V-trace value targets and policy-gradient advantages (IMPALA), time-major ``[T, B]``.

    With ``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and ``c_t = min(c_bar, ...)``
    (``pi`` the learner's policy, ``mu`` the actor's that acted):

    ``vs_t = V(x_t) + delta_t + discount_t * c_t * (vs_{t+1} - V(x_{t+1}))``, with
    ``delta_t = rho_t * (r_t + discount_t * V(x_{t+1}) - V(x_t))``;
    ``pg_advantage_t = rho_t * (r_t + discount_t * vs_{t+1} - V(x_t))``.

    ``V(x_T)`` and ``vs_T`` are ``bootstrap_value``. On-policy (``mu = pi``) with
    ``rho_bar, c_bar >= 1`` every weight is 1 and ``vs`` are the n-step bootstrapped returns
    (GAE with lambda = 1 plus the values). Everything is computed without gradients: the
    targets are constants of the loss.

    Parameters
    ----------
    behaviour_logp, target_logp : Tensor ``[T, B]``
        Log-probabilities of the taken actions under the acting and the learner's policy.
    rewards, values : Tensor ``[T, B]``
        Reward of step ``t`` and the learner's value of the observation it acted on.
    bootstrap_value : Tensor ``[B]``
        The learner's value of the observation after the last step.
    discounts : Tensor ``[T, B]``
        ``gamma``, or 0 where the episode terminated at step ``t`` (no bootstrap past it).
    rho_bar, c_bar : float
        Truncation of the importance weights in ``delta`` / the advantages, and in the traces.
    valid : Tensor of bool ``[T, B]``, optional
        False for steps that carry no transition (a vector env's reset step after an
        episode ended): their weights are 0, so ``vs`` there is the value itself and no trace
        crosses them; a step truncated just before bootstraps on the value of its final
        observation, which the invalid step acted on.

    Returns
    -------
    vs, pg_advantages : Tensor ``[T, B]``

    Examples
    --------
    >>> z = torch.zeros(2, 1)
    >>> vs, adv = vtrace(z, z, torch.ones(2, 1), z, torch.zeros(1), torch.full((2, 1), 0.5))
    >>> vs[:, 0].tolist(), adv[:, 0].tolist()
    ([1.5, 1.0], [1.5, 1.0])
    """
    with torch.no_grad():
        rhos = torch.exp(target_logp - behaviour_logp)
        if valid is not None:
            rhos = torch.where(valid, rhos, torch.zeros_like(rhos))
        clipped_rhos = torch.clamp(rhos, max=rho_bar)
        cs = torch.clamp(rhos, max=c_bar)
        next_values = torch.cat([values[1:], bootstrap_value[None]], dim=0)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        acc = torch.zeros_like(bootstrap_value)
        vs_minus_v = torch.zeros_like(values)
        for t in range(values.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = vs_minus_v + values
        next_vs = torch.cat([vs[1:], bootstrap_value[None]], dim=0)
        pg_advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs, pg_advantages
