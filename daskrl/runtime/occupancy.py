"""Runs that train at once from one process spread over the workers.

A run places its fragments on the first workers that offer their resources
(:func:`~daskrl.core.placement.plan_placement`), so a small run sits on ``w0`` alone.
Several runs started from one process (a sweep, or a loop of ``daskrl.train(...,
wait=False)`` on one ``Client``) would all sit there while other workers idle: each run
claims the workers it is placed on here, and the next one prefers workers fewer replicas
of the others hold. One run alone is placed exactly as before; under ``--deterministic``
where a replica runs does not change what it computes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from daskrl.core.placement import Placement

_lock = threading.Lock()
_claims: dict[str, Counter[str]] = {}


def place_claimed(token: str, plan: Callable[[Counter[str]], Placement]) -> Placement:
    """``plan(busy)``, where ``busy`` counts the replicas other runs' claims hold on each
    worker; the placement becomes ``token``'s claim (replacing its earlier one).

    Examples
    --------
    >>> from daskrl.core.fragment import Fragment
    >>> from daskrl.core.placement import plan_placement
    >>> from daskrl.core.resources import Resources
    >>> frags = [Fragment(print, "learner", Resources(cpu=1))]
    >>> spec = {"w0": {"CPU": 1}, "w1": {"CPU": 1}}
    >>> first = place_claimed("a", lambda busy: plan_placement(frags, spec, busy))
    >>> second = place_claimed("b", lambda busy: plan_placement(frags, spec, busy))
    >>> first.workers["learner"], second.workers["learner"]
    (('w0',), ('w1',))
    >>> release("a"); release("b")
    """
    with _lock:  # two runs placed at once must see each other's claims
        busy: Counter[str] = Counter()
        for other, held in _claims.items():
            if other != token:
                busy.update(held)
        placement = plan(busy)
        _claims[token] = Counter(name for names in placement.workers.values()
                                 for name in names)
    return placement


def release(token: str) -> None:
    """Drop ``token``'s claim (its run ended)."""
    with _lock:
        _claims.pop(token, None)
