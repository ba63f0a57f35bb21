"""Advice while a run trains: when one part of the iteration dominates a sustained window,
the run says once what to change.

A run re-plans by itself only where it can (a worker that joins gets replicas;
``--adapt`` grows the cluster while the learner waits). Where it cannot (more actors or envs
change the algorithm's batch; a learner-bound run needs other settings), it says so:
:class:`RunAdvisor` watches each recorded iteration's ``time/`` parts (the task-stream
split of :mod:`daskrl.observe.timeline`) and, when the same part (:func:`~daskrl.observe.
advice.bound`) takes at least :data:`SHARE` of every iteration of a window of
:data:`WINDOW`, prints one line with :func:`~daskrl.observe.advice.advice` for it and keeps
it for ``summary.json``'s ``advice``. Each kind is said once a run. ``daskrl profile OUT``
gives the same advice after the run, from all of it.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Mapping
from typing import Any

from daskrl.core.placement import Placement
from daskrl.observe.advice import advice, bound
from daskrl.observe.parts import PARTS

WINDOW = 10
"""Iterations in a row one part must dominate."""

SHARE = 0.6
"""The share of each iteration's wall time that part must take."""

LABELS = {"env": "stepping envs", "inference": "inference", "learn": "the learner",
          "transfer": "moving data", "overhead": "the scheduler and idle time"}


class RunAdvisor:
    """Watches a run's iterations (a :attr:`RunSettings.observers` callable).

    Parameters
    ----------
    config : mapping
        The graph's settings (``summary.json``'s ``config``), so the advice names values.
    skip : set of str
        Kinds the run handles itself (``{"env"}`` under ``--adapt``).
    echo : bool
        Print each piece of advice to stderr when it is given.

    Examples
    --------
    >>> adv = RunAdvisor({"num_actors": 1, "num_envs": 8}, echo=False)
    >>> place = Placement({}, {})
    >>> for i in range(2, 12):
    ...     adv.observe({"iteration": i, "iteration_s": 1.0, "time/env_s": 0.8,
    ...                  "time/learn_s": 0.2}, place)
    >>> [(a["kind"], a["iterations"]) for a in adv.given]
    [('env', [2, 11])]
    >>> adv.given[0]["advice"][:48]
    'env-bound: add rollout replicas (--num-actors 2)'
    """

    def __init__(self, config: Mapping[str, Any] | None = None, skip: set[str] | None = None,
                 echo: bool = True) -> None:
        self.config = dict(config or {})
        self.skip = set(skip or ())
        self.echo = echo
        self.given: list[dict[str, Any]] = []
        self._window: deque[tuple[int, str, float]] = deque(maxlen=WINDOW)

    def observe(self, row: Mapping[str, Any], placement: Placement) -> None:
        """Take one recorded iteration."""
        it, wall = row.get("iteration"), row.get("iteration_s")
        if not isinstance(it, int) or it <= 1 or not _finite(wall) or wall <= 0:
            return  # the first iteration carries the start-up
        parts = {label: float(row[col]) for label, col in PARTS.items()
                 if _finite(row.get(col))}
        if not parts:
            return
        kind, seconds = bound(parts)
        self._window.append((it, kind, seconds / wall))
        if len(self._window) < WINDOW:
            return
        kinds = {k for _, k, _ in self._window}
        share = min(s for _, _, s in self._window)
        if len(kinds) > 1 or share < SHARE or kind in self.skip:
            return
        if any(g["kind"] == kind for g in self.given):
            return
        text = advice(kind, self.config)
        first = self._window[0][0]
        self.given.append({"kind": kind, "iterations": [first, it], "share": round(share, 3),
                           "advice": text})
        if self.echo:
            print(f"daskrl: iterations {first}-{it}: {LABELS[kind]} took {share:.0%}+ of each; "
                  f"{text}", file=sys.stderr)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
