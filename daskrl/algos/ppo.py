"""PPO losses and update (CleanRL-equivalent maths), as pure torch functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .optim import FlatAdam
from .ppo_grads import numpy_ready, numpy_views, ppo_grads, supports


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


def normalize(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero-mean, unit-std copy of ``x``.

    Examples
    --------
    >>> [round(v, 4) for v in normalize(torch.tensor([1.0, 3.0])).tolist()]
    [-0.7071, 0.7071]
    """
    return (x - x.mean()) / (x.std() + eps)


def policy_loss(
    advantages: torch.Tensor, ratio: torch.Tensor, clip_coef: float
) -> torch.Tensor:
    """Clipped surrogate objective, as a loss to minimise.

    Examples
    --------
    >>> policy_loss(torch.tensor([1.0]), torch.tensor([1.5]), 0.2).item()
    -1.2000000476837158
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(unclipped, clipped).mean()


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_coef: float,
    clip: bool = True,
) -> torch.Tensor:
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


def ppo_loss(
    net: nn.Module, mb: dict[str, torch.Tensor], hp: PPOHyper
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total PPO loss on one minibatch and its parts.

    ``mb`` holds ``obs, actions, logp, values, advantages, returns`` tensors.
    """
    new_logp, entropy, new_values = net.evaluate(mb["obs"], mb["actions"])
    log_ratio = new_logp - mb["logp"]
    ratio = log_ratio.exp()
    adv = normalize(mb["advantages"]) if hp.norm_adv and len(mb["advantages"]) > 1 else (
        mb["advantages"]
    )
    pg = policy_loss(adv, ratio, hp.clip_coef)
    vf = value_loss(new_values, mb["values"], mb["returns"], hp.clip_coef, hp.clip_vloss)
    ent = entropy.mean()
    loss = pg - hp.ent_coef * ent + hp.vf_coef * vf
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clipfrac = ((ratio - 1.0).abs() > hp.clip_coef).float().mean()
    parts = {
        "losses/policy_loss": pg.detach(),
        "losses/value_loss": vf.detach(),
        "losses/entropy": ent.detach(),
        "losses/approx_kl": approx_kl,
        "losses/clipfrac": clipfrac,
    }
    return loss, parts


GradHook = Callable[[list[torch.Tensor]], None]


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale ``grads`` in place to a global L2 norm of at most ``max_norm``; return the norm.

    The maths of ``torch.nn.utils.clip_grad_norm_`` (norm of the per-tensor norms, factor
    ``max_norm / (norm + 1e-6)`` capped at 1) without its per-call bookkeeping, which is
    most of its cost for a small network.

    Examples
    --------
    >>> g = [torch.tensor([3.0, 4.0])]
    >>> float(clip_grad_norm(g, 1.0)), [round(x, 4) for x in g[0].tolist()]
    (5.0, [0.6, 0.8])
    """
    if len(grads) == 1:
        norm = torch.linalg.vector_norm(grads[0])
    else:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


def ppo_update(
    net: nn.Module,
    optimizer: torch.optim.Optimizer | FlatAdam,
    batch: dict[str, np.ndarray],
    hp: PPOHyper,
    generator: torch.Generator,
    lr: float | None = None,
    grad_hook: GradHook | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Run ``update_epochs`` x ``num_minibatches`` clipped-surrogate steps on one batch.

    For a plain :class:`~daskrl.algos.networks.DiscreteActorCritic` the gradients of
    :func:`ppo_loss` are computed by :func:`~daskrl.algos.ppo_grads.ppo_grads` (the same
    maths written out, no autograd graph); any other network goes through autograd.

    Parameters
    ----------
    net : nn.Module
        Network with ``evaluate(obs, actions) -> (logp, entropy, value)``.
    optimizer : torch.optim.Optimizer or FlatAdam
        Optimiser over ``net``'s parameters, or over one flat tensor they are views of
        (:class:`~daskrl.algos.networks.FlatParameters`); its tensors' gradients are what
        is clipped and handed to ``grad_hook``.
    batch : dict of ndarray
        Flat transitions: ``obs, actions, logp, values, advantages, returns``.
    hp : PPOHyper
        Update settings.
    generator : torch.Generator
        Shuffles minibatches (seeded for reproducible runs).
    lr : float, optional
        Learning rate for this update (annealing); default ``hp.learning_rate``.
    grad_hook : callable, optional
        Called with the parameter gradients after backward and before clipping
        (data-parallel gradient averaging plugs in here).
    device : str or torch.device
        Where the update runs.

    Returns
    -------
    dict
        Mean of each loss part over the minibatches, plus ``losses/explained_variance``.

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> net = DiscreteActorCritic(4, 2); opt = torch.optim.Adam(net.parameters())
    >>> b = {"obs": np.zeros((8, 4), np.float32), "actions": np.zeros(8, np.int64),
    ...      "logp": np.full(8, -0.69, np.float32), "values": np.zeros(8, np.float32),
    ...      "advantages": np.ones(8, np.float32), "returns": np.ones(8, np.float32)}
    >>> sorted(ppo_update(net, opt, b, PPOHyper(), torch.Generator()))[0]
    'losses/approx_kl'
    """
    for group in optimizer.param_groups:
        group["lr"] = hp.learning_rate if lr is None else lr
    data = {k: torch.as_tensor(v, device=device) for k, v in batch.items()}
    n = len(data["obs"])
    # the optimiser's tensors: the parameters, or one flat tensor they are views of
    params = [p for group in optimizer.param_groups for p in group["params"]]
    by_hand = supports(net)  # same gradients as autograd's, without its graph
    names: list[str] = []
    total: torch.Tensor | None = None
    count = 0
    # exactly num_minibatches near-equal minibatches (views), whatever n is
    sizes = [len(c) for c in torch.tensor_split(torch.empty(n), min(hp.num_minibatches, n))]
    # numpy or torch arithmetic: decided once, it depends on devices, dtypes and sizes only
    use_numpy = by_hand and numpy_ready(net, {k: v[: sizes[0]] for k, v in data.items()})
    views = numpy_views(net) if use_numpy else None  # the tensors stay, updated in place
    for _ in range(hp.update_epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        shuffled = {k: v[perm] for k, v in data.items()}
        start = 0
        for size in sizes:
            mb = {k: v[start : start + size] for k, v in shuffled.items()}
            start += size
            optimizer.zero_grad(set_to_none=False)
            if by_hand:
                parts = ppo_grads(net, mb, hp, use_numpy, views)  # type: ignore[arg-type]
            else:
                loss, parts = ppo_loss(net, mb, hp)
                loss.backward()
            grads = [p.grad for p in params if p.grad is not None]
            if grad_hook is not None:
                grad_hook(grads)
            clip_grad_norm(grads, hp.max_grad_norm)
            optimizer.step()
            names = list(parts)
            stacked = torch.stack(list(parts.values()))
            total = stacked if total is None else total + stacked
            count += 1
        if hp.target_kl is not None and float(parts["losses/approx_kl"]) > hp.target_kl:
            break
    assert total is not None
    out = dict(zip(names, (total / count).tolist(), strict=True))
    y, v = data["returns"], data["values"]
    var_y = torch.var(y) if n > 1 else torch.tensor(0.0)
    out["losses/explained_variance"] = float("nan") if var_y == 0 else float(
        1 - torch.var(y - v) / var_y
    )
    return out
