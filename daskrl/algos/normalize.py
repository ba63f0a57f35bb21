"""Running observation and return statistics, merged across actors by the learner.

Actors normalise observations and scale rewards with the statistics that came with their
weights (frozen for the rollout), and return the :class:`Moments` (count, mean, sum of squared
deviations) of what they saw. The learner merges every batch's moments into its
:class:`RunningMeanStd` buffers (Chan et al.'s parallel update, the one gymnasium's
``RunningMeanStd`` applies per step) after its update, so the statistics are part of the
network's ``state_dict``: they travel with the weights to the actors and into checkpoints, and
the exported policy normalises with them. Merging in batch order makes the result independent
of where the actors ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

EPS = 1e-8
"""Added to the variance before the square root (gymnasium's ``NormalizeObservation``)."""


@dataclass(frozen=True)
class Normalization:
    """Which running statistics a continuous-control policy keeps (CleanRL's wrappers).

    Examples
    --------
    >>> Normalization(obs=True).reward
    False
    """

    obs: bool = False
    """Normalise observations by their running mean and std (clipped to +-``clip``)."""
    reward: bool = False
    """Scale rewards by the running std of the discounted return (clipped to +-``clip``)."""
    clip: float = 10.0
    """Bound of normalised observations and scaled rewards."""
    sign_reward: bool = False
    """Learn from the sign of each reward (Atari, as the DQN and PPO papers); episode returns
    are still reported unclipped."""


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations (``m2``) of a sample, per feature.

    Examples
    --------
    >>> x = np.arange(6.0).reshape(3, 2)
    >>> m = Moments.of(x[:1]).merge(Moments.of(x[1:]))
    >>> m.count, m.mean.tolist(), m.var.tolist() == x.var(0).tolist()
    (3.0, [2.0, 3.0], True)
    """

    count: float
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray) -> Moments:
        """The moments of the rows of ``x`` (float64)."""
        x = np.asarray(x, dtype=np.float64)
        if len(x) == 0:
            return cls(0.0, np.zeros(x.shape[1:]), np.zeros(x.shape[1:]))
        mean = x.mean(0)
        return cls(float(len(x)), mean, ((x - mean) ** 2).sum(0))

    @property
    def var(self) -> np.ndarray:
        """Population variance (``m2 / count``)."""
        return self.m2 / max(self.count, 1e-300)

    def merge(self, other: Moments) -> Moments:
        """The moments of both samples together (Chan et al.'s parallel formula)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        total = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / total)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        return Moments(total, mean, m2)


def merge_all(parts: Iterable[Moments]) -> Moments | None:
    """All ``parts`` merged left to right (None when there are none).

    Examples
    --------
    >>> merge_all([Moments.of(np.ones((2, 1))), Moments.of(np.zeros((2, 1)))]).mean.tolist()
    [0.5]
    """
    out: Moments | None = None
    for part in parts:
        out = part if out is None else out.merge(part)
    return out


class RunningMeanStd(nn.Module):
    """Running mean and variance as float64 buffers (in the ``state_dict``); ``forward``
    normalises.

    Starts like gymnasium's ``RunningMeanStd``: mean 0, variance 1, count ``1e-4``.

    Examples
    --------
    >>> rms = RunningMeanStd((2,))
    >>> rms.update(Moments.of(np.array([[1.0, 2.0], [3.0, 6.0]])))
    >>> [round(v, 3) for v in rms.mean.tolist()]
    [2.0, 4.0]
    >>> [round(v, 3) for v in rms(torch.tensor([[3.0, 6.0]]))[0].tolist()]
    [1.0, 1.0]
    """

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 10.0) -> None:
        super().__init__()
        self.clip, self.eps = clip, EPS
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self._scale: tuple[Tensor, Tensor, np.ndarray] | None = None
        """float32 mean and std, and the numpy std, for the statistics as they are: an actor
        normalises every step with statistics that change once per update, so they are
        converted once (dropped by :meth:`update`, a loaded ``state_dict`` and ``.to``)."""
        self._np_scale: tuple[np.ndarray, np.ndarray] | None = None
        """The float32 mean and std as numpy arrays (:meth:`normalize_numpy`), dropped with
        :attr:`_scale`."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._scale = self._np_scale = None
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> RunningMeanStd:
        self._scale = self._np_scale = None
        return super()._apply(fn, *args, **kwargs)

    def scale(self) -> tuple[Tensor, Tensor, np.ndarray]:
        """``mean`` and ``sqrt(var + EPS)`` as float32 tensors, and that std as numpy."""
        if self._scale is None:
            with torch.inference_mode(False), torch.no_grad():  # usable under autograd too
                mean = self.mean.to(torch.float32)
                std = torch.sqrt(self.var.to(torch.float32) + self.eps)
            self._scale = (mean, std, np.sqrt(self.var.cpu().numpy() + EPS))
        return self._scale

    def moments(self) -> Moments:
        """The statistics so far as :class:`Moments`."""
        count = float(self.count)
        return Moments(count, self.mean.cpu().numpy(), self.var.cpu().numpy() * count)

    def update(self, batch: Moments) -> None:
        """Fold ``batch`` into the statistics (in place)."""
        merged = self.moments().merge(batch)
        self.mean.copy_(torch.as_tensor(merged.mean))
        self.var.copy_(torch.as_tensor(merged.var))
        self.count.fill_(merged.count)
        self._scale = self._np_scale = None

    def std(self) -> np.ndarray:
        """``sqrt(var + EPS)`` as numpy (what rewards are divided by)."""
        return self.scale()[2]

    def scale_rewards(self, reward: np.ndarray, discounted: np.ndarray, valid: np.ndarray,
                      done: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
        """One vector step of gymnasium's ``NormalizeReward`` with these statistics frozen:
        ``discounted`` (per env, the episode's discounted return so far; updated in place
        where ``valid``, reset where an episode ended) and the rewards divided by the
        return's std, clipped to +-``clip``. Returns ``(scaled, returns seen)``; the returns
        seen are what the learner merges into these statistics.

        Examples
        --------
        >>> rms, disc = RunningMeanStd(), np.zeros(2)
        >>> r = np.array([1.0, 2.0]); yes = np.array([True, True])
        >>> scaled, seen = rms.scale_rewards(r, disc, yes, np.array([False, True]), 0.5)
        >>> seen.tolist(), disc.tolist()  # env 1's episode ended: its return restarts
        ([1.0, 2.0], [1.0, 0.0])
        """
        discounted[valid] = discounted[valid] * gamma + reward[valid]
        seen = discounted.copy()
        discounted[done & valid] = 0.0
        return np.clip(reward / self.std(), -self.clip, self.clip), seen

    def forward(self, x: Tensor) -> Tensor:
        """``(x - mean) / sqrt(var + EPS)``, clipped to +-``clip``, float32."""
        if torch.jit.is_scripting():  # an exported policy: no Python-side cache
            mean = self.mean.to(torch.float32)
            std = torch.sqrt(self.var.to(torch.float32) + self.eps)
        else:
            mean, std = self.scale()[:2]
        return ((x.to(torch.float32) - mean) / std).clamp(-self.clip, self.clip)

    def normalize_numpy(self, x: np.ndarray) -> np.ndarray:
        """:meth:`forward` in numpy for a float32 ``x`` (the same float32 operations, so the
        same bits), for statistics on the CPU.

        Examples
        --------
        >>> rms = RunningMeanStd((2,))
        >>> rms.update(Moments.of(np.array([[1.0, 2.0], [3.0, 6.0]])))
        >>> rms.normalize_numpy(np.array([[3.0, 6.0]], np.float32)).round(3).tolist()
        [[1.0, 1.0]]
        """
        scale = self._np_scale
        if scale is None:
            mean_t, std_t = self.scale()[:2]
            scale = self._np_scale = (mean_t.numpy(), std_t.numpy())
        mean, std = scale
        out = x - mean
        out /= std
        return np.clip(out, -self.clip, self.clip, out=out)


def shifted_sums(batch: Moments, center: np.ndarray) -> np.ndarray:
    """``[count, sum(x - center), sum((x - center)**2)]`` flattened (float64): sums that an
    average across replicas keeps (up to the replica count), unlike means and ``m2``.

    Examples
    --------
    >>> shifted_sums(Moments.of(np.array([[1.0], [3.0]])), np.zeros(1)).tolist()
    [2.0, 4.0, 10.0]
    """
    d = batch.mean - center
    return np.concatenate([[batch.count], (batch.count * d).ravel(),
                           (batch.m2 + batch.count * d**2).ravel()])


def from_shifted_sums(sums: np.ndarray, center: np.ndarray, scale: float = 1.0) -> Moments:
    """The :class:`Moments` of :func:`shifted_sums` (each sum multiplied by ``scale`` first:
    the replica count, to undo an average).

    Examples
    --------
    >>> m = Moments.of(np.array([[1.0], [3.0]]))
    >>> back = from_shifted_sums(shifted_sums(m, np.ones(1)) / 2, np.ones(1), scale=2)
    >>> back.count, back.mean.tolist(), back.m2.tolist()
    (2.0, [2.0], [2.0])
    """
    sums = np.asarray(sums, dtype=np.float64) * scale
    count = float(sums[0])
    n = (len(sums) - 1) // 2
    s1, s2 = sums[1 : 1 + n].reshape(center.shape), sums[1 + n :].reshape(center.shape)
    if count == 0:
        return Moments(0.0, np.zeros_like(center), np.zeros_like(center))
    d = s1 / count
    return Moments(count, center + d, np.maximum(s2 - count * d**2, 0.0))
