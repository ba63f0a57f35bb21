"""What every off-policy learner here shares to keep its gradient steps cheap.

On a CPU a gradient step of a small MLP costs a few hundred microseconds, most of it the
fixed cost of each torch call, not arithmetic; an iteration takes a hundred or more of
them. So: the minibatches of a whole iteration come from the replay in one vectorised
sample and become tensors once (:func:`minibatches`); optimisers are fused (:func:`adam`:
one kernel for all parameters, not ~10 calls per parameter); target networks move with
one call for all their tensors (:func:`polyak_`); losses are summed as tensors and read
once per iteration (:class:`TensorMeans`), never with a host sync per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def adam(params: Iterable[Tensor], lr: float) -> torch.optim.Adam:
    """Adam whose step is one fused kernel over every parameter (CPU and CUDA).

    Examples
    --------
    >>> adam(torch.nn.Linear(2, 1).parameters(), 1e-3).defaults["fused"]
    True
    """
    return torch.optim.Adam(params, lr=lr, fused=True)


def polyak_(target: Iterable[Tensor], source: Iterable[Tensor], tau: float) -> None:
    """Move every ``target`` tensor towards its ``source`` by ``tau`` (``tau >= 1``: copy),
    all tensors in one call.

    Examples
    --------
    >>> t, s = [torch.zeros(2)], [torch.ones(2)]
    >>> polyak_(t, s, 0.25); t[0].tolist()
    [0.25, 0.25]
    >>> polyak_(t, s, 1.0); t[0].tolist()
    [1.0, 1.0]
    """
    targets, sources = list(target), list(source)
    with torch.no_grad():
        if tau >= 1:
            torch._foreach_copy_(targets, sources)
        else:
            torch._foreach_lerp_(targets, sources, tau)


def minibatches(replay: Any, steps: int, batch_size: int, fields: Sequence[str],
                device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """``steps`` minibatches of ``batch_size`` transitions drawn uniformly from ``replay`` in
    one call, as tensors ``[steps, batch_size, ...]`` on ``device``.

    Every minibatch is drawn from the same contents, as when drawn one by one between
    gradient steps: a uniform buffer does not change while the learner trains.

    Examples
    --------
    >>> from daskrl.algos.replay import ReplayBuffer
    >>> buf = ReplayBuffer(10)
    >>> buf.add({"obs": np.zeros((10, 3), np.float32), "rewards": np.ones(10, np.float32)})
    >>> mb = minibatches(buf, 4, 2, ("obs", "rewards"))
    >>> mb["obs"].shape, mb["rewards"].shape
    (torch.Size([4, 2, 3]), torch.Size([4, 2]))
    """
    sample = replay.sample(steps * batch_size)
    return as_tensors(sample, fields, device, (steps, batch_size))


def as_tensors(sample: Mapping[str, Any], fields: Sequence[str],
               device: str | torch.device = "cpu", lead: tuple[int, ...] | None = None
               ) -> dict[str, Tensor]:
    """``sample``'s ``fields`` as tensors on ``device`` (floating arrays as float32), their
    first dimension reshaped to ``lead`` when given.

    Examples
    --------
    >>> as_tensors({"r": np.zeros(6)}, ("r",), lead=(2, 3))["r"].dtype
    torch.float32
    """
    out = {}
    for key in fields:
        value = torch.as_tensor(np.asarray(sample[key]), device=device)
        if value.is_floating_point():
            value = value.float()
        out[key] = value if lead is None else value.reshape(*lead, *value.shape[1:])
    return out


class TensorMeans:
    """Tensors (losses, Q values; those of one key all of one shape) kept as tensors and
    averaged once, as floats.

    Adding is a list append (no host sync, no torch call), so a GPU learner never waits for
    its device between gradient steps to record a metric.

    Examples
    --------
    >>> m = TensorMeans()
    >>> m.add("loss", torch.tensor(1.0)); m.add("loss", torch.tensor(3.0))
    >>> m.means()
    {'loss': 2.0}
    """

    def __init__(self) -> None:
        self.values: dict[str, list[Tensor]] = {}

    def add(self, key: str, value: Tensor) -> None:
        """Keep ``value`` (detached) under ``key``."""
        self.values.setdefault(key, []).append(value.detach())

    def means(self) -> dict[str, float]:
        """Each key's mean, as floats (one transfer for all of them)."""
        if not self.values:
            return {}
        keys = sorted(self.values)
        means = torch.stack([torch.stack(self.values[k]).float().mean() for k in keys])
        return dict(zip(keys, means.cpu().tolist(), strict=True))
