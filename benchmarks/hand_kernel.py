"""The reference limit: PPO on a two-MLP actor-critic with every operation written by hand.

Not part of daskrl. The product (``daskrl/algos``) differentiates its loss with autograd and
steps ``torch.optim.Adam``; this module is what one network shape allows when nothing is
general: numpy inference with the actor and critic stacked into one matmul per layer, PPO's
gradients derived by hand in numpy (the maths of :func:`daskrl.algos.losses.ppo_loss` and
its backward pass), and Adam over one flat array. (daskrl's own ``act`` now runs a small CPU
batch in numpy the same way, through ``TwinMLP.run_numpy`` for any MLP pair; :class:`HandNet`
keeps its own forward so that the reference stays what it was.) ``ppo_cartpole.py --systems
hand`` runs it in the same plain loop as the ``lean`` system, so the gap between the two is
what the general path costs. ``tests/test_hand_kernel.py`` checks its gradients against autograd's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.networks import DiscreteActorCritic
from daskrl.algos.ppo import PPOHyper

Layers = list[tuple[np.ndarray, np.ndarray]]
"""``(W [n_out, n_in], b [n_out])`` of each linear layer of one MLP."""


def _linears(seq: torch.nn.Sequential) -> list[torch.nn.Linear]:
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


class HandNet(DiscreteActorCritic):
    """:class:`DiscreteActorCritic` whose ``act`` runs in numpy on copies of the weights
    (actor and critic stacked: one matmul per layer for both), refreshed on each load."""

    def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:
        out = super().load_state_dict(state, strict, assign)
        self._stacked = None
        return out

    def stacked(self) -> list[tuple[np.ndarray, np.ndarray]]:
        if getattr(self, "_stacked", None) is None:
            layers = []
            for la, lc in zip(_linears(self.actor), _linears(self.critic), strict=True):
                wa, wc = la.weight.detach().numpy().T, lc.weight.detach().numpy().T
                n_out = max(wa.shape[1], wc.shape[1])
                w = np.zeros((2, wa.shape[0], n_out), np.float32)
                b = np.zeros((2, 1, n_out), np.float32)
                w[0, :, : wa.shape[1]], w[1, :, : wc.shape[1]] = wa, wc
                b[0, 0, : wa.shape[1]] = la.bias.detach().numpy()
                b[1, 0, : wc.shape[1]] = lc.bias.detach().numpy()
                layers.append((w, b))
            self._stacked = layers
            self._num_actions = _linears(self.actor)[-1].out_features
        return self._stacked

    def act(self, obs: Any, generator: Any = None, deterministic: bool = False) -> Any:
        h = np.asarray(obs, dtype=np.float32)
        layers = self.stacked()
        for i, (w, b) in enumerate(layers):
            h = np.matmul(h, w)
            h += b
            if i < len(layers) - 1:
                np.tanh(h, out=h)
        logits, values = h[0, :, : self._num_actions], h[1, :, 0]
        z = logits - logits.max(-1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
        if deterministic:
            actions = logp_all.argmax(-1)
        else:
            # the same Gumbel-max draw as daskrl's sample(): one exponential per logit
            noise = torch.empty(logp_all.shape).exponential_(generator=generator).numpy()
            actions = (logp_all - np.log(noise)).argmax(-1)
        return (torch.from_numpy(actions), torch.from_numpy(logp_all[np.arange(len(actions)),
                                                                      actions]),
                torch.from_numpy(values.copy()))


def hand_actor(actor: VecEnvActor) -> VecEnvActor:
    """``actor`` with its policy copy replaced by a :class:`HandNet` of the same shape."""
    old = actor.recorder.net
    net = HandNet(_linears(old.actor)[0].in_features, _linears(old.actor)[-1].out_features,
                  tuple(m.out_features for m in _linears(old.actor)[:-1]))
    net.load_state_dict(old.state_dict())
    actor.recorder.net = net
    return actor


class HandLearner(ActorCriticLearner):
    """PPO whose gradients and Adam steps are written out in numpy (one network shape).

    The parameters live in one flat float32 array (``self.flat``); the torch network's
    parameters are views of it, so :meth:`weights` and ``state_dict`` read the current values.
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (64, 64), hp: PPOHyper | None = None) -> None:
        super().__init__(obs_dim, num_actions, seed, hidden, hp)
        sizes = [p.numel() for p in self.params]
        self.flat = np.concatenate([p.detach().numpy().reshape(-1) for p in self.params])
        self.grad = np.zeros_like(self.flat)
        self.m, self.v, self.t = np.zeros_like(self.flat), np.zeros_like(self.flat), 0
        offsets = np.cumsum([0, *sizes])
        views, gviews = [], []
        for p, a, b in zip(self.params, offsets[:-1], offsets[1:], strict=True):
            views.append(self.flat[a:b].reshape(p.shape))
            gviews.append(self.grad[a:b].reshape(p.shape))
            p.data = torch.from_numpy(views[-1])  # the network reads the flat array
        n_a = 2 * len(_linears(self.net.actor))
        self.actor_views = [(views[i], views[i + 1], gviews[i], gviews[i + 1])
                            for i in range(0, n_a, 2)]
        self.critic_views = [(views[i], views[i + 1], gviews[i], gviews[i + 1])
                             for i in range(n_a, len(views), 2)]

    def update(self, batches: list[Any], progress: float) -> dict[str, float]:
        lr = self.learning_rate(progress)
        plan = self.minibatches(batches, progress)
        parts = [self._step({k: v.numpy() for k, v in mb.items()}, lr) for mb in plan]
        self._weights = None
        self._data = None
        out = {k: float(np.mean([p[k] for p in parts])) for k in parts[0]}
        out["charts/learning_rate"] = lr
        return out

    def _step(self, mb: dict[str, np.ndarray], lr: float) -> dict[str, float]:
        parts = hand_gradients(self.actor_views, self.critic_views, mb, self.hp)
        hp = self.hp
        norm = float(np.sqrt(np.dot(self.grad, self.grad)))
        self.grad *= min(1.0, hp.max_grad_norm / (norm + 1e-6))
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-5
        self.m += (1 - b1) * (self.grad - self.m)
        self.v *= b2
        self.v += (1 - b2) * self.grad * self.grad
        denom = np.sqrt(self.v) / math.sqrt(1 - b2 ** self.t) + eps
        self.flat -= (lr / (1 - b1 ** self.t)) * self.m / denom
        return parts


def hand_gradients(actor: list[tuple[np.ndarray, ...]], critic: list[tuple[np.ndarray, ...]],
                   mb: dict[str, np.ndarray], hp: PPOHyper) -> dict[str, float]:
    """PPO's loss parts on ``mb``; d(loss)/d(weight, bias) written into the gradient views.

    ``actor``/``critic``: per linear layer ``(W, b, dW, db)``. Ties follow autograd's rules
    (``max`` splits the gradient evenly between equal inputs; ``clamp`` passes it at its
    bounds), so the result equals ``loss.backward()`` to float32 rounding.
    """
    f32 = np.float32
    obs, actions = mb["obs"].astype(f32, copy=False), mb["actions"].astype(np.int64)
    old_logp, old_values, returns, adv = (mb[k].astype(f32, copy=False) for k in
                                          ("logp", "values", "returns", "advantages"))
    n = len(obs)
    rows = np.arange(n)
    acts_a, acts_c = _forward(actor, obs), _forward(critic, obs)
    z = acts_a[-1] - acts_a[-1].max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p_all = np.exp(logp_all)
    log_ratio = logp_all[rows, actions] - old_logp
    ratio = np.exp(log_ratio)
    values = acts_c[-1][:, 0]
    if hp.norm_adv and n > 1:
        adv = (adv - adv.mean()) / (adv.std(ddof=1) + f32(1e-8))
    c = f32(hp.clip_coef)
    unclipped, clipped = -adv * ratio, -adv * np.clip(ratio, 1 - c, 1 + c)
    err = values - returns
    d_u, d_c = _max_grads(unclipped, clipped, f32(1.0 / n))
    d_ratio = -adv * (d_u + d_c * ((ratio >= 1 - c) & (ratio <= 1 + c)))
    d_logp_all = p_all * (logp_all + 1) * f32(hp.ent_coef / n)
    d_logp_all[rows, actions] += d_ratio * ratio
    d_logits = d_logp_all - p_all * d_logp_all.sum(-1, keepdims=True)
    scale = f32(hp.vf_coef * 0.5 / n)
    if hp.clip_vloss:
        delta = values - old_values
        err_c = old_values + np.clip(delta, -c, c) - returns
        sq, sq_c = err * err, err_c * err_c
        vf = f32(0.5) * np.maximum(sq, sq_c).mean()
        g_u, g_c = _max_grads(sq, sq_c, scale)
        d_values = 2 * (g_u * err + g_c * err_c * ((delta >= -c) & (delta <= c)))
    else:
        vf = f32(0.5) * (err * err).mean()
        d_values = 2 * scale * err
    _backward(actor, acts_a, d_logits)
    _backward(critic, acts_c, d_values[:, None])
    return {"losses/policy_loss": float(np.maximum(unclipped, clipped).mean()),
            "losses/value_loss": float(vf),
            "losses/entropy": float(-(p_all * logp_all).sum(-1).mean()),
            "losses/approx_kl": float(((ratio - 1) - log_ratio).mean()),
            "losses/clipfrac": float((np.abs(ratio - 1) > c).mean())}


def _forward(layers: list[tuple[np.ndarray, ...]], x: np.ndarray) -> list[np.ndarray]:
    acts = [x]
    for i, (w, b, *_) in enumerate(layers):
        y = acts[-1] @ w.T
        y += b
        if i < len(layers) - 1:
            np.tanh(y, out=y)
        acts.append(y)
    return acts


def _backward(layers: list[tuple[np.ndarray, ...]], acts: list[np.ndarray], d: np.ndarray
              ) -> None:
    for i in range(len(layers) - 1, -1, -1):
        w, _, dw, db = layers[i]
        np.matmul(d.T, acts[i], out=dw)
        np.sum(d, axis=0, out=db)
        if i:
            d = d @ w
            h = acts[i]
            d *= 1 - h * h


def _max_grads(a: np.ndarray, b: np.ndarray, scale: np.float32
               ) -> tuple[np.ndarray, np.ndarray]:
    share = np.where(a == b, np.float32(0.5), np.float32(1.0)) * scale
    return share * (a >= b), share * (b >= a)
