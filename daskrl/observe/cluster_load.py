"""What a run costs the cluster: the scheduler's task rate and CPU, and each worker process's
CPU and outgoing bytes, read from Dask's own counters.

:class:`TaskCounter` (a ``SchedulerPlugin``) counts the tasks the scheduler has seen finish;
:func:`sample` reads it with the scheduler's process CPU (``Client.run_on_scheduler``) and,
from every worker (``Client.run``), its process's CPU and the bytes it has sent
(``Worker.transfer_outgoing_bytes_total``: task inputs other workers fetched from it and
results clients gathered). Two samples make rates (:func:`rates`). The scheduler's CPU is
its own only when it runs in a process of its own (``--scheduler ADDRESS``,
:func:`daskrl.cluster.hosts.host_cluster`); the embedded one shares the driver's.

Examples
--------
>>> a, b = Sample(0.0, 10, 1.0, {}), Sample(2.0, 110, 1.5, {})
>>> rates(a, b)["scheduler_tasks_per_s"], rates(a, b)["scheduler_cpu_share"]
(50.0, 0.25)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN_NAME = "daskrl-task-counter"


class TaskCounter(SchedulerPlugin):
    """Counts the tasks that finish on the scheduler (``memory`` or ``erred``)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.done = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Count a task that reached ``memory`` or ``erred`` from ``processing``."""
        if start == "processing" and finish in ("memory", "erred"):
            self.done += 1


@dataclass(frozen=True)
class Sample:
    """The cluster's counters at one moment."""

    time: float
    """``time.time()`` on the scheduler."""
    tasks_done: int
    """Tasks the scheduler saw finish since :class:`TaskCounter` was registered."""
    scheduler_cpu_s: float
    """CPU seconds of the scheduler's process."""
    workers: Mapping[str, tuple[int, float, int]]
    """Worker name -> (process id, CPU seconds of its process, bytes it has sent)."""


def _scheduler_side(dask_scheduler: Any) -> tuple[float, int, float]:
    counter = dask_scheduler.plugins.get(PLUGIN_NAME)
    times = psutil.Process().cpu_times()
    return time.time(), counter.done if counter is not None else -1, times.user + times.system


def _worker_side(dask_worker: Any) -> tuple[str, int, float, int]:
    times = psutil.Process().cpu_times()
    return (str(dask_worker.name), os.getpid(), times.user + times.system,
            int(dask_worker.transfer_outgoing_bytes_total))


def start_counting(client: Client) -> None:
    """Register :class:`TaskCounter` on the scheduler (once per scheduler)."""
    client.register_plugin(TaskCounter(), name=PLUGIN_NAME)


def sample(client: Client) -> Sample:
    """The counters now (workers that do not answer are left out)."""
    when, done, cpu = client.run_on_scheduler(_scheduler_side)
    answers = client.run(_worker_side, on_error="ignore")
    workers = {a[0]: (a[1], a[2], a[3]) for a in answers.values() if isinstance(a, tuple)}
    return Sample(when, done, cpu, workers)


def rates(a: Sample, b: Sample, worker_groups: Mapping[str, set[str]] | None = None
          ) -> dict[str, Any]:
    """Rates between two samples: tasks/s, the scheduler's CPU share (of one core), and
    per group of workers (``worker_groups``: a label -> worker names) their CPU share and
    bytes sent per second. Thread workers that share a process count it once per group.

    Examples
    --------
    >>> a = Sample(0.0, 0, 0.0, {"w0": (7, 1.0, 100), "w1": (8, 1.0, 0)})
    >>> b = Sample(4.0, 8, 2.0, {"w0": (7, 3.0, 500), "w1": (8, 2.0, 400)})
    >>> r = rates(a, b, {"actors": {"w0", "w1"}})
    >>> r["actors_cpu_share"], r["actors_bytes_per_s"]
    (0.75, 200.0)
    """
    dt = max(b.time - a.time, 1e-9)
    out: dict[str, Any] = {"scheduler_tasks_per_s": (b.tasks_done - a.tasks_done) / dt,
                           "scheduler_cpu_share": (b.scheduler_cpu_s - a.scheduler_cpu_s) / dt,
                           "window_s": dt}
    for label, names in (worker_groups or {}).items():
        cpu: dict[int, float] = {}
        sent = 0
        for name in names:
            if name in a.workers and name in b.workers:
                pid, cpu0, sent0 = a.workers[name]
                _, cpu1, sent1 = b.workers[name]
                cpu[pid] = cpu1 - cpu0
                sent += sent1 - sent0
        out[f"{label}_cpu_share"] = sum(cpu.values()) / dt
        out[f"{label}_bytes_per_s"] = sent / dt
    return out
