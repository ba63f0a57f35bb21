"""Actor-critic networks (CleanRL layout: separate tanh MLPs, orthogonal init)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn


def layer(n_in: int, n_out: int, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """A linear layer with orthogonal weights and constant bias.

    Examples
    --------
    >>> layer(4, 8).weight.shape
    torch.Size([8, 4])
    """
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, bias)
    return lin


class _NumpyTanh(torch.autograd.Function):
    """``tanh`` computed by numpy (several times faster than torch's CPU kernel here)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # what autograd's TanhBackward runs


class Tanh(nn.Module):
    """``nn.Tanh`` with the same maths, faster on CPU float tensors.

    On a CPU ``float32``/``float64`` tensor the forward pass is numpy's ``tanh`` (within an
    ulp of torch's, and 5-7x faster on this project's machines); the backward pass is
    torch's own ``tanh_backward``. Anything else (CUDA, other dtypes) goes to ``torch.tanh``.

    Examples
    --------
    >>> x = torch.linspace(-3, 3, 7)
    >>> bool(torch.allclose(Tanh()(x), torch.tanh(x)))
    True
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``tanh(x)``."""
        if x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS and not x.is_conj():
            return _NumpyTanh.apply(x)
        return torch.tanh(x)


_NUMPY_FLOATS = (torch.float32, torch.float64)


def mlp(n_in: int, n_out: int, hidden: tuple[int, ...], out_std: float) -> nn.Sequential:
    """A tanh MLP ending in a linear head initialised with ``out_std``."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [layer(n_in, h), Tanh()]
        n_in = h
    layers.append(layer(n_in, n_out, std=out_std))
    return nn.Sequential(*layers)


class DiscreteActorCritic(nn.Module):
    """Categorical policy and state-value function over flat observations.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> a, logp, v = net.act(np.zeros((3, 4), np.float32))
    >>> a.shape, logp.shape, v.shape
    ((3,), (3,), (3,))
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.actor = mlp(obs_dim, num_actions, hidden, out_std=0.01)
        self.critic = mlp(obs_dim, 1, hidden, out_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape ``(B,)``."""
        return self.critic(obs).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions``, policy entropies and values, each ``(B,)``."""
        logp_all = torch.log_softmax(self.actor(obs), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.value(obs)

    def act(
        self, obs: np.ndarray, deterministic: bool = False,
        generator: torch.Generator | np.random.Generator | None = None,
        layers: Any = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or argmax) actions for a batch of observations; numpy in, numpy out.

        Runs on numpy copies of the CPU weights (refreshed whenever a parameter changes):
        for the small batches of a rollout step this is several times faster than torch's
        per-op dispatch. Sampling is Gumbel-max with uniform noise from ``generator`` (a
        numpy ``Generator`` is the fast choice; a torch one is accepted). ``layers`` are
        copies from :meth:`numpy_layers` taken while the weights do not change (a rollout
        takes them once); by default they are checked on every call.
        """
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        logits, values = self._numpy_forward(x, layers)
        z = logits - logits.max(-1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
        if deterministic:
            actions = logp_all.argmax(-1)
        else:
            if isinstance(generator, np.random.Generator):
                u = generator.random(logp_all.shape, dtype=np.float32)
            else:
                u = torch.rand(logp_all.shape, generator=generator).numpy()
            u = np.maximum(u, 1e-12, out=u)
            actions = (logp_all - np.log(-np.log(u))).argmax(-1)  # Gumbel-max sample
        logp = logp_all[np.arange(len(actions)), actions]
        return actions, logp, values

    def _numpy_forward(self, x: np.ndarray, layers: Any = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Policy logits ``(B, A)`` and values ``(B,)`` on the numpy weight copies."""
        if layers is None:
            layers = self.numpy_layers()
        if isinstance(layers, tuple):  # actor and critic of different shapes: one by one
            return _numpy_mlp(layers[0], x), _numpy_mlp(layers[1], x)[:, 0]
        # actor and critic stacked on a leading axis of 2: one matmul per layer for both
        h = x
        for i, (w, b) in enumerate(layers):
            h = np.matmul(h, w)
            h += b
            if i < len(layers) - 1:
                np.tanh(h, out=h)
        return h[0, :, : self._num_actions], h[1, :, 0]

    def __getstate__(self) -> dict[str, Any]:
        # The numpy cache is keyed by the parameters' identities: never carry it over.
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__")
                     else self.__dict__)
        state.pop("_np_cache", None)
        state.pop("_np_linears", None)
        return state

    def numpy_layers(self) -> Any:
        """Numpy copies of the current weights, for :meth:`act` (see :func:`_numpy_copies`)."""
        # Tensor._version counts in-place changes (optimiser steps, load_state_dict), so the
        # cache is rebuilt exactly when a weight changed (or a parameter was replaced).
        linears = self.__dict__.get("_np_linears")
        if linears is None:
            linears = tuple([m for m in seq if isinstance(m, nn.Linear)]
                            for seq in (self.actor, self.critic))
            self.__dict__["_np_linears"] = linears
        params = [m._parameters[name] for seq in linears for m in seq
                  for name in ("weight", "bias")]
        cached = self.__dict__.get("_np_cache")
        if (cached is None or any(p is not q for p, q in zip(params, cached[0], strict=True))
                or cached[1] != [p._version for p in params]):
            cached = (params, [p._version for p in params], _numpy_copies(*linears))
            self.__dict__["_np_cache"] = cached
            self.__dict__["_num_actions"] = linears[0][-1].out_features
        return cached[2]


def _numpy_copies(actor: list[nn.Linear], critic: list[nn.Linear]) -> Any:
    """Numpy copies of the weights: ``[(W, b)]`` per layer with actor and critic stacked
    (``W`` of shape ``(2, n_in, n_out)``, the narrower head zero-padded), or a pair of
    per-network lists when their hidden layers differ."""
    def arrays(m: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
        return (m.weight.detach().cpu().float().numpy().T.copy(),
                m.bias.detach().cpu().float().numpy().copy())

    a, c = [arrays(m) for m in actor], [arrays(m) for m in critic]
    if len(a) != len(c) or a[-1][0].shape[0] != c[-1][0].shape[0] or any(
            x[0].shape != y[0].shape for x, y in zip(a[:-1], c[:-1], strict=True)):
        return a, c
    out = []
    for (wa, ba), (wc, bc) in zip(a, c, strict=True):
        n_out = max(wa.shape[1], wc.shape[1])
        w = np.zeros((2, wa.shape[0], n_out), np.float32)
        b = np.zeros((2, 1, n_out), np.float32)
        w[0, :, : wa.shape[1]], w[1, :, : wc.shape[1]] = wa, wc
        b[0, 0, : ba.shape[0]], b[1, 0, : bc.shape[0]] = ba, bc
        out.append((w, b))
    return out


def _numpy_mlp(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """A tanh MLP forward pass in numpy (the layout :func:`mlp` builds)."""
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = np.tanh(x)
    return x


class FlatParameters:
    """A module's parameters as views of one flat tensor, and their gradients of another.

    An optimiser over :attr:`tensor` alone updates every parameter, and gradient clipping
    and zeroing are one operation each instead of one per parameter: for small networks
    that halves the cost of an update step on a CPU. Parameters stay registered under their
    names (``state_dict`` is unchanged), and in-place changes of :attr:`tensor` bump their
    version counters (the numpy weight cache of :class:`DiscreteActorCritic` sees them).

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2, (8, 8))
    >>> flat = FlatParameters(net)
    >>> flat.tensor.shape, flat.tensor.grad.shape
    (torch.Size([251]), torch.Size([251]))
    >>> with torch.no_grad():
    ...     _ = flat.tensor.zero_()
    >>> float(net.actor[0].weight.detach().abs().sum())
    0.0
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = [module.get_parameter(n) for n in self.names]
        first = params[0] if params else torch.zeros(0)
        self.tensor = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype,
                                  device=first.device)
        self.tensor.grad = torch.zeros_like(self.tensor)
        self.attach(force=True)

    def _slices(self) -> list[tuple[str, int, int]]:
        out, off = [], 0
        for name in self.names:
            n = self.module.get_parameter(name).numel()
            out.append((name, off, n))
            off += n
        return out

    def attach(self, force: bool = False) -> None:
        """Point every parameter and its ``.grad`` back at their slices.

        Cheap when nothing changed; a parameter whose data was replaced (``module.to``,
        assignment) is copied into its slice and re-registered; a ``.grad`` set to ``None``
        or to another tensor (``zero_grad``, assignment) is pointed back at its slice.
        """
        for name, off, n in self._slices():
            p = self.module.get_parameter(name)
            data = self.tensor[off:off + n].view_as(p)
            if force or p.data_ptr() != data.data_ptr() or p.shape != data.shape:
                with torch.no_grad():
                    data.copy_(p.detach())
                owner, _, attr = name.rpartition(".")
                fresh = nn.Parameter(data, requires_grad=True)  # shares tensor's versions
                setattr(self.module.get_submodule(owner) if owner else self.module, attr, fresh)
                p = fresh
            grad = self.tensor.grad[off:off + n].view_as(p)
            if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                if p.grad is not None:
                    grad.copy_(p.grad)
                else:
                    grad.zero_()
                p.grad = grad
