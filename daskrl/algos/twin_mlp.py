"""Two MLPs over the same input run as one: an actor and a critic of the same shape, stepped
with half the torch calls.

An actor's forward pass on a few envs is all per-call overhead: a 64x64 layer on 8 rows is
a few thousand multiply-adds, and each ``F.linear`` or ``tanh`` costs more to dispatch than
to compute. Separate actor and critic towers (CleanRL's and SB3's default) double the calls.
:class:`TwinMLP` stacks the two towers' weights once per weight update: the first layers as
one wider ``linear`` (the input is shared), the later ones as one batched matmul over the
two towers, so a 2-hidden-layer pair is three matmuls and two activations instead of six and
four. The maths is each tower's own; sums over the same terms may round in another order
than ``F.linear``'s (float32 rounding, about 1e-7 relative).

On the CPU a batch can skip torch altogether (:meth:`TwinMLP.run_numpy`): the stacked copy
is also held as numpy arrays (views of the same memory), and a numpy call costs less than
torch's dispatch of the same op (``NUMPY_MAX_ROWS`` says when ``act`` uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from daskrl.algos.layers import run_mlp


def _np_relu(h: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.maximum(h, 0.0, out=out)


_ACTIVATIONS: dict[type, tuple[Callable[[Tensor], Tensor], Callable[..., np.ndarray]]] = {
    nn.Tanh: (torch.tanh, np.tanh), nn.ReLU: (torch.relu, _np_relu)}
"""Each activation layer the towers may hold: its torch function and its numpy one (which
writes into ``out``)."""

NUMPY_MAX_ROWS = 64
"""With torch on more than one thread, the most rows the actor-critics' ``act`` runs in
numpy (larger batches go to torch, whose ops can use the threads). With one torch thread,
an actor's default, ``act`` runs every batch in numpy. In ``benchmarks/act_rows.py`` on 2
cores numpy was the faster path at every size timed (1 to 16,384 rows), against torch on one
thread and on two; the limit is kept for actors granted more threads on larger machines,
which that measurement does not cover."""

_optimiser_steps = 0
"""torch.optim steps taken in this process: fused steps leave the version counters alone
(only its changes are read, so a step lost to a race between threads would still change it
at the next)."""


def _count_step(*_: Any) -> None:
    global _optimiser_steps
    _optimiser_steps += 1


register_optimizer_step_post_hook(_count_step)


def _plan(net: nn.Sequential) -> list[type] | None:
    """Layer types of ``net`` when it is linear/activation pairs ending in a linear, else None."""
    kinds = [type(m) for m in net]
    if not kinds or kinds[-1] is not nn.Linear or len(kinds) % 2 != 1:
        return None
    if any(k is not nn.Linear for k in kinds[::2]) or any(k not in _ACTIVATIONS
                                                         for k in kinds[1::2]):
        return None
    return kinds


class TwinMLP:
    """Run two MLPs that take the same input, ``a(x)`` and ``b(x)``, as one.

    The towers must have the same layers (linear, then tanh or ReLU, ..., a final linear)
    and the same hidden widths; their inputs are the same and their outputs may differ in
    width. :meth:`fits` says whether two towers qualify. For inference: no gradients flow
    through the stacked copy.

    The stacked copy is rebuilt when the towers' weights may have changed: a parameter
    replaced (``load_state_dict(assign=True)``), updated in place through torch (its version
    counter advances: ``load_state_dict``, ``copy_``), moved to another device or dtype, or
    any ``torch.optim`` step taken in this process (fused steps do not advance the
    counters). Writes that bypass torch's version counters (through ``.data``, or a numpy
    view of a parameter) must call :meth:`invalidate`.

    Examples
    --------
    >>> from daskrl.algos.layers import mlp
    >>> actor, critic = mlp(4, 2, (64, 64), out_std=0.01), mlp(4, 1, (64, 64), out_std=1.0)
    >>> twin = TwinMLP(actor, critic)
    >>> x = torch.randn(8, 4)
    >>> with torch.no_grad():
    ...     logits, value = twin(x)
    ...     torch.allclose(logits, actor(x), atol=1e-6), torch.allclose(value, critic(x), atol=1e-6)
    (True, True)
    """

    def __init__(self, a: nn.Sequential, b: nn.Sequential) -> None:
        if not self.fits(a, b):
            raise ValueError("TwinMLP takes two MLPs with the same layers and hidden widths")
        self.a, self.b = a, b
        self._linears = [m for net in (a, b) for m in net if isinstance(m, nn.Linear)]
        self._params = [m._parameters for m in self._linears]  # live dicts: replacements show
        pairs = [_ACTIVATIONS[type(m)] for m in a if type(m) in _ACTIVATIONS]
        self._acts = [torch_fn for torch_fn, _ in pairs]
        self._np_acts = [np_fn for _, np_fn in pairs]
        self._cache: tuple[Any, ...] | None = None
        """(key, first layer, stacked later layers, output widths, numpy copy or None),
        replaced as one."""

    @staticmethod
    def fits(a: nn.Module, b: nn.Module) -> bool:
        """Whether ``a`` and ``b`` are MLPs :class:`TwinMLP` can run as one.

        Examples
        --------
        >>> from daskrl.algos.layers import mlp
        >>> TwinMLP.fits(mlp(4, 2, (8,), 1.0), mlp(4, 1, (8,), 1.0))
        True
        >>> TwinMLP.fits(mlp(4, 2, (8,), 1.0), mlp(4, 1, (16,), 1.0))
        False
        """
        if not (isinstance(a, nn.Sequential) and isinstance(b, nn.Sequential)):
            return False
        kinds = _plan(a)
        if kinds is None or kinds != _plan(b):
            return False
        lin_a = [m for m in a if isinstance(m, nn.Linear)]
        lin_b = [m for m in b if isinstance(m, nn.Linear)]
        return (all(m.bias is not None for m in (*lin_a, *lin_b))
                and lin_a[0].in_features == lin_b[0].in_features
                and all(x.out_features == y.out_features
                        for x, y in zip(lin_a[:-1], lin_b[:-1], strict=True)))

    @property
    def device(self) -> torch.device:
        """The device of the towers' weights (their first layer's)."""
        return self._linears[0].weight.device

    def invalidate(self) -> None:
        """Rebuild the stacked copy on the next call (after writes torch does not count)."""
        self._cache = None

    def _key(self) -> tuple[Any, ...]:
        # identity and version counter of every parameter (a few microseconds; a module's
        # attribute lookups would cost more than the forward pass saves)
        versions = [(id(p), p._version) for params in self._params for p in params.values()]
        first = self._linears[0].weight
        return (_optimiser_steps, first.device, first.dtype, versions)

    def _current(self) -> tuple[Any, ...]:
        """The stacked copy for the weights as they are (rebuilt when they have changed)."""
        key = self._key()
        cache = self._cache
        if cache is None or cache[0] != key:
            cache = self._build(key)
        return cache

    @torch.no_grad()
    def _build(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        half = len(self._linears) // 2
        lin_a, lin_b = self._linears[:half], self._linears[half:]
        first = (torch.cat([lin_a[0].weight, lin_b[0].weight]),
                 torch.cat([lin_a[0].bias, lin_b[0].bias]))
        stacked = []
        for la, lb in zip(lin_a[1:], lin_b[1:], strict=True):
            width = max(la.out_features, lb.out_features)  # the last layers may differ: pad
            w = la.weight.new_zeros(2, la.in_features, width)
            bias = la.bias.new_zeros(2, 1, width)
            w[0, :, : la.out_features] = la.weight.t()
            w[1, :, : lb.out_features] = lb.weight.t()
            bias[0, 0, : la.out_features] = la.bias
            bias[1, 0, : lb.out_features] = lb.bias
            stacked.append((w, bias))
        np_copy = None
        if first[0].device.type == "cpu" and first[0].dtype == torch.float32:
            # views of the stacked tensors but the first weight, transposed for x @ w
            np_copy = (first[0].t().contiguous().numpy(), first[1].numpy(),
                       [(w.numpy(), bias.numpy()) for w, bias in stacked])
        # one assignment: a thread calling meanwhile sees the old copy or the new, not half
        cache = (key, first, stacked, (lin_a[-1].out_features, lin_b[-1].out_features), np_copy)
        self._cache = cache
        return cache

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(a(x), b(x))`` for a batch ``x`` of shape ``(B, in_features)``."""
        _, first, stacked, (na, nb), _ = self._current()
        h = F.linear(x, *first)
        if not stacked:  # one layer: the wide linear is the output
            out_a, out_b = h.split((na, nb), dim=1)
            return out_a, out_b
        # shape[0], not len(): Tensor.__len__ is a Python function
        h = self._acts[0](h).view(x.shape[0], 2, first[1].shape[0] // 2).transpose(0, 1)
        for i, (w, bias) in enumerate(stacked, start=1):
            h = torch.baddbmm(bias, h, w)
            if i < len(self._acts):
                h = self._acts[i](h)
        # unbind and narrow, not h[0, :, :na]: indexing with a tuple of slices costs more
        # than the matmul on a few rows
        out_a, out_b = h.unbind(0)
        width = out_a.shape[1]
        return (out_a if na == width else out_a.narrow(1, 0, na),
                out_b if nb == width else out_b.narrow(1, 0, nb))

    def run(self, a: nn.Sequential, b: nn.Sequential, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(a(x), b(x))`` for an owner whose towers may have been replaced since: as one
        when ``a`` and ``b`` are still this twin's towers, else each on its own."""
        if a is self.a and b is self.b:
            return self(x)
        return run_mlp(a, x), run_mlp(b, x)

    def run_numpy(self, a: nn.Sequential, b: nn.Sequential, x: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray] | None:
        """``(a(x), b(x))`` computed in numpy, for a float32 batch ``x`` of shape
        ``(B, in_features)`` (float32 outputs; another dtype would give its own); None when
        it cannot be: ``a`` or ``b`` is no longer this twin's tower, or the weights are not
        float32 on the CPU (then call :meth:`run`).

        The same maths as :meth:`run`, in numpy's float32 arithmetic (sums may round in
        another order: about 1e-7 relative); ``NUMPY_MAX_ROWS`` says which batches ``act``
        sends here.

        Examples
        --------
        >>> from daskrl.algos.layers import mlp
        >>> actor, critic = mlp(4, 2, (8, 8), out_std=1.0), mlp(4, 1, (8, 8), out_std=1.0)
        >>> twin = TwinMLP(actor, critic)
        >>> x = np.ones((3, 4), np.float32)
        >>> logits, value = twin.run_numpy(actor, critic, x)
        >>> bool(np.allclose(logits, actor(torch.from_numpy(x)).detach().numpy(), atol=1e-6))
        True
        """
        if a is not self.a or b is not self.b:
            return None
        _, _, _, (na, nb), np_copy = self._current()
        if np_copy is None:
            return None
        w1, b1, stacked = np_copy
        h = x @ w1
        h += b1
        if not stacked:
            return h[:, :na], h[:, na:]
        h = self._np_acts[0](h, out=h)
        h = h.reshape(x.shape[0], 2, w1.shape[1] // 2).transpose(1, 0, 2)
        for i, (w, bias) in enumerate(stacked, start=1):
            h = np.matmul(h, w)
            h += bias
            if i < len(self._np_acts):
                h = self._np_acts[i](h, out=h)
        return h[0, :, :na], h[1, :, :nb]

    def __getstate__(self) -> dict[str, Any]:
        # the towers only: the stacked copy is rebuilt on first use after unpickling
        return {"a": self.a, "b": self.b}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["a"], state["b"])  # type: ignore[misc]


class NumpyActing:
    """``act`` for an actor-critic with two paths: numpy on the CPU (``_act_numpy``: a
    batch of any size with one torch thread, a small one with more), torch otherwise
    (``_act_torch``), the same maths and the same draws from the generator.

    ``_act_numpy`` returns numpy arrays, or None for a network it cannot run (not float32
    on the CPU, towers replaced), and torch's path runs instead.
    """

    def _act_numpy(self, obs: np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        raise NotImplementedError

    def _act_torch(self, obs: Tensor | np.ndarray, generator: torch.Generator | None,
                   deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sampled (or greedy) actions, their log-probabilities (densities) and the values of
        ``obs``, as inference tensors (no autograd), the noise from ``generator``.

        A numpy batch runs in numpy when the network can (:meth:`TwinMLP.run_numpy`) and
        torch has one thread or the batch is at most ``NUMPY_MAX_ROWS`` rows; anything else
        in torch on the network's device.
        """
        if isinstance(obs, np.ndarray) and (obs.shape[0] <= NUMPY_MAX_ROWS
                                            or torch.get_num_threads() == 1):
            out = self._act_numpy(obs, generator, deterministic)
            if out is not None:
                with torch.inference_mode():  # the same kind of tensor as torch's path
                    actions, logp, values = (torch.from_numpy(a) for a in out)
                return actions, logp, values
        return self._act_torch(obs, generator, deterministic)
