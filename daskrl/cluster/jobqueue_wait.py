"""Waiting for a batch cluster's jobs: until every worker has connected, with the queue's
view of the ones that have not (``squeue`` on Slurm) and a clear error when a job ends or the
wait runs out."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Sequence
from typing import Protocol

from dask.utils import parse_timedelta
from distributed import Client

from daskrl.cluster.jobqueue_spec import JobQueueSpec
from daskrl.core.scheduler_workers import scheduler_workers

logger = logging.getLogger("daskrl.cluster.jobqueue")


class Pools(Protocol):
    """What waiting needs of a batch cluster (:class:`daskrl.cluster.jobqueue.PoolCluster`)."""

    spec: JobQueueSpec

    def expected_workers(self) -> set[str]:
        """Names of the workers its jobs will start."""

    def ended_jobs(self, jobs: set[str]) -> list[str]:
        """Those of ``jobs`` (job names) whose process or batch job has ended."""

    def job_ids(self) -> dict[str, str]:
        """Job name -> the batch system's job id, for the jobs submitted so far."""


def wait_for_pools(client: Client, cluster: Pools, timeout: str | float | None = None
                   ) -> None:
    """Block until every job's worker has registered with the scheduler.

    Every 30 s of waiting it logs a warning naming the missing workers and their jobs' queue
    states (e.g. ``12 PENDING (Resources)``), so a job the queue cannot place yet is visible.

    Raises
    ------
    TimeoutError
        Naming the missing workers, their job ids and where their logs are.
    """
    limit = parse_timedelta(timeout if timeout is not None else cluster.spec.start_timeout)
    start = time.monotonic()
    wanted = cluster.expected_workers()
    logs = cluster.spec.log_directory or "the batch system's default output files"
    checked = told = start
    while True:
        try:
            info = scheduler_workers(client)
        except OSError:  # a slow answer: ask again, under this wait's own limit
            info = {}
        missing = wanted - {str(w["name"]) for w in info.values()}
        if not missing:
            return
        now = time.monotonic()
        if now - checked > 3:
            checked = now
            ended = cluster.ended_jobs({_job_of(n) for n in missing})
            if ended:
                raise RuntimeError(f"job(s) {', '.join(ended)} ended before their worker "
                                   f"connected: see their output in {logs}")
        ids = cluster.job_ids()
        jobs = sorted({ids.get(_job_of(n), "?") for n in missing})
        if now - told >= 30 and now - start <= limit:
            told = now
            logger.warning("waiting %.0fs of %gs for workers %s (jobs %s)", now - start, limit,
                           ", ".join(sorted(missing)), _queue_states(cluster.spec.kind, jobs))
        if now - start > limit:
            raise TimeoutError(
                f"workers {', '.join(sorted(missing))} did not connect within {limit:g}s "
                f"(jobs {_queue_states(cluster.spec.kind, jobs)}): see their output in {logs}, "
                "or raise start_timeout if the queue is busy")
        time.sleep(0.5)


def _job_of(worker: str) -> str:
    return "-".join(worker.split("-")[:2])


def squeue(*args: str) -> str | None:
    """``squeue -h ARGS`` output, or None when squeue cannot answer."""
    try:
        out = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _queue_states(kind: str, job_ids: Sequence[str]) -> str:
    """``"12 PENDING (Resources), 13 RUNNING"`` from ``squeue``; the bare ids elsewhere."""
    known = [j for j in job_ids if j.isdigit()]
    out = squeue("-j", ",".join(known), "-o", "%i %T (%r)") if kind == "slurm" and known \
        else None
    lines = [line.strip() for line in (out or "").splitlines() if line.strip()]
    return ", ".join(lines or job_ids)
