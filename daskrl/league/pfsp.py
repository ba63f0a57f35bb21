"""Prioritised fictitious self-play: opponents drawn by the learner's chance of losing.

AlphaStar's league samples an opponent ``B`` for learner ``A`` with probability proportional
to ``f(P[A beats B])``; ``f`` is ``(1 - x) ** 2`` ("hard": the opponents it loses to most),
``x * (1 - x)`` ("variance": the even matches) or constant ("uniform", plain fictitious
self-play).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Weighting = Literal["hard", "variance", "uniform"]
WEIGHTINGS: tuple[str, ...] = ("hard", "variance", "uniform")


def pfsp_probabilities(win_rates: Sequence[float], weighting: Weighting = "hard"
                       ) -> np.ndarray:
    """The chance of drawing each opponent, from the learner's win rate against each.

    Examples
    --------
    >>> pfsp_probabilities([0.9, 0.5, 0.0]).round(3).tolist()
    [0.008, 0.198, 0.794]
    >>> pfsp_probabilities([1.0, 1.0]).tolist()  # nothing left to learn: uniform
    [0.5, 0.5]
    >>> pfsp_probabilities([0.5, 0.9], "variance").round(3).tolist()
    [0.735, 0.265]
    """
    x = np.clip(np.asarray(win_rates, dtype=np.float64), 0.0, 1.0)
    if weighting == "hard":
        f = (1.0 - x) ** 2
    elif weighting == "variance":
        f = x * (1.0 - x)
    elif weighting == "uniform":
        f = np.ones_like(x)
    else:
        raise ValueError(f"PFSP weighting {weighting!r} is not known: choose "
                         f"{', '.join(WEIGHTINGS)}")
    total = f.sum()
    if len(x) == 0:
        return f
    return f / total if total > 0 else np.full(len(x), 1.0 / len(x))


def estimated_win_rate(score: float, games: float, prior: float = 1.0) -> float:
    """The learner's win rate from a (decayed) score and game count, with ``prior`` games of
    an even result, so an opponent it never met counts as an even match.

    Examples
    --------
    >>> estimated_win_rate(0.0, 0.0), estimated_win_rate(9.0, 10.0, prior=2.0)
    (0.5, 0.8333333333333334)
    """
    return (score + 0.5 * prior) / (games + prior)
