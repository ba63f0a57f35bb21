"""The learner of a league's learning members: the main agent and its exploiters, each a PPO
learner of its own, updated on the moves its games produced.

The actors tag every transition with the index of the member that made it (``member``);
the update splits each batch by it. The weights the actors receive hold the main agent's
parameters under their plain names and each exploiter's under ``<member>/`` (see
:func:`daskrl.league.coordinator.member_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from daskrl.algos.learner import ActorCriticLearner


def member_names(exploiters: int) -> list[str]:
    """The learning members: ``main``, then ``exploiter0``, ``exploiter1``...

    Examples
    --------
    >>> member_names(2)
    ['main', 'exploiter0', 'exploiter1']
    """
    return ["main", *(f"exploiter{i}" for i in range(exploiters))]


def select(batch: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The transitions of ``batch`` at ``rows`` (its arrays only)."""
    return {k: v[rows] for k, v in batch.items() if isinstance(v, np.ndarray)}


class LeagueLearner:
    """One :class:`~daskrl.algos.learner.ActorCriticLearner` per learning member.

    Examples
    --------
    >>> from marl.board_network import MaskedActorCritic
    >>> make = lambda seed: ActorCriticLearner(0, 0, seed, network=lambda: MaskedActorCritic(
    ...     (3, 3, 2), 9, (8,)))
    >>> learner = LeagueLearner(member_names(1), make, seed=0)
    >>> sorted({k.split("/")[0] for k in learner.weights() if "/" in k})
    ['exploiter0']
    """

    def __init__(self, members: list[str], make: Callable[[int], ActorCriticLearner],
                 seed: int) -> None:
        self.members = list(members)
        self.learners = {m: make(seed + 1000 * i) for i, m in enumerate(self.members)}

    def update(self, batches: list[dict[str, Any]], progress: float) -> dict[str, float]:
        """Each member's PPO update on its own moves; the main agent's metrics under their
        names, an exploiter's under ``<member>/``."""
        metrics: dict[str, float] = {}
        for index, (name, learner) in enumerate(self.learners.items()):
            parts = [select(b, b["member"] == index) for b in batches]
            parts = [p for p in parts if len(p["obs"])]
            if not parts:
                continue
            got = learner.update(parts, progress)
            metrics.update(got if name == "main" else {f"{name}/{k}": v for k, v in got.items()})
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """The main agent's weights by name, each exploiter's under ``<member>/``."""
        out: dict[str, torch.Tensor] = {}
        for name, learner in self.learners.items():
            prefix = "" if name == "main" else f"{name}/"
            out.update({prefix + k: v for k, v in learner.weights().items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        """Every member's state, and ``model``: :meth:`weights` (what a resume sends the
        actors first)."""
        return {"model": self.weights(),
                "members": {m: learner.state_dict() for m, learner in self.learners.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        for name, learner in self.learners.items():
            learner.load_state_dict(state["members"][name])
