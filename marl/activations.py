"""``tanh`` for the MAPPO networks' training passes, computed as a sigmoid on the CPU.

torch's CPU ``tanh`` kernel costs several times its ``sigmoid`` on the same tensor; MAPPO's
hidden-layer activations were about a fifth of an update (``benchmarks/mappo_scale.md``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SigmoidTanh", "swap_tanh"]


class _SigmoidTanh(torch.autograd.Function):
    """``tanh(x) = 2 sigmoid(2x) - 1``, with tanh's own backward ``g (1 - y^2)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # noqa: D102
        if x.device.type == "cpu":
            y = torch.mul(x, 2.0).sigmoid_().mul_(2.0).sub_(1.0)
        else:  # GPU tanh kernels are fast: one kernel instead of four
            y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # noqa: D102
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class SigmoidTanh(nn.Module):
    """``nn.Tanh`` computed as ``2 sigmoid(2x) - 1`` (within 2e-7 of it in float32).

    torch's CPU ``tanh`` kernel costs 3-9x its ``sigmoid`` on the same tensor (measured in
    ``benchmarks/mappo_scale.md``), and the hidden layers' activations were about a fifth
    of a MAPPO update's time; the backward is tanh's own. On other devices it is ``tanh``.
    The training model uses it; :class:`MAPPOPolicy` (exported, scripted) keeps ``nn.Tanh``.

    Examples
    --------
    >>> x = torch.linspace(-6, 6, 101)
    >>> bool((SigmoidTanh()(x) - torch.tanh(x)).abs().max() < 1e-6)
    True
    """

    def forward(self, x: Tensor) -> Tensor:
        """``tanh(x)``."""
        return _SigmoidTanh.apply(x)


def swap_tanh(seq: nn.Sequential, to: type[nn.Module]) -> nn.Sequential:
    """``seq`` with its ``nn.Tanh``/:class:`SigmoidTanh` activations replaced by ``to()``
    (in place; no parameters change).

    Examples
    --------
    >>> swap_tanh(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), SigmoidTanh)[1]
    SigmoidTanh()
    """
    for i, m in enumerate(seq):
        if isinstance(m, (nn.Tanh, SigmoidTanh)):
            seq[i] = to()
    return seq
