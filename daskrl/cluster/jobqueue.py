"""Batch-queue clusters: a CPU pool and a GPU pool of dask-jobqueue jobs under one scheduler.

dask-jobqueue keeps one job template per cluster object. :class:`PoolCluster` is a
``JobQueueCluster`` (itself a ``SpecCluster``) whose ``worker_spec`` holds two kinds of entry,
``cpu-<i>`` and ``gpu-<i>``, each a job class with its own options (cores, memory, queue,
``--gres=gpu:N`` / ``ngpus=N``, ``--resources CPU=..,GPU=..``). One scheduler, one dashboard,
stable worker names (``cpu-0``, ``gpu-0``; ``cpu-0-1`` with several processes per job), and
``close()`` cancels every job.

Settings live in :class:`~daskrl.cluster.jobqueue_spec.JobQueueSpec`
(:mod:`daskrl.cluster.jobqueue_spec`),
re-exported here with the functions that read them; waiting for the jobs' workers is in
:mod:`daskrl.cluster.jobqueue_wait` (:func:`wait_for_pools`, re-exported too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

from dask.utils import parse_bytes
from dask_jobqueue.core import JobQueueCluster
from dask_jobqueue.local import LocalJob
from dask_jobqueue.pbs import PBSJob, pbs_format_bytes_ceil
from dask_jobqueue.slurm import SLURMJob
from distributed import Client
from distributed.core import Status
from distributed.deploy.spec import ProcessInterface, SpecCluster

from daskrl.cluster.forkserver import WORKER_DASK_ENV, WORKER_MALLOC, WORKER_NUMERICS
from daskrl.cluster.jobqueue_spec import (
    KINDS,
    JobQueueSpec,
    add_jobqueue_flags,
    describe,
    load_spec,
    size_pools,
    spec_from_args,
)
from daskrl.cluster.jobqueue_wait import squeue, wait_for_pools
from daskrl.cluster.local import dask_settings, sync_workers
from daskrl.core.worker_state import register

__all__ = ["KINDS", "JobQueueSpec", "PoolCluster", "add_jobqueue_flags", "describe",
           "job_scripts", "load_spec", "make_jobqueue_cluster", "pool_job_options",
           "size_pools", "spec_from_args", "start_pools", "wait_for_pools"]


def _restore_ctrl_c() -> None:
    """Give Ctrl-C back its ``KeyboardInterrupt``.

    Importing dask-jobqueue 0.9.0 replaces the SIGINT handler with ``sys.exit()`` for the
    whole process (dask/dask-jobqueue#696, fixed after 0.9.0), which would skip the driver's
    checkpoint-on-Ctrl-C and exit with status 0.
    """
    handler = signal.getsignal(signal.SIGINT)
    if (getattr(handler, "__module__", None) == "dask_jobqueue.runner"
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGINT, signal.default_int_handler)


_restore_ctrl_c()

class _PoolJob:
    """Job statuses the cluster can rely on: ``failed`` if submitting fails, ``closed`` after."""

    async def start(self) -> None:
        try:
            await super().start()
        except BaseException:
            self.status = Status.failed
            raise

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await ProcessInterface.close(self)


class SlurmJob(_PoolJob, SLURMJob):
    """dask-jobqueue's ``SLURMJob`` (``sbatch``/``scancel``) as a pool member."""


class PbsJob(_PoolJob, PBSJob):
    """dask-jobqueue's ``PBSJob`` (``qsub``/``qdel``) as a pool member."""


class _BashJob(LocalJob):
    """A local ``bash`` process running the job script, through the job's public
    ``start``/``close`` (Dask's ``ProcessInterface``), not dask-jobqueue's submit hooks."""

    script_process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Run the job script in its own process group; its id is the job id."""
        log = Path(self.log_directory or os.devnull)
        if self.log_directory:
            log = log / f"{self.name}.log"
        with open(log, "ab") as out:
            self.script_process = await asyncio.create_subprocess_exec(
                "bash", "-c", self.job_script(), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.job_id = str(self.script_process.pid)
        await ProcessInterface.start(self)

    def ended(self) -> bool:
        """Whether the job script has exited."""
        return self.script_process is not None and self.script_process.returncode is not None

    async def close(self) -> None:
        """Stop the process group: SIGTERM, SIGKILL after 10 s, stragglers included."""
        if self.job_id:
            await _stop_group(int(self.job_id))
        if self.script_process is not None and self.script_process.returncode is None:
            await self.script_process.wait()  # reap bash


class ProcessJob(_PoolJob, _BashJob):
    """A "job" that is a local ``bash`` process running the job script (kind ``local``).

    Unlike dask-jobqueue's ``LocalJob`` it keeps the script's prologue, sends output to
    ``log_directory/<name>.log`` (never to an unread pipe) and stops the whole process group.
    """


async def _stop_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)  # the group outlives bash while its children run
        except ProcessLookupError:
            return
        for _ in range(100):
            await asyncio.sleep(0.1)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return


_JOB_CLASSES: dict[str, type] = {"local": ProcessJob, "slurm": SlurmJob, "pbs": PbsJob}


def _number(x: float) -> str:
    return f"{x:g}"


def pool_job_options(spec: JobQueueSpec, pool: str) -> dict[str, Any]:
    """Keyword arguments of the ``pool``'s job class (``SLURMJob``, ``PBSJob``, ...).

    Examples
    --------
    >>> opts = pool_job_options(JobQueueSpec(cores=2, gpus_per_job=1), "gpu")
    >>> opts["job_extra_directives"], opts["worker_extra_args"]
    (['--gres=gpu:1'], ['--resources', 'CPU=2,GPU=1'])
    """
    if pool not in spec.pools():
        raise ValueError(f"pool {pool!r} is not one of {spec.pools()}")
    gpu = pool == "gpu"
    cores = (spec.gpu_cores or spec.cores) if gpu else spec.cores
    memory = (spec.gpu_memory or spec.memory) if gpu else spec.memory
    processes = 1 if gpu else spec.processes
    resources = f"CPU={_number(cores / processes)}"
    extra = list(spec.job_extra)
    if gpu:
        resources += f",GPU={spec.gpus_per_job}"
        extra += spec.gpu_job_extra
    opts: dict[str, Any] = {
        "cores": cores, "memory": memory, "processes": processes,
        "walltime": spec.walltime, "queue": (spec.gpu_queue or spec.queue) if gpu else spec.queue,
        "job_name": f"{spec.name}-{pool}", "python": spec.python,
        "log_directory": spec.log_directory, "job_script_prologue": [
            *(f"export {k}={v}" for k, v in WORKER_MALLOC.items()),
            *(f"export {k}=${{{k}:-{v}}}" for k, v in {**WORKER_NUMERICS,
                                                       **WORKER_DASK_ENV}.items()),
            *spec.prologue],
        "worker_extra_args": ["--resources", resources], "job_extra_directives": extra,
    }
    if spec.kind == "slurm":
        opts["account"] = spec.account
        if gpu:
            opts["job_extra_directives"] = extra + [f"--gres=gpu:{spec.gpus_per_job}"]
    elif spec.kind == "pbs":
        opts["account"] = spec.account
        select = f"select=1:ncpus={cores}"
        if gpu:
            select += f":ngpus={spec.gpus_per_job}"
        opts["resource_spec"] = f"{select}:mem={pbs_format_bytes_ceil(parse_bytes(memory))}"
    return opts


def _scheduler_options(spec: JobQueueSpec) -> dict[str, Any]:
    opts: dict[str, Any] = {"dashboard_address": "127.0.0.1:0"}
    if spec.interface is None:
        opts["host"] = "127.0.0.1"
    return opts


class PoolCluster(JobQueueCluster):
    """One scheduler, two job templates: CPU jobs ``cpu-<i>`` and GPU jobs ``gpu-<i>``.

    Build it with :func:`make_jobqueue_cluster`; ``scale_pools(cpu=2, gpu=1)`` sets the job
    counts, ``job_ids()`` names the batch jobs, ``close()`` cancels them.
    """

    def __init__(self, spec: JobQueueSpec, **kwargs: Any) -> None:
        self.spec = spec
        job_cls = _JOB_CLASSES[spec.kind]
        super().__init__(job_cls=job_cls, n_workers=0, interface=spec.interface,
                         scheduler_options=_scheduler_options(spec),
                         **pool_job_options(spec, "cpu"), **kwargs)
        # the options JobQueueCluster gives its jobs (its public worker template)
        (template,) = self.new_worker_spec().values()
        shared = {k: v for k, v in template["options"].items()
                  if k in ("config_name", "interface", "protocol", "security")}
        self.pool_specs: dict[str, dict[str, Any]] = {}
        for pool in spec.pools():
            options = {**shared, **pool_job_options(spec, pool)}
            entry: dict[str, Any] = {"cls": job_cls, "options": options}
            if options["processes"] > 1:
                entry["group"] = [f"-{i}" for i in range(options["processes"])]
            self.pool_specs[pool] = entry

    def scale_pools(self, **jobs: int) -> None:
        """Set the number of jobs of each named pool, e.g. ``scale_pools(cpu=2, gpu=1)``.

        New jobs are named after the lowest free index; removed jobs are cancelled.
        """
        for pool, count in jobs.items():
            if pool not in self.pool_specs:
                raise ValueError(f"no {pool!r} pool: this cluster has {sorted(self.pool_specs)}")
            if self.status.name in ("closing", "closed"):
                count = 0
            wanted = {f"{pool}-{i}" for i in range(count)}
            for name in [n for n in self.worker_spec if _pool_of(n) == pool]:
                if name not in wanted:
                    del self.worker_spec[name]
            for name in sorted(wanted - set(self.worker_spec)):
                entry = self.pool_specs[pool]
                self.worker_spec[name] = {**entry, "options": dict(entry["options"])}
        sync_workers(self)

    def scale(self, n: int = 0, jobs: int = 0, memory: Any = None, cores: Any = None) -> Any:
        """Scale the CPU pool to ``jobs`` jobs (or ``n`` workers); ``scale(0)`` stops all pools."""
        if memory is not None or cores is not None:
            raise ValueError("scale by jobs per pool: use scale_pools(cpu=N, gpu=M)")
        if not n and not jobs:  # what close() calls
            self.worker_spec.clear()
            return SpecCluster.scale(self, 0)
        count = jobs or math.ceil(n / self.pool_specs["cpu"]["options"]["processes"])
        return self.scale_pools(cpu=count)

    def job_script(self, pool: str = "cpu") -> str:
        """The job script one ``pool`` job submits (with this scheduler's address)."""
        address = getattr(self.scheduler, "address", None) or "tcp://127.0.0.1:8786"
        entry = self.pool_specs[pool]
        return entry["cls"](address, name=f"{pool}-0", **entry["options"]).job_script()

    def job_ids(self) -> dict[str, str]:
        """Job name (``cpu-0``) -> batch job id, for jobs submitted and not cancelled."""
        return {name: str(job.job_id) for name, job in self.workers.items()
                if getattr(job, "job_id", None)}

    def ended_jobs(self, names: set[str]) -> list[str]:
        """Which of the named jobs have ended (Slurm and local jobs; [] for PBS)."""
        jobs = {n: self.workers[n] for n in sorted(names) if n in self.workers}
        if self.spec.kind == "local":
            return [n for n, job in jobs.items() if isinstance(job, _BashJob) and job.ended()]
        if self.spec.kind != "slurm":
            return []
        live = squeue("-o", "%i")
        if live is None:
            return []
        return [n for n, job in jobs.items() if str(job.job_id) not in live.split()]

    def expected_workers(self) -> set[str]:
        """The worker names the jobs in ``worker_spec`` will register."""
        return set(self.plan)


def _pool_of(name: Any) -> str:
    return str(name).rsplit("-", 1)[0]


def job_scripts(spec: JobQueueSpec, scheduler: str = "tcp://127.0.0.1:8786") -> dict[str, str]:
    """The job script of each pool, for inspection (``daskrl``'s own settings applied).

    Examples
    --------
    >>> scripts = job_scripts(JobQueueSpec(kind="slurm", queue="debug", gpus_per_job=1))
    >>> "#SBATCH --gres=gpu:1" in scripts["gpu"], "#SBATCH -p debug" in scripts["cpu"]
    (True, True)
    """
    cls = _JOB_CLASSES[spec.kind]
    return {pool: cls(scheduler, name=f"{pool}-0", config_name=cls.config_name,
                      **pool_job_options(spec, pool)).job_script()
            for pool in spec.pools()}


def make_jobqueue_cluster(spec: JobQueueSpec) -> PoolCluster:
    """Start the scheduler (127.0.0.1, dashboard on 127.0.0.1:0) and submit the pools' jobs.

    Job counts left at None become one CPU job and, with ``gpus_per_job``, one GPU job
    (:func:`size_pools` sizes them to a distribution first). Sets
    ``distributed.scheduler.no-workers-timeout`` to ``spec.no_workers_timeout``.

    Raises
    ------
    RuntimeError
        In one line, when the batch system refuses a job or its submit command is missing;
        jobs already submitted are cancelled first.

    Examples
    --------
    >>> cluster = make_jobqueue_cluster(JobQueueSpec(kind="slurm", cpu_jobs=2))  # doctest: +SKIP
    >>> cluster.job_ids()  # doctest: +SKIP
    {'cpu-0': '17', 'cpu-1': '18'}
    """
    with dask_settings(spec.no_workers_timeout):  # read by the scheduler as it is made
        cluster = PoolCluster(spec)
    try:
        counts = {"cpu": 1 if spec.cpu_jobs is None else spec.cpu_jobs}
        if spec.gpus_per_job:
            counts["gpu"] = 1 if spec.gpu_jobs is None else spec.gpu_jobs
        cluster.scale_pools(**counts)
    except BaseException as exc:
        cluster.close()
        submit = _JOB_CLASSES[spec.kind].submit_command
        if isinstance(exc, FileNotFoundError):
            raise RuntimeError(f"{exc.filename or submit}: not found - run on a {spec.kind} "
                               "login node, or use --cluster local") from None
        if isinstance(exc, RuntimeError) and "stderr:" in str(exc):
            why = str(exc).split("stderr:", 1)[1].strip().splitlines() or ["no message"]
            raise RuntimeError(f"{submit} refused a job: {why[0]}") from None
        raise
    return cluster


def start_pools(spec: JobQueueSpec, algo: Any = None, distribution: Any = None,
                log_directory: str | os.PathLike | None = None) -> tuple[PoolCluster, Client]:
    """Size the pools to ``distribution``, submit the jobs, wait for their workers.

    ``log_directory`` is used when the spec names none. On any failure the jobs are cancelled
    before the error propagates.

    Examples
    --------
    >>> cluster, client = start_pools(JobQueueSpec(kind="local"))  # doctest: +SKIP
    """
    if algo is not None and distribution is not None:
        spec = size_pools(spec, algo, distribution)
    if spec.log_directory is None and log_directory is not None:
        spec = dataclasses.replace(spec, log_directory=str(log_directory))
    cluster = make_jobqueue_cluster(spec)
    client = None
    try:
        client = Client(cluster)
        register(client)
        wait_for_pools(client, cluster)
    except BaseException:
        if client is not None:
            client.close()
        cluster.close()
        raise
    return cluster, client
