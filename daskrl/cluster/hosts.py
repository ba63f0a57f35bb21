"""A cluster of separate processes: the scheduler and every worker in a process of its own,
each optionally inside a Linux network namespace (an emulated host).

What the embedded cluster cannot show, this one can: the scheduler's CPU apart from the
driver's (it runs in a process of its own, :meth:`HostProcess.cpu_seconds`), many actors as
threads of a few worker processes, and workers on hosts that reach each other only through
shaped links (:mod:`daskrl.cluster.netns`). It is a ``distributed.SpecCluster`` whose
scheduler and workers are :class:`HostProcess` objects, Dask's public interface for a process
it manages; each runs ``python -m distributed.cli.dask_spec``, behind ``ip netns exec NAME``
when it has a namespace.

Examples
--------
>>> specs = [WorkerSpec("a0", nthreads=8, resources={"CPU": 8})]
>>> with host_cluster(specs) as cluster, Client(cluster) as client:  # doctest: +SKIP
...     client.wait_for_workers(1)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from distributed import SpecCluster
from distributed.deploy.spec import ProcessInterface

from daskrl.cluster.local import DEFAULT_TIMEOUT
from daskrl.cluster.upkeep import QUIET_UPKEEP

LAB_CONFIG: dict[str, Any] = {
    **QUIET_UPKEEP,
    "distributed.scheduler.no-workers-timeout": DEFAULT_TIMEOUT,
    "distributed.worker.daemon": False,
}
"""Dask settings every process of a host cluster starts with (as ``DASK_*`` variables): the
quiet upkeep (a worker with hundreds of threads would otherwise spend its core walking their
stacks for the statistical profiler), daskrl's no-workers timeout."""
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""BLAS and OpenMP threads per process: one, as a nanny sets them for its worker."""


def dask_env(config: Mapping[str, Any]) -> dict[str, str]:
    """Dask settings as the environment variables Dask reads them from at start.

    Examples
    --------
    >>> dask_env({"distributed.worker.profile.enabled": False})
    {'DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED': 'False'}
    """
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
            for key, value in config.items()}


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process of a :func:`host_cluster`."""

    name: str
    """Its Dask name (daskrl pins replicas to names)."""
    nthreads: int = 1
    """Threads, each running one task at a time (an actor's rollouts, say)."""
    resources: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1})
    """The resources it advertises."""
    netns: str | None = None
    """The network namespace it runs in (None: this process's)."""
    host: str = "127.0.0.1"
    """The address it listens on (its namespace's, when it has one)."""
    cpus: tuple[int, ...] | None = None
    """The CPUs it may run on (None: any): a host of its own, on one machine."""


class HostProcess(ProcessInterface):
    """A Dask scheduler or worker in a process of its own (``dask spec``), optionally in a
    network namespace; :attr:`pid` and :meth:`cpu_seconds` let a benchmark account for it.

    Parameters
    ----------
    scheduler : str or None
        The scheduler's address for a worker; None for the scheduler itself.
    cls : str
        ``distributed.Scheduler`` or ``distributed.Worker``.
    opts : dict
        The class's keyword arguments (``name``, ``nthreads``, ``resources``, ``host``...).
    netns : str, optional
        Run under ``ip netns exec netns``.
    env : dict, optional
        Environment variables added to this process's (see :data:`LAB_CONFIG`).
    cpus : sequence of int, optional
        Start it under ``taskset`` on these CPUs only, so that its threads, made later,
        inherit them (an affinity set on a running process binds its main thread only).
    """

    def __init__(self, scheduler: str | None = None, cls: str = "distributed.Worker",
                 netns: str | None = None, env: Mapping[str, str] | None = None,
                 cpus: Sequence[int] | None = None, **opts: Any) -> None:
        super().__init__()
        self.scheduler, self.cls, self.netns, self.opts = scheduler, cls, netns, opts
        self.cpus = tuple(cpus) if cpus is not None else None
        self.env = {**os.environ, **THREAD_ENV, **dask_env(LAB_CONFIG), **(env or {})}
        self.process: asyncio.subprocess.Process | None = None
        self.log = Path(tempfile.gettempdir()) / f"daskrl-host-{uuid.uuid4().hex[:8]}.log"

    @property
    def pid(self) -> int | None:
        """The process id (None before it starts)."""
        return self.process.pid if self.process is not None else None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the process has used so far."""
        if self.pid is None:
            return 0.0
        try:
            times = psutil.Process(self.pid).cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)

    async def start(self) -> None:
        """Start the process; a scheduler waits until it has written its address."""
        cmd = [sys.executable, "-m", "distributed.cli.dask_spec"]
        if self.scheduler is not None:
            cmd.append(self.scheduler)
        opts = dict(self.opts)
        file = None
        if self.scheduler is None:
            file = Path(tempfile.gettempdir()) / f"daskrl-scheduler-{uuid.uuid4().hex}.json"
            opts["scheduler_file"] = str(file)
        cmd += ["--spec", json.dumps({"cls": self.cls, "opts": opts})]
        if self.cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, self.cpus)), *cmd]
        if self.netns is not None:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with self.log.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *cmd, env=self.env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
        if file is not None:
            await self._read_address(file)
        await super().start()

    async def _read_address(self, file: Path, timeout: float = 60.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.returncode is None:
            try:
                self.address = json.loads(file.read_text())["address"]
                file.unlink()
                return
            except (OSError, ValueError, KeyError):
                await asyncio.sleep(0.05)
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the scheduler process did not start within {timeout:g}s: {tail}")

    async def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        await super().close()


def host_cluster(workers: Sequence[WorkerSpec], host: str = "127.0.0.1",
                 netns: str | None = None, env: Mapping[str, str] | None = None,
                 scheduler_cpus: Sequence[int] | None = None) -> SpecCluster:
    """A ``SpecCluster`` with the scheduler and each of ``workers`` in a process of its own.

    The scheduler listens on ``host`` (in namespace ``netns`` when given), runs on
    ``scheduler_cpus`` (default: any), serves no dashboard, and each worker runs as its
    :class:`WorkerSpec` says. ``env`` is added to every process's environment. Wait for the
    workers with ``Client.wait_for_workers``.
    """
    scheduler = {"cls": HostProcess,
                 "options": {"cls": "distributed.Scheduler", "netns": netns, "env": env,
                             "cpus": scheduler_cpus, "host": host, "port": 0,
                             "dashboard": False}}
    specs = {w.name: {"cls": HostProcess,
                      "options": {"cls": "distributed.Worker", "netns": w.netns, "env": env,
                                  "cpus": w.cpus,
                                  "name": w.name, "nthreads": w.nthreads,
                                  "resources": dict(w.resources), "host": w.host,
                                  "dashboard": False}}
             for w in workers}
    return SpecCluster(workers=specs, scheduler=scheduler, name="daskrl-hosts")


def cpu_seconds(cluster: SpecCluster) -> dict[str, float]:
    """CPU seconds used so far by the scheduler (``"scheduler"``) and each worker process.

    Examples
    --------
    >>> cpu_seconds(cluster)  # doctest: +SKIP
    {'scheduler': 1.2, 'a0': 3.4}
    """
    out = {"scheduler": cluster.scheduler.cpu_seconds()}
    out.update({str(name): w.cpu_seconds() for name, w in cluster.workers.items()})
    return out
