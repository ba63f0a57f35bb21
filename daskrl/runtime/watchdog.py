"""The watchdog: a task that runs too long, or a worker that stops answering, is not waited
for silently.

Dask reschedules the tasks of a worker that *leaves*; it does nothing about a task stuck
inside a live worker (an env step that blocks: the worker's event loop still answers), and
it removes a frozen worker (SIGSTOP, a swapped-out node) only after
``distributed.scheduler.worker-ttl``, five minutes by default. The run loop asks the
:class:`Watchdog` every second or so while it waits; a task of the run executing longer
than its role's bound (a task fusing several iterations: since it last finished one), or a
pinned worker silent that long, is a :class:`Hang`: it is
reported with the stack the worker shows for the task, the worker is restarted (its nanny
starts it again; without one it is removed), and the run loop places the fragments again
as it does for a lost worker.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from daskrl.core.keys import of_runs, role_of
from daskrl.runtime.engine import Activity, Backend

FLOOR_S = 60.0
"""The shortest default bound: first tasks build envs and learners, and load varies."""
FACTOR = 10.0
"""The default bound is this many times the median of the role's recent task times."""
QUIET_S = 5.0
"""A worker unheard of this long (ten heartbeats) while its task is past the bound is taken
as not answering: its stack is not asked for."""


@dataclass(frozen=True)
class Hang:
    """A task past its bound, or a worker silent past it."""

    worker: str
    seconds: float
    bound: float
    key: str | None = None
    """The task; None when the worker stopped answering while running none of the run's."""
    silent: bool = False
    """Whether the worker itself stopped answering (no heartbeat)."""

    def describe(self) -> str:
        """One line: what, where, for how long, against which bound.

        Examples
        --------
        >>> Hang("w1", 75.0, 60.0, "rollout-0-it3-ab12cd34").describe()
        "task rollout-0-it3-ab12cd34 on worker 'w1' has run 75 s (bound 60 s)"
        >>> Hang("w1", 61.0, 60.0, silent=True).describe()
        "worker 'w1' has not answered for 61 s (bound 60 s)"
        """
        bound = f"(bound {self.bound:.0f} s)"
        if self.silent:
            running = f" while running task {self.key}" if self.key else ""
            return (f"worker {self.worker!r} has not answered for {self.seconds:.0f} s"
                    f"{running} {bound}")
        return f"task {self.key} on worker {self.worker!r} has run {self.seconds:.0f} s {bound}"


def bound_for(role: str, activity: Activity, timeout: float | None,
              floor: float = FLOOR_S, factor: float = FACTOR) -> float:
    """How long a task of ``role`` may run: ``timeout`` when given, else
    max(``factor`` x the median of the role's recent durations, ``floor``).

    Examples
    --------
    >>> act = Activity(durations={"rollout": [2.0, 9.0, 3.0]})
    >>> bound_for("rollout", act, None), bound_for("rollout", act, None, floor=1.0)
    (60.0, 30.0)
    >>> bound_for("learner", act, 5.0)
    5.0
    """
    if timeout is not None:
        return timeout
    recent = activity.durations.get(role)
    return max(factor * statistics.median(recent), floor) if recent else floor


class Watchdog:
    """Finds hung tasks and silent workers of a run; restarts their workers.

    Parameters
    ----------
    backend : Backend
        Where the tasks run; a backend that is not :attr:`~Backend.watched` (the
        synchronous scheduler) turns the watchdog off.
    timeout : float, optional
        The bound in seconds for every task and worker (``--task-timeout``); None derives
        it per role (:func:`bound_for`).
    every : float
        Seconds between two questions to the scheduler.

    Examples
    --------
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> Watchdog(SyncBackend(), None).check(["ab12cd34"], ["local"])
    []
    """

    def __init__(self, backend: Backend, timeout: float | None, every: float = 1.0,
                 floor: float = FLOOR_S) -> None:
        self.backend, self.timeout, self.every, self.floor = backend, timeout, every, floor
        self.enabled = backend.watched
        self.next_check = 0.0

    def check(self, runs: Iterable[str], workers: Iterable[str]) -> list[Hang]:
        """The hangs among the tasks of ``runs`` (this run's attempts: a task let go of
        keeps its worker's thread) and the pinned ``workers``, one per worker.

        Asks the scheduler at most every :attr:`every` seconds; between, returns none.
        """
        now = time.monotonic()
        if not self.enabled or now < self.next_check:
            return []
        self.next_check = now + self.every
        return find_hangs(self.backend.activity(), runs, workers, self.timeout, self.floor)

    def handle(self, hangs: list[Hang]) -> str:
        """Report each hang on stderr with its task's stack and restart its worker; one line
        for them all (what the run loop records as the reason of the recovery)."""
        for hang in hangs:
            self._handle(hang)
        return "; ".join(hang.describe() for hang in hangs)

    def _handle(self, hang: Hang) -> None:
        where = ""  # a worker that stopped answering is not asked for a stack
        if hang.key is not None and not hang.silent:
            stack = self.backend.call_stack(hang.key, timeout=10.0)
            where = (f"its stack on the worker:\n{''.join(own_frames(stack)).rstrip()}"
                     if stack else "the worker did not answer for its stack")
        print(f"daskrl: hang: {hang.describe()}; restarting the worker"
              f"{'; ' + where if where else ''}", file=sys.stderr, flush=True)
        try:
            status = self.backend.restart_worker(hang.worker, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - reported; the run loop recovers regardless
            status = f"restart failed: {type(exc).__name__}: {exc}"
        print(f"daskrl: hang: worker {hang.worker!r}: {status}", file=sys.stderr, flush=True)


def own_frames(stack: list[str]) -> list[str]:
    """The frames from the fragment's call on (Dask's worker machinery above it dropped).

    Examples
    --------
    >>> own_frames(['File "distributed/worker.py", line 1, in run', 'File "daskrl/core/'
    ...             'failures.py", line 50, in __call__', 'File "env.py", line 3, in step'])
    ['File "daskrl/core/failures.py", line 50, in __call__', 'File "env.py", line 3, in step']
    """
    mark = os.path.join("daskrl", "core", "failures.py")
    first = next((i for i, frame in enumerate(stack) if mark in frame), 0)
    return stack[first:]


def find_hangs(activity: Activity, runs: Iterable[str], workers: Iterable[str],
               timeout: float | None, floor: float = FLOOR_S) -> list[Hang]:
    """One :class:`Hang` per worker: a task of ``runs`` past its bound, or one of
    ``workers`` silent past the run's bound (``timeout``, else ``floor``).

    Examples
    --------
    >>> act = Activity(running={"learner-0-it4-ab12cd34": ("w0", 12.0)},
    ...                silent={"w0": 0.4, "w1": 30.0})
    >>> [h.worker for h in find_hangs(act, ["ab12cd34"], ["w0", "w1"], 10.0)]
    ['w0', 'w1']
    >>> find_hangs(act, ["ab12cd34"], ["w1"], 20.0)[0].describe()
    "worker 'w1' has not answered for 30 s (bound 20 s)"
    >>> find_hangs(act, ["ab12cd34"], ["w0"], None)
    []
    """
    silent_bound = timeout if timeout is not None else floor
    mine = of_runs(runs)
    found: dict[str, Hang] = {}
    for key, (worker, seconds) in sorted(activity.running.items()):
        if not mine(key) or worker in found:
            continue  # another run's task
        bound = bound_for(role_of(key), activity, timeout, floor)
        if seconds > bound:
            quiet = activity.silent.get(worker, 0.0) > min(silent_bound, QUIET_S)
            found[worker] = Hang(worker, seconds, bound, key, silent=quiet)
    for worker in sorted(workers):
        quiet = activity.silent.get(worker)
        if worker not in found and quiet is not None and quiet > silent_bound:
            found[worker] = Hang(worker, quiet, silent_bound, silent=True)
    return list(found.values())
