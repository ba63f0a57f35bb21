"""Distribution policies: how one algorithm's fragments become an iteration graph.

A distribution is picked by name, with options after a colon:
``actors-learner`` (``actors-learner:stale=1`` overlaps rollouts with the update, one
update behind), ``central-inference:env_groups=2``, ``data-parallel:allreduce=torch``,
``single:iterations_per_task=4``, ``async``, ``impala:in_flight=2`` (free-running actors),
``apex:refresh_every=4`` (replay shards on their own workers).
"""

from __future__ import annotations

import inspect
from typing import Any

from daskrl.distributions.actors_learner import ActorsLearner
from daskrl.distributions.apex import Apex
from daskrl.distributions.async_grads import AsyncGradients
from daskrl.distributions.base import Distribution, IterationInputs, Unsupported, parse_spec
from daskrl.distributions.central_inference import CentralInference
from daskrl.distributions.data_parallel import DataParallel
from daskrl.distributions.impala import Impala
from daskrl.distributions.single import Single

KINDS: dict[str, type[Distribution]] = {
    cls.name: cls
    for cls in (ActorsLearner, CentralInference, DataParallel, Single, AsyncGradients, Impala,
                Apex)
}
"""Distribution name -> class (its constructor's keyword arguments are its options)."""

NAMES: tuple[str, ...] = tuple(sorted(KINDS))
"""The distribution names, sorted (for help texts)."""


AUTO = "auto"
"""The ``--distribution`` value that asks :mod:`daskrl.runtime.auto` to probe and choose."""


def is_auto(spec: str | None) -> bool:
    """Whether ``spec`` asks for :data:`AUTO` (no distribution of its own: chosen when a
    run starts, on its cluster).

    Examples
    --------
    >>> is_auto("auto"), is_auto("Auto"), is_auto("auto:once"), is_auto("single")
    (True, True, True, False)
    >>> is_auto(None)
    False
    """
    return spec is not None and spec.strip().lower().partition(":")[0] == AUTO


def auto_redecides(spec: str) -> bool:
    """Whether an :data:`AUTO` ``spec`` re-decides while the run goes on (``auto``) or keeps
    the probe's choice (``auto:once``).

    Examples
    --------
    >>> auto_redecides("auto"), auto_redecides("auto:once")
    (True, False)
    >>> auto_redecides("auto:twice")
    Traceback (most recent call last):
    ...
    ValueError: --distribution auto:twice: write auto (re-decides during the run) or auto:once
    """
    option = spec.strip().lower().partition(":")[2]
    if option not in ("", "once"):
        raise ValueError(f"--distribution {spec}: write auto (re-decides during the run) or "
                         "auto:once")
    return option == ""


def get_distribution(spec: str, **options: Any) -> Distribution:
    """A new distribution for one run, named by ``spec`` (``NAME[:KEY=VALUE[,KEY=VALUE]]``).

    Keyword ``options`` are merged over those in ``spec``. Each call builds a new instance:
    a distribution may keep state of the run it serves.

    Examples
    --------
    >>> get_distribution("actors-learner").name
    'actors-learner'
    >>> get_distribution("data-parallel:allreduce=torch").allreduce
    'torch'
    >>> get_distribution("central-inference", env_groups=3).groups
    3
    >>> get_distribution("single") is get_distribution("single")
    False
    """
    name, parsed = parse_spec(spec)
    parsed.update(options)
    cls = KINDS.get(name)
    if cls is None:
        raise ValueError(
            f"unknown distribution {name!r}: choose one of {', '.join(NAMES)}")
    known = list(inspect.signature(cls).parameters)
    unknown = sorted(set(parsed) - set(known))
    if unknown:
        raise ValueError(
            f"distribution {name!r} has no option {', '.join(unknown)}: its options "
            f"are {', '.join(known) or 'none'}")
    return cls(**parsed)


__all__ = ["AUTO", "KINDS", "NAMES", "Distribution", "IterationInputs", "Unsupported",
           "auto_redecides", "get_distribution", "is_auto"]
