"""PPO loss gradients of :class:`DiscreteActorCritic` written out by hand.

The same maths as :func:`daskrl.algos.ppo.ppo_loss` followed by ``loss.backward()``,
computed with explicit tensor operations and no autograd graph: for the small minibatches
of CartPole-sized PPO most of an update step is autograd's per-node bookkeeping, which
this skips. Tie-breaking follows autograd's (``torch.max`` splits the gradient evenly
between equal inputs; ``clamp`` passes it at its bounds). ``tests/test_gae_ppo.py`` checks
it against autograd.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .networks import DiscreteActorCritic, Tanh

Tensor = torch.Tensor


def supports(net: nn.Module) -> bool:
    """Whether :func:`ppo_grads` can take ``net``: a plain :class:`DiscreteActorCritic`
    (linear layers with :class:`~daskrl.algos.networks.Tanh` between them).

    Examples
    --------
    >>> supports(DiscreteActorCritic(4, 2)), supports(nn.Linear(4, 2))
    (True, False)
    """
    if type(net) is not DiscreteActorCritic:
        return False
    for seq in (net.actor, net.critic):
        kinds = [type(m) for m in seq]
        expected = [nn.Linear, Tanh] * (len(kinds) // 2) + [nn.Linear]
        if kinds != expected:
            return False
    return all(p.requires_grad for p in net.parameters())


def _tanh_(x: Tensor) -> Tensor:
    """``tanh`` in place (numpy's kernel on CPU, as :class:`Tanh` uses)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        np.tanh(x.numpy(), out=x.numpy())
        return x
    return x.tanh_()


def _forward(layers: list[nn.Linear], x: Tensor) -> list[Tensor]:
    """The input of every layer and the output: ``[x, h1, ..., out]``."""
    acts = [x]
    for i, m in enumerate(layers):
        y = torch.addmm(m.bias, acts[-1], m.weight.t())
        acts.append(_tanh_(y) if i < len(layers) - 1 else y)
    return acts


def _backward(layers: list[nn.Linear], acts: list[Tensor], d: Tensor) -> None:
    """Write d(loss)/d(weight, bias) of every layer into their ``.grad``, given d(out)."""
    for i in range(len(layers) - 1, -1, -1):
        m = layers[i]
        for p, g in ((m.weight, d.t().mm(acts[i])), (m.bias, d.sum(0))):
            if p.grad is None or p.grad.shape != g.shape:
                p.grad = g
            else:
                p.grad.copy_(g)
        if i:
            d = torch.ops.aten.tanh_backward(d.mm(m.weight), acts[i])


def _max_grads(a: Tensor, b: Tensor, scale: float | Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of ``torch.max(a, b)`` (elementwise) for an upstream gradient ``scale``:
    all to the larger input, half to each where they are equal (autograd's rule)."""
    share = torch.where(a == b, 0.5, 1.0) * scale
    return share * (a >= b), share * (b >= a)


def _between(x: Tensor, low: float, high: float) -> Tensor:
    """Where ``clamp(x, low, high)`` passes the gradient through (bounds included)."""
    return (x >= low) & (x <= high)


def ppo_grads(net: DiscreteActorCritic, mb: dict[str, Tensor], hp: Any,
              use_numpy: bool | None = None, views: NumpyViews | None = None
              ) -> dict[str, Tensor]:
    """Loss parts of one minibatch, with d(loss)/d(parameter) written into each ``.grad``.

    ``mb`` and ``hp`` as for :func:`~daskrl.algos.ppo.ppo_loss`; the returned parts are
    its (detached). Gradients are set, not accumulated. On CPU ``float32`` tensors the
    arithmetic runs in numpy (``use_numpy=None``: whenever it can, unless torch has several
    threads and the minibatch is large), whose per-operation cost is a fraction of torch's
    for small minibatches; elsewhere in torch. ``views`` (numpy path): :func:`numpy_views`
    of ``net``, made once for several calls while its tensors stay the same.
    """
    if use_numpy is None:
        use_numpy = numpy_ready(net, mb)
    if use_numpy:
        return _numpy_ppo_grads(net, mb, hp, views or numpy_views(net))
    return _torch_ppo_grads(net, mb, hp)


NumpyViews = tuple[list[tuple[np.ndarray, ...]], list[tuple[np.ndarray, ...]]]
"""Per linear layer of the actor, then of the critic: weight, bias and their gradients."""


def numpy_views(net: DiscreteActorCritic) -> NumpyViews:
    """Numpy views of ``net``'s linear layers (weight, bias, weight grad, bias grad),
    gradients created where missing. They stay valid while the tensors do (parameters
    and gradients are updated in place); taking them costs ~2 us per tensor, which per
    minibatch was ~5% of a CartPole update.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2, (8, 8))
    >>> actor, critic = numpy_views(net)
    >>> [w.shape for w, *_ in actor]
    [(8, 4), (8, 8), (2, 8)]
    """
    def views(seq: nn.Module) -> list[tuple[np.ndarray, ...]]:
        out = []
        for m in seq:
            if isinstance(m, nn.Linear):
                for p in (m.weight, m.bias):
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                out.append((m.weight.detach().numpy(), m.bias.detach().numpy(),
                            m.weight.grad.numpy(), m.bias.grad.numpy()))
        return out

    return views(net.actor), views(net.critic)


def numpy_ready(net: nn.Module, mb: dict[str, Tensor]) -> bool:
    """Whether :func:`ppo_grads` can run in numpy for ``net`` and minibatches like ``mb``."""
    if torch.get_num_threads() > 1 and len(mb["obs"]) > 1024:
        return False  # large minibatches: torch's matmuls use the threads it was given
    tensors = [*net.parameters(), *mb.values()]
    return all(t.device.type == "cpu" for t in tensors) and all(
        p.dtype == torch.float32 and (p.grad is None or p.grad.is_contiguous())
        for p in net.parameters())


def _torch_ppo_grads(net: DiscreteActorCritic, mb: dict[str, Tensor], hp: Any
                     ) -> dict[str, Tensor]:
    """:func:`ppo_grads` in torch operations (any device)."""
    from .ppo import normalize, policy_loss, value_loss  # the forward maths, shared

    with torch.no_grad():
        obs, actions, old_values = mb["obs"], mb["actions"].long(), mb["values"]
        returns = mb["returns"]
        n = obs.shape[0]
        la = [m for m in net.actor if isinstance(m, nn.Linear)]
        lc = [m for m in net.critic if isinstance(m, nn.Linear)]
        acts_a, acts_c = _forward(la, obs), _forward(lc, obs)
        logp_all = torch.log_softmax(acts_a[-1], dim=-1)
        p_all = logp_all.exp()
        index = actions.unsqueeze(-1)
        logp = logp_all.gather(-1, index).squeeze(-1)
        entropy = -(p_all * logp_all).sum(-1)
        values = acts_c[-1].squeeze(-1)
        log_ratio = logp - mb["logp"]
        ratio = log_ratio.exp()
        adv = normalize(mb["advantages"]) if hp.norm_adv and n > 1 else mb["advantages"]
        c = hp.clip_coef
        pg = policy_loss(adv, ratio, c)
        vf = value_loss(values, old_values, returns, c, hp.clip_vloss)
        ent = entropy.mean()

        # policy loss: mean of max(-A r, -A clamp(r)) -> d/d log pi(a|s) = d/dr * r
        d_unclipped, d_clipped = _max_grads(-adv * ratio,
                                            -adv * torch.clamp(ratio, 1 - c, 1 + c), 1.0 / n)
        d_ratio = -adv * (d_unclipped + d_clipped * _between(ratio, 1 - c, 1 + c))
        # entropy bonus: -ent_coef * mean(-(p * log p)) -> d/d log p = ent_coef / n * p (log p + 1)
        d_logp_all = p_all * (logp_all + 1.0) * (hp.ent_coef / n)
        d_logp_all.scatter_add_(-1, index, (d_ratio * ratio).unsqueeze(-1))
        d_logits = d_logp_all - p_all * d_logp_all.sum(-1, keepdim=True)  # log_softmax

        # value loss: vf_coef * 0.5 * mean(max((v - R)^2, (v_clipped - R)^2)) or unclipped
        scale = hp.vf_coef * 0.5 / n
        if hp.clip_vloss:
            delta = values - old_values
            v_clipped = old_values + torch.clamp(delta, -c, c)
            d_u, d_c = _max_grads((values - returns) ** 2, (v_clipped - returns) ** 2, scale)
            d_values = 2 * (d_u * (values - returns)
                            + d_c * (v_clipped - returns) * _between(delta, -c, c))
        else:
            d_values = 2 * scale * (values - returns)

        _backward(la, acts_a, d_logits)
        _backward(lc, acts_c, d_values.unsqueeze(-1))
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clipfrac = ((ratio - 1.0).abs() > c).float().mean()
    return {
        "losses/policy_loss": pg,
        "losses/value_loss": vf,
        "losses/entropy": ent,
        "losses/approx_kl": approx_kl,
        "losses/clipfrac": clipfrac,
    }


def _numpy_ppo_grads(net: DiscreteActorCritic, mb: dict[str, Tensor], hp: Any,
                     views: NumpyViews) -> dict[str, Tensor]:
    """:func:`ppo_grads` in numpy, on views of the CPU tensors (gradients written in place)."""
    f32 = np.float32
    obs = mb["obs"].numpy().astype(f32, copy=False)
    actions = mb["actions"].numpy().astype(np.int64, copy=False)
    old_logp, old_values, returns = (mb[k].numpy().astype(f32, copy=False)
                                     for k in ("logp", "values", "returns"))
    adv = mb["advantages"].numpy().astype(f32, copy=False)
    n = len(obs)
    rows = np.arange(n)
    la, lc = views
    acts_a, acts_c = _np_forward(la, obs), _np_forward(lc, obs)
    logits = acts_a[-1]
    z = logits - logits.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))  # log_softmax
    p_all = np.exp(logp_all)
    logp = logp_all[rows, actions]
    entropy = -(p_all * logp_all).sum(-1)
    values = acts_c[-1][:, 0]
    log_ratio = logp - old_logp
    ratio = np.exp(log_ratio)
    if hp.norm_adv and n > 1:  # normalize(): unbiased std, as CleanRL
        adv = (adv - adv.mean()) / (adv.std(ddof=1) + f32(1e-8))
    c = f32(hp.clip_coef)
    clipped_ratio = np.clip(ratio, 1 - c, 1 + c)
    unclipped, clipped = -adv * ratio, -adv * clipped_ratio
    pg = np.maximum(unclipped, clipped).mean()
    err = values - returns
    if hp.clip_vloss:
        delta = values - old_values
        v_clipped = old_values + np.clip(delta, -c, c)
        err_clipped = v_clipped - returns
        sq, sq_clipped = err * err, err_clipped * err_clipped
        vf = f32(0.5) * np.maximum(sq, sq_clipped).mean()
    else:
        vf = f32(0.5) * (err * err).mean()

    d_unclipped, d_clipped = _np_max_grads(unclipped, clipped, f32(1.0 / n))
    inside = (ratio >= 1 - c) & (ratio <= 1 + c)
    d_ratio = -adv * (d_unclipped + d_clipped * inside)
    d_logp_all = p_all * (logp_all + 1) * f32(hp.ent_coef / n)
    d_logp_all[rows, actions] += d_ratio * ratio
    d_logits = d_logp_all - p_all * d_logp_all.sum(-1, keepdims=True)
    scale = f32(hp.vf_coef * 0.5 / n)
    if hp.clip_vloss:
        d_u, d_c = _np_max_grads(sq, sq_clipped, scale)
        d_values = 2 * (d_u * err + d_c * err_clipped * ((delta >= -c) & (delta <= c)))
    else:
        d_values = 2 * scale * err
    _np_backward(la, acts_a, d_logits)
    _np_backward(lc, acts_c, d_values[:, None])
    parts = {
        "losses/policy_loss": pg,
        "losses/value_loss": vf,
        "losses/entropy": entropy.mean(),
        "losses/approx_kl": ((ratio - 1) - log_ratio).mean(),
        "losses/clipfrac": (np.abs(ratio - 1) > c).mean(dtype=f32),
    }
    return {k: torch.from_numpy(np.asarray(v, dtype=f32)) for k, v in parts.items()}


def _np_forward(layers: list[tuple[np.ndarray, ...]], x: np.ndarray) -> list[np.ndarray]:
    acts = [x]
    for i, (weight, bias, *_) in enumerate(layers):
        y = acts[-1] @ weight.T
        y += bias
        if i < len(layers) - 1:
            np.tanh(y, out=y)
        acts.append(y)
    return acts


def _np_backward(layers: list[tuple[np.ndarray, ...]], acts: list[np.ndarray], d: np.ndarray
                 ) -> None:
    for i in range(len(layers) - 1, -1, -1):
        weight, _, weight_grad, bias_grad = layers[i]
        np.matmul(d.T, acts[i], out=weight_grad)
        np.sum(d, axis=0, out=bias_grad)
        if i:
            d = d @ weight
            h = acts[i]
            d *= 1 - h * h  # tanh_backward


def _np_max_grads(a: np.ndarray, b: np.ndarray, scale: np.float32
                  ) -> tuple[np.ndarray, np.ndarray]:
    share = np.where(a == b, np.float32(0.5), np.float32(1.0)) * scale
    return share * (a >= b), share * (b >= a)
