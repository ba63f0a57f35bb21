"""Dask's per-worker upkeep, and the settings that quiet it where many workers share a process.

Every Dask worker keeps periodic callbacks on its process's event loop: the statistical
profiler (every 10 ms), the event-loop tick (20 ms), the memory monitor (100 ms), the
system monitor (500 ms), heartbeats. Thread workers (``LocalCluster(processes=False)``)
share one process and one event loop with each other, the scheduler and, in a notebook,
the client: with 128 of them those callbacks alone kept a core about 30 % busy while
nothing ran, and the loop that must pass every task's messages fell behind
(``benchmarks/many_workers.md``). :data:`QUIET_UPKEEP` are the public Dask settings that
restore the throughput; they are read when a worker is created, so a cluster must be made
under them.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

import dask
from distributed import Client, Worker

from daskrl.core.scheduler_workers import scheduler_workers

QUIET_UPKEEP: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "10s",
    "distributed.worker.memory.monitor-interval": "1s",
}
"""What each setting gives up: the dashboard's Profile page stays empty; "event loop was
unresponsive" warnings still fire (their limit is 3 s) but tick statistics are coarser; the
dashboard's system plots get a point every 10 s; a worker is paused, or its data spilled, up
to 1 s later than Dask's default 100 ms after its process passes a threshold."""

MANY_WORKERS = 32
"""Workers in one process from which :func:`upkeep_advice` speaks (at 32 the upkeep cost
7 % of the 2-worker throughput, at 128 most of it)."""


def quiet_upkeep() -> Any:
    """A context (``dask.config.set``) under which new workers keep less upkeep.

    Examples
    --------
    >>> with quiet_upkeep():
    ...     dask.config.get("distributed.worker.profile.enabled")
    False
    """
    return dask.config.set(QUIET_UPKEEP)


def _worker_upkeep(dask_worker: Worker) -> tuple[int, bool]:
    """This worker's process id, and whether its statistical profiler runs (on the worker)."""
    return os.getpid(), "profile" in dask_worker.periodic_callbacks


def upkeep_advice(client: Client, many: int = MANY_WORKERS) -> str | None:
    """One line of advice when ``many`` or more workers share a process with the
    statistical profiler on (None otherwise).

    Only a host with ``many`` workers is asked (``Client.run`` on its workers, once); a
    worker that does not answer is left out.

    Examples
    --------
    >>> upkeep_advice(client)  # doctest: +SKIP
    """
    info = scheduler_workers(client)
    hosts = Counter(str(w.get("host")) for w in info.values())
    crowded_hosts = {h for h, n in hosts.items() if n >= many}
    if not crowded_hosts:
        return None
    asked = [addr for addr, w in info.items() if str(w.get("host")) in crowded_hosts]
    answers = client.run(_worker_upkeep, workers=asked, on_error="ignore")
    shared: Counter[str] = Counter()
    profiled: set[str] = set()
    for addr, answer in answers.items():
        if not isinstance(answer, tuple):
            continue
        process = f"{info[addr].get('host')}:{answer[0]}"
        shared[process] += 1
        if answer[1]:
            profiled.add(process)
    crowded = [(n, p) for p, n in shared.items() if n >= many and p in profiled]
    if not crowded:
        return None
    n, process = max(crowded)
    return (f"daskrl: {n} Dask workers share process {process} with Dask's per-worker upkeep "
            "on (a profiler every 10 ms each): it slows the run; create the cluster under "
            "daskrl.cluster.upkeep.quiet_upkeep() (dask.config.set(QUIET_UPKEEP)), or use "
            "fewer workers with more threads each (docs/howto/own-cluster.md: Many workers in "
            "one process)")


def advise(client: Client) -> None:
    """Print :func:`upkeep_advice`'s line on stderr, if it has one."""
    line = upkeep_advice(client)
    if line:
        print(line, file=sys.stderr)
