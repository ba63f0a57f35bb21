"""MAPPO's value normaliser: running, debiased mean and variance of the value targets."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ValueNorm"]


class ValueNorm(nn.Module):
    """Running mean and variance of value targets, debiased (MAPPO's ValueNorm).

    ``running = beta * running + (1 - beta) * batch``; the debiasing term makes the early
    estimates the plain mean of the batches seen. Its buffers travel with the weights.

    Examples
    --------
    >>> vn = ValueNorm()
    >>> vn.update(vn.batch_stats(torch.tensor([1.0, 3.0])))
    >>> vn.normalize(torch.tensor([2.0])).item()
    0.0
    >>> round(vn.denormalize(torch.tensor([1.0])).item(), 4)
    3.0
    """

    def __init__(self, beta: float = 0.99999, eps: float = 1e-5, enabled: bool = True) -> None:
        super().__init__()
        self.beta, self.eps, self.enabled = beta, eps, enabled
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    @staticmethod
    def batch_stats(x: Tensor) -> Tensor:
        """``[mean, mean of squares]`` of ``x`` (what replicas average before :meth:`update`)."""
        x = x.detach().double()
        return torch.stack([x.mean(), (x * x).mean()])

    @torch.no_grad()
    def update(self, stats: Tensor) -> None:
        """Fold a batch's :meth:`batch_stats` into the running estimates (a batch with no
        value, whose statistics are NaN, leaves them as they are)."""
        if not self.enabled or bool(torch.isnan(stats).any()):
            return
        b = self.beta
        stats = stats.to(self.running_mean.device, torch.float64)
        self.running_mean.mul_(b).add_(stats[0] * (1 - b))
        self.running_mean_sq.mul_(b).add_(stats[1] * (1 - b))
        self.debiasing_term.mul_(b).add_(1 - b)

    def mean_std(self) -> tuple[Tensor, Tensor]:
        """Debiased mean and standard deviation (variance floored at 1e-2, as in MAPPO)."""
        d = self.debiasing_term.clamp(min=self.eps)
        mean, mean_sq = self.running_mean / d, self.running_mean_sq / d
        return mean, (mean_sq - mean * mean).clamp(min=1e-2).sqrt()

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / std`` (identity when disabled or before any update)."""
        if not self.enabled or float(self.debiasing_term) == 0.0:
            return x
        mean, std = self.mean_std()
        return ((x - mean) / std).to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        """``x * std + mean`` (identity when disabled or before any update)."""
        if not self.enabled or float(self.debiasing_term) == 0.0:
            return x
        mean, std = self.mean_std()
        return (x * std + mean).to(x.dtype)
