"""``--adapt MIN:MAX``: workers added while the learner waits for rollouts, released when it
does not, through Dask's own adaptive scaling.

Dask's :class:`~distributed.deploy.Adaptive` resizes a cluster (a ``LocalCluster``, a
dask-jobqueue pool) towards what its :meth:`~distributed.deploy.Adaptive.target` says, by
the cluster's own ``scale`` and ``retire_workers``; its default target is the scheduler's
task backlog, which an RL run does not have (its tasks are pinned and few). Here the target
is the run's: :class:`Elastic` reads each recorded iteration's metrics (the learner's wait
for rollouts: ``1 - learner_busy`` for free-running actors, the rollout's share of the
iteration in lockstep) and asks for one worker more while the learner waits for most of a
few iterations in a row, up to the workers the distribution can use (one per actor) and
``MAX``; one fewer while it hardly waits, down to ``MIN``. :class:`RunAdaptive` hands that
to Dask, which starts and retires the workers (after ``wait_count`` intervals in a row of
a lower target, Dask's own damping), and never retires the learner's worker.

A worker that joins is used at the next iteration boundary
(:meth:`daskrl.runtime.run_loop.RunLoop._notice_joins`: the replicas are placed again,
learning state carried over exactly); one that leaves (retired, or a pre-empted job) is
the lost-worker path: the run goes on from its last finished iteration on the workers
left, at once when they can host it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from distributed.deploy import Adaptive

from daskrl.core.placement import Placement

UP = 0.5
"""The learner waiting more than this share of each of the last :data:`WINDOW` iterations
asks for a worker more."""

DOWN = 0.15
"""The learner waiting less than this share of each of them asks for one fewer."""

WINDOW = 3
"""Iterations in a row the signal must hold."""


def parse_adapt(text: str) -> tuple[int, int]:
    """``MIN:MAX`` as two integers, refused in one line when it is not that.

    Examples
    --------
    >>> parse_adapt("1:4")
    (1, 4)
    >>> parse_adapt("4:1")
    Traceback (most recent call last):
    ...
    ValueError: --adapt 4:1: MIN must be >= 1 and <= MAX, as in --adapt 1:4
    """
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--adapt {text}: write MIN:MAX worker counts, e.g. --adapt 1:4"
                         ) from None
    if low < 1 or low > high:
        raise ValueError(f"--adapt {text}: MIN must be >= 1 and <= MAX, as in --adapt 1:4")
    return low, high


def learner_wait_share(row: Mapping[str, Any]) -> float | None:
    """The share of an iteration the learner spent waiting for rollouts: ``1 -
    learner_busy`` where the distribution measures it (free-running actors), else the
    rollouts' share of the iteration (lockstep: the learner waits for all of them).

    Examples
    --------
    >>> learner_wait_share({"learner_busy": 0.5})
    0.5
    >>> learner_wait_share({"rollout_s": 0.25, "iteration_s": 0.5})  # lockstep
    0.5
    >>> learner_wait_share({}) is None
    True
    """
    busy = row.get("learner_busy")
    if isinstance(busy, (int, float)) and math.isfinite(busy):
        return max(0.0, 1.0 - float(busy))
    roll, wall = row.get("rollout_s"), row.get("iteration_s")
    if isinstance(roll, (int, float)) and isinstance(wall, (int, float)) and wall > 0:
        return min(1.0, max(0.0, float(roll) / float(wall)))
    return None


class Elastic:
    """The worker count a run wants, from its own iterations (see the module's text).

    Parameters
    ----------
    minimum, maximum : int
        ``--adapt MIN:MAX``.
    usable : int
        The most workers the distribution can use (``workers_wanted``: one per actor).

    Examples
    --------
    >>> e = Elastic(1, 4, usable=3)
    >>> place = Placement({}, {"learner": ("w0",), "rollout": ("w0", "w0", "w0")})
    >>> for it in range(3):
    ...     e.observe({"iteration": it + 1, "learner_busy": 0.2}, place)
    >>> e.target, e.keep
    (2, {'w0'})
    >>> for it in range(3, 9):
    ...     e.observe({"iteration": it + 1, "learner_busy": 0.99}, place)
    >>> e.target, [c["to"] for c in e.changes]
    (1, [2, 1])
    """

    def __init__(self, minimum: int, maximum: int, usable: int) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.usable = max(minimum, min(maximum, usable))
        self.target = minimum
        self.keep: set[str] = set()  # workers never closed: the learner's
        self.changes: list[dict[str, Any]] = []
        self._shares: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._worker_s = 0.0
        self._last: tuple[float, int] | None = None

    def observe(self, row: Mapping[str, Any], placement: Placement) -> None:
        """Take one recorded iteration (a ``metrics.csv`` row) under ``placement``."""
        share = learner_wait_share(row)
        with self._lock:
            self.keep = {w for w in placement.workers.get("learner", ()) if w}
            if share is None:
                return
            self._shares.append(share)
            if len(self._shares) < WINDOW:
                return
            if min(self._shares) > UP and self.target < self.usable:
                self._change(self.target + 1, row, f"the learner waited "
                             f"{min(self._shares):.0%}+ of {WINDOW} iterations")
            elif max(self._shares) < DOWN and self.target > self.minimum:
                self._change(self.target - 1, row, f"the learner waited under "
                             f"{DOWN:.0%} of {WINDOW} iterations")

    def _change(self, to: int, row: Mapping[str, Any], why: str) -> None:
        self.changes.append({"iteration": row.get("iteration"), "from": self.target,
                             "to": to, "why": why,
                             "at_s": round(time.monotonic() - self._started, 3)})
        self.target = to
        self._shares.clear()  # the next decision waits for the change to show

    def count_workers(self, n: int) -> None:
        """Integrate worker-seconds: ``n`` workers from now on."""
        now = time.monotonic()
        with self._lock:
            if self._last is not None:
                self._worker_s += (now - self._last[0]) * self._last[1]
            self._last = (now, n)

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps as ``adapt``."""
        self.count_workers(self._last[1] if self._last else 0)
        return {"minimum": self.minimum, "maximum": self.maximum, "usable": self.usable,
                "target": self.target, "changes": list(self.changes),
                "worker_s": round(self._worker_s, 3)}


class RunAdaptive(Adaptive):
    """Dask's adaptive scaling towards :attr:`Elastic.target`; the learner's workers are
    never closed. Passed to ``cluster.adapt(Adaptive=RunAdaptive, elastic=...)``."""

    def __init__(self, *args: Any, elastic: Elastic, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.elastic = elastic

    async def target(self) -> int:
        """The run's wish; Dask clips it to ``minimum``/``maximum``."""
        self.elastic.count_workers(len(self.cluster.scheduler_info.get("workers", {})))
        return self.elastic.target

    async def workers_to_close(self, target: int) -> list[str]:
        """The newest workers beyond ``target`` that do not hold the learner."""
        infos = self.cluster.scheduler_info.get("workers", {}).values()
        names = [str(w["name"]) for w in infos if str(w["name"]) not in self.elastic.keep]
        extra = len(infos) - target
        return sorted(names, key=_name_order, reverse=True)[:max(0, extra)]


def _name_order(name: str) -> tuple[int, str]:
    """``w10`` after ``w9``."""
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else -1, name)


def adapt(cluster: Any, elastic: Elastic, interval: float = 1.0, wait_count: int = 3) -> Any:
    """Turn on :class:`RunAdaptive` on ``cluster`` (any ``SpecCluster``: the embedded
    cluster, a dask-jobqueue pool)."""
    return cluster.adapt(Adaptive=RunAdaptive, minimum=elastic.minimum,
                         maximum=elastic.maximum, interval=interval, wait_count=wait_count,
                         elastic=elastic)


def plan(text: str, usable: int, deterministic: bool) -> Elastic:
    """``--adapt MIN:MAX``'s policy for a run whose distribution can use ``usable``
    workers, or a one-line refusal (callers add their own conditions).

    Examples
    --------
    >>> plan("1:4", 2, False).usable
    2
    >>> plan("1:4", 2, True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --adapt places replicas anew as workers come and go, ...: not with --deterministic
    """
    low, high = parse_adapt(text)
    if deterministic:
        raise ValueError("--adapt places replicas anew as workers come and go, which starts "
                         "their envs afresh: not with --deterministic")
    return Elastic(low, high, usable)
