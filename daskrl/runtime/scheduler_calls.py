"""What the Dask backend runs on the scheduler: a clock of task durations, the running
tasks and silent workers of the moment, restarts, and the resource restrictions it holds.

Functions here are sent with ``Client.run_on_scheduler`` (the scheduler must be able to
import daskrl) and take the scheduler as ``dask_scheduler``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from dask.delayed import Delayed
from distributed.diagnostics.plugin import SchedulerPlugin

from daskrl.cluster.local import worker_id
from daskrl.compat import graph_annotations
from daskrl.core.keys import role_of
from daskrl.core.worker_state import PROGRESS_TOPIC
from daskrl.runtime.engine import Activity


class TaskClock(SchedulerPlugin):
    """Keeps the compute time of the last tasks of each role, for the watchdog's bound,
    and when each running task last reported progress.

    The scheduler calls :meth:`transition` for every task; a finished one carries its
    ``startstops`` (the same records as Dask's task stream). A task that runs several
    iterations sends an event after each (:func:`~daskrl.core.worker_state.report_progress`),
    which :meth:`log_event` hears.
    """

    name = "daskrl-task-clock"
    idempotent = True
    keep = 32

    def __init__(self) -> None:
        self.recent: dict[str, deque[float]] = {}
        self.progressed: dict[str, float] = {}
        """Running task key -> when it last reported progress (``time.time()``)."""

    def log_event(self, topic: str, msg: Any) -> None:
        """Note a running task's progress report."""
        if topic == PROGRESS_TOPIC:
            self.progressed[str(msg)] = time.time()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Record a finished task's compute time under its role."""
        if start == "processing":
            self.progressed.pop(str(key), None)
        if start != "processing" or finish != "memory":
            return
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                role = role_of(key)
                self.recent.setdefault(role, deque(maxlen=self.keep)).append(
                    ss["stop"] - ss["start"])


def scheduler_activity(dask_scheduler: Any) -> Activity:
    """:class:`Activity` as the scheduler sees it (runs on the scheduler)."""
    now = time.time()
    running: dict[str, tuple[str, float]] = {}
    silent: dict[str, float] = {}
    clock = dask_scheduler.plugins.get(TaskClock.name)
    progressed = clock.progressed if clock else {}
    for addr, ws in dask_scheduler.workers.items():
        quiet = max(0.0, now - ws.last_seen)
        name = worker_id(ws.name, addr)
        silent[name] = quiet
        for ts, seconds in ws.executing.items():
            key = str(ts.key)
            seconds += quiet
            if key in progressed:  # since its last progress report, not since its start
                seconds = min(seconds, now - progressed[key])
            running[key] = (name, seconds)
    durations = {role: list(d) for role, d in clock.recent.items()} if clock else {}
    return Activity(running, silent, durations)


async def scheduler_restart(dask_scheduler: Any, name: str, timeout: float) -> str:
    """Restart (nanny) or remove (no nanny) worker ``name`` without waiting for it to
    answer: a worker that stopped answering cannot be retired gracefully."""
    addrs = [addr for addr, ws in dask_scheduler.workers.items()
             if worker_id(ws.name, addr) == name]
    if not addrs:
        return "gone"
    out = await dask_scheduler.restart_workers(
        addrs, timeout=timeout, wait_for_workers=False, on_error="return",
        stimulus_id=f"daskrl-watchdog-{time.time()}")
    return str(out.get(addrs[0], "restarted"))


def expected_restrictions(graph: Delayed) -> dict[Any, dict[str, float]]:
    """Task key -> the resources its layer was annotated with.

    Examples
    --------
    >>> from dask import annotate, delayed
    >>> with annotate(resources={"GPU": 1}):
    ...     d = delayed(abs, pure=False)(-1, dask_key_name="learner-0")
    >>> expected_restrictions(d)
    {'learner-0': {'GPU': 1}}
    """
    return {key: dict(notes["resources"]) for key, notes in graph_annotations(graph).items()
            if notes.get("resources")}


def scheduler_restrictions(dask_scheduler: Any, keys: list[Any]) -> dict[Any, dict[str, float]]:
    tasks = dask_scheduler.tasks
    return {k: {r: float(v) for r, v in (tasks[k].resource_restrictions or {}).items()}
            for k in keys if k in tasks}
