"""Distribution policies: how one algorithm's fragments become an iteration graph.

A distribution is picked by name, with options after a colon:
``actors-learner`` (``actors-learner:stale=1`` overlaps rollouts with the update, one
update behind), ``central-inference:env_groups=2``, ``data-parallel:allreduce=torch``,
``single:iterations_per_task=4``, ``async``.
"""

from __future__ import annotations

from typing import Any

from .actors_learner import ActorsLearner
from .async_grads import AsyncGradients
from .base import Distribution, IterationInputs, parse_spec
from .central_inference import CentralInference
from .data_parallel import DataParallel
from .single import Single

KINDS: dict[str, type] = {
    cls.name: cls
    for cls in (ActorsLearner, CentralInference, DataParallel, Single, AsyncGradients)
}
"""Distribution name -> class (its constructor's keyword arguments are its options)."""

DISTRIBUTIONS: dict[str, Distribution] = {name: cls() for name, cls in KINDS.items()}
"""Each distribution with its default options."""


def get_distribution(spec: str, **options: Any) -> Distribution:
    """The distribution named by ``spec`` (``NAME[:KEY=VALUE[,KEY=VALUE]]``).

    Keyword ``options`` are merged over those in ``spec``.

    Examples
    --------
    >>> get_distribution("actors-learner").name
    'actors-learner'
    >>> get_distribution("data-parallel:allreduce=torch").allreduce
    'torch'
    >>> get_distribution("central-inference", env_groups=3).groups
    3
    """
    name, parsed = parse_spec(spec)
    parsed.update(options)
    cls = KINDS.get(name)
    if cls is None:
        raise ValueError(
            f"unknown distribution {name!r}: choose one of {', '.join(sorted(KINDS))}")
    if not parsed:
        return DISTRIBUTIONS[name]
    try:
        return cls(**parsed)
    except TypeError:
        import inspect

        known = [p for p in inspect.signature(cls).parameters]
        raise ValueError(
            f"distribution {name!r} has no option {', '.join(sorted(parsed))}: its options "
            f"are {', '.join(known) or 'none'}") from None


__all__ = ["DISTRIBUTIONS", "KINDS", "Distribution", "IterationInputs", "get_distribution"]
