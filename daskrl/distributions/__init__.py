"""Distribution policies: how one algorithm's fragments become an iteration graph."""

from __future__ import annotations

from .actors_learner import ActorsLearner
from .base import Distribution, IterationInputs

DISTRIBUTIONS: dict[str, Distribution] = {d.name: d for d in (ActorsLearner(),)}


def get_distribution(name: str) -> Distribution:
    """The distribution called ``name``.

    Examples
    --------
    >>> get_distribution("actors-learner").name
    'actors-learner'
    """
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown distribution {name!r}: choose one of {', '.join(sorted(DISTRIBUTIONS))}"
        ) from None


__all__ = ["DISTRIBUTIONS", "Distribution", "IterationInputs", "get_distribution"]
