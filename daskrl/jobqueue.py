"""Batch-queue clusters: a CPU pool and a GPU pool of dask-jobqueue jobs under one scheduler.

dask-jobqueue keeps one job template per cluster object. :class:`PoolCluster` is a
``JobQueueCluster`` (itself a ``SpecCluster``) whose ``worker_spec`` holds two kinds of entry,
``cpu-<i>`` and ``gpu-<i>``, each a job class with its own options (cores, memory, queue,
``--gres=gpu:N`` / ``ngpus=N``, ``--resources CPU=..,GPU=..``). One scheduler, one dashboard,
stable worker names (``cpu-0``, ``gpu-0``; ``cpu-0-1`` with several processes per job), and
``close()`` cancels every job.

Settings live in :class:`JobQueueSpec`, read from a YAML file and command-line overrides by
:func:`load_spec`; ``examples/cluster.yaml`` documents every key.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dask.utils import parse_bytes, parse_timedelta
from dask_jobqueue.core import JobQueueCluster
from dask_jobqueue.local import LocalJob
from dask_jobqueue.pbs import PBSJob, pbs_format_bytes_ceil
from dask_jobqueue.slurm import SLURMJob
from distributed import Client
from distributed.core import Status
from distributed.deploy.spec import ProcessInterface

from .cluster import configure_dask

logger = logging.getLogger(__name__)


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

KINDS = ("local", "slurm", "pbs")
"""Batch systems: ``local`` runs the same job scripts as processes on this machine."""

POOLS = ("cpu", "gpu")
_WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


@dataclass
class JobQueueSpec:
    """How to ask a batch system for Dask workers: a CPU pool and, optionally, a GPU pool.

    Every field is a key of ``examples/cluster.yaml`` (which explains each one) and most are
    ``daskrl train`` flags. CPU workers advertise ``CPU=cores/processes``; GPU workers
    ``CPU=gpu_cores,GPU=gpus_per_job`` and ask for ``--gres=gpu:N`` (Slurm) or
    ``select=1:ncpus=C:ngpus=N`` (PBS).

    Examples
    --------
    >>> JobQueueSpec(kind="slurm", cores=4, memory="8GB", gpus_per_job=1).pools()
    ('cpu', 'gpu')
    """

    kind: str = "slurm"  # local | slurm | pbs (local: the job scripts run as local processes)
    queue: str | None = None  # partition / queue of every job
    account: str | None = None  # Slurm/PBS -A
    walltime: str = "01:00:00"  # HH:MM:SS per job
    cores: int = 1  # cores per CPU job
    memory: str = "2GB"  # memory per CPU job
    processes: int = 1  # worker processes per CPU job (GPU jobs run one)
    gpus_per_job: int = 0  # GPUs per GPU job; 0: no GPU pool
    gpu_queue: str | None = None  # GPU jobs' queue (default: queue)
    gpu_cores: int | None = None  # GPU jobs' cores (default: cores)
    gpu_memory: str | None = None  # GPU jobs' memory (default: memory)
    cpu_jobs: int | None = None  # None: sized to the distribution by size_pools
    gpu_jobs: int | None = None  # None: sized to the distribution by size_pools
    job_extra: list[str] = field(default_factory=list)  # extra directives, every job
    gpu_job_extra: list[str] = field(default_factory=list)  # extra directives, GPU jobs
    prologue: list[str] = field(default_factory=list)  # shell lines before the worker starts
    interface: str | None = None  # network interface across nodes (ib0); None: 127.0.0.1
    log_directory: str | None = None  # job output files
    python: str | None = None  # the workers' Python (default: this one)
    start_timeout: str = "10m"  # how long to wait for every job's worker
    no_workers_timeout: str = "15m"  # how long a task waits for a worker with its resources
    name: str = "daskrl"  # job names <name>-cpu, <name>-gpu

    def __post_init__(self) -> None:
        if isinstance(self.walltime, int) and not isinstance(self.walltime, bool):
            # YAML reads an unquoted 01:30:00 as 5400 (base 60): turn seconds back into HH:MM:SS
            m, sec = divmod(self.walltime, 60)
            self.walltime = f"{m // 60:02d}:{m % 60:02d}:{sec:02d}"
        if self.kind not in KINDS:
            raise ValueError(f"cluster kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for key in ("cores", "processes", "gpus_per_job", "gpu_cores", "cpu_jobs", "gpu_jobs"):
            value = getattr(self, key)
            low = 1 if key in ("cores", "processes", "gpu_cores") else 0
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < low):
                raise ValueError(f"{_flag(key)} must be a whole number >= {low}, got {value!r}")
        if self.cores % self.processes:
            raise ValueError(f"--cores {self.cores} must be a multiple of processes "
                             f"{self.processes} (each worker process gets cores/processes)")
        for key in ("memory", "gpu_memory"):
            value = getattr(self, key)
            if value is not None and not _is_size(value):
                raise ValueError(f"{_flag(key)} {value!r} is not a size: write e.g. 4GB or 500MB")
        if not _WALLTIME.match(str(self.walltime)):
            raise ValueError(f"--walltime {self.walltime!r}: write HH:MM:SS, e.g. 01:30:00")
        if self.gpu_jobs and not self.gpus_per_job:
            raise ValueError(f"--gpu-jobs {self.gpu_jobs} needs --gpus-per-job >= 1")
        for key in ("job_extra", "gpu_job_extra", "prologue"):
            value = getattr(self, key)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{key} must be a list of strings, got {value!r}")
            setattr(self, key, list(value))
        try:
            start, wait = (parse_timedelta(t) for t in (self.start_timeout,
                                                        self.no_workers_timeout))
        except (KeyError, ValueError, TypeError):
            raise ValueError(f"start_timeout {self.start_timeout!r} / no_workers_timeout "
                             f"{self.no_workers_timeout!r}: write e.g. 90s, 10m, 1h") from None
        if wait < start:
            raise ValueError(f"no_workers_timeout {self.no_workers_timeout} must be at least "
                             f"start_timeout {self.start_timeout}: tasks would fail while jobs "
                             "are still queued")

    def pools(self) -> tuple[str, ...]:
        """The pools this spec asks for: ``("cpu",)`` or ``("cpu", "gpu")``."""
        return POOLS if self.gpus_per_job else POOLS[:1]


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _is_size(value: Any) -> bool:
    try:
        return isinstance(value, str) and parse_bytes(value) > 0
    except (ValueError, TypeError):
        return False


def load_spec(path: str | os.PathLike | None = None,
              overrides: Mapping[str, Any] | None = None) -> JobQueueSpec:
    """A :class:`JobQueueSpec` from a YAML file, then ``overrides`` (None values ignored).

    Keys are the spec's fields, with ``-`` or ``_`` (``gpus-per-job: 1``).

    Raises
    ------
    ValueError
        Naming the file and the unknown key or bad value.

    Examples
    --------
    >>> load_spec(None, {"kind": "pbs", "queue": "workq", "cores": None}).queue
    'workq'
    """
    values: dict[str, Any] = {}
    where = "flags"
    if path is not None:
        import yaml

        where = f"config {path}"
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ValueError(f"cluster {where}: cannot read it ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"cluster {where}: not valid YAML ({exc})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"cluster {where}: expected a mapping of settings")
        values.update({str(k).replace("-", "_"): v for k, v in loaded.items()})
    values.update({k.replace("-", "_"): v for k, v in (overrides or {}).items() if v is not None})
    known = {f.name for f in dataclasses.fields(JobQueueSpec)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"cluster {where}: unknown key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(known))}")
    try:
        return JobQueueSpec(**values)
    except ValueError as exc:
        raise ValueError(f"cluster {where}: {exc}" if path else str(exc)) from None


def size_pools(spec: JobQueueSpec, algo: Any, distribution: Any) -> JobQueueSpec:
    """``spec`` with ``cpu_jobs``/``gpu_jobs`` left at None sized to ``distribution``'s replicas.

    GPU fragments go to the GPU pool (``ceil(sum of replicas x gpu / gpus_per_job)`` jobs);
    without a GPU pool they count with their CPU fallback. CPU jobs cover every CPU slot the
    other replicas ask for: ``ceil(slots / cores)``.

    Examples
    --------
    >>> from daskrl import Algorithm, Resources
    >>> from daskrl.distributions import get_distribution
    >>> algo = Algorithm("a", print, print, print, num_steps=8, num_envs=4, num_actors=3,
    ...                  resources={"learner": Resources(gpu=1, fallback=Resources(cpu=1))})
    >>> s = size_pools(JobQueueSpec(cores=2, gpus_per_job=1), algo,
    ...                get_distribution("actors-learner"))
    >>> s.cpu_jobs, s.gpu_jobs
    (2, 1)
    """
    cpu_slots = gpu_slots = 0.0
    for frag in distribution.fragments(algo):
        res = frag.resources
        if res.gpu and spec.gpus_per_job:
            gpu_slots += frag.replicas * res.gpu
            continue
        while res is not None and res.gpu:
            res = res.fallback
        if res is None:
            raise ValueError(f"fragment {frag.role!r} needs {frag.resources} and the cluster "
                             "has no GPU pool: set --gpus-per-job (gpus_per_job in the YAML)")
        cpu_slots += frag.replicas * max(res.cpu, 1)
    cpu = spec.cpu_jobs if spec.cpu_jobs is not None else max(1, math.ceil(cpu_slots / spec.cores))
    gpu = spec.gpu_jobs if spec.gpu_jobs is not None else (
        math.ceil(gpu_slots / spec.gpus_per_job) if spec.gpus_per_job else 0)
    return dataclasses.replace(spec, cpu_jobs=cpu, gpu_jobs=gpu)


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


class ProcessJob(_PoolJob, LocalJob):
    """A "job" that is a local ``bash`` process running the job script (kind ``local``).

    Unlike dask-jobqueue's ``LocalJob`` it keeps the script's prologue, sends output to
    ``log_directory/<name>.log`` (never to an unread pipe) and stops the whole process group.
    """

    async def _submit_job(self, script_filename: str) -> str:
        log = Path(self.log_directory or os.devnull)
        if self.log_directory:
            log = log / f"{self.name}.log"
        with open(log, "ab") as out:
            self._proc = await asyncio.create_subprocess_exec(
                "bash", "-c", self.job_script(), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        return str(self._proc.pid)

    @classmethod
    async def _close_job(cls, job_id: str, cancel_command: str | None) -> None:
        """Stop the process group: SIGTERM, SIGKILL after 10 s, stragglers included."""
        pgid = int(job_id)
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

    async def close(self) -> None:
        await super().close()
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.returncode is None:
            await proc.wait()  # reap bash


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
        "log_directory": spec.log_directory, "job_script_prologue": list(spec.prologue),
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
        shared = {k: v for k, v in self._job_kwargs.items()
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
        self.sync(self._correct_state)

    def scale(self, n: int = 0, jobs: int = 0, memory: Any = None, cores: Any = None) -> Any:
        """Scale the CPU pool to ``jobs`` jobs (or ``n`` workers); ``scale(0)`` stops all pools."""
        if memory is not None or cores is not None:
            raise ValueError("scale by jobs per pool: use scale_pools(cpu=N, gpu=M)")
        if not n and not jobs:  # what close() calls
            self.worker_spec.clear()
            self.loop.add_callback(self._correct_state)
            return None
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
            return [n for n, job in jobs.items()
                    if getattr(job, "_proc", None) is not None and job._proc.returncode is not None]
        if self.spec.kind != "slurm":
            return []
        live = _squeue("-o", "%i")
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
    configure_dask(spec.no_workers_timeout)
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


def wait_for_pools(client: Client, cluster: PoolCluster, timeout: str | float | None = None
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
        info = client.scheduler_info(n_workers=-1)["workers"]
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


def _squeue(*args: str) -> str | None:
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
    out = _squeue("-j", ",".join(known), "-o", "%i %T (%r)") if kind == "slurm" and known \
        else None
    lines = [line.strip() for line in (out or "").splitlines() if line.strip()]
    return ", ".join(lines or job_ids)


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
        wait_for_pools(client, cluster)
    except BaseException:
        if client is not None:
            client.close()
        cluster.close()
        raise
    return cluster, client


def add_jobqueue_flags(parser: argparse.ArgumentParser) -> None:
    """``--cluster`` and the batch-job flags of ``daskrl train`` (see :func:`spec_from_args`)."""
    group = parser.add_argument_group("batch cluster (--cluster local|slurm|pbs)")
    group.add_argument("--cluster", choices=KINDS, default=None,
                       help="start workers as batch jobs: a CPU pool and, with --gpus-per-job, "
                            "a GPU pool (default: the embedded cluster)")
    group.add_argument("--cluster-config", default=None, metavar="FILE.yaml",
                       help="job settings (see examples/cluster.yaml); flags override it")
    group.add_argument("--queue", default=None, help="partition / queue of every job")
    group.add_argument("--walltime", default=None, help="job time limit, HH:MM:SS")
    group.add_argument("--cores", type=int, default=None, help="cores per job")
    group.add_argument("--memory", default=None, help="memory per job, e.g. 4GB")
    group.add_argument("--gpus-per-job", type=int, default=None,
                       help="GPUs per GPU job (0: no GPU pool)")
    group.add_argument("--cpu-jobs", type=int, default=None,
                       help="CPU jobs (default: sized to the distribution)")
    group.add_argument("--gpu-jobs", type=int, default=None,
                       help="GPU jobs (default: sized to the distribution)")
    group.add_argument("--job-extra", action="append", default=None, metavar="DIRECTIVE",
                       help="extra job directive, e.g. --job-extra=--constraint=v100 (repeatable)")


def spec_from_args(args: argparse.Namespace) -> JobQueueSpec | None:
    """The spec the flags of :func:`add_jobqueue_flags` describe; None without ``--cluster``.

    Raises
    ------
    ValueError
        On a bad file or value, with one line naming it.
    """
    if getattr(args, "cluster", None) is None:
        if getattr(args, "cluster_config", None):
            raise ValueError("--cluster-config needs --cluster local|slurm|pbs")
        return None
    keys: Sequence[str] = ("queue", "walltime", "cores", "memory", "gpus_per_job", "cpu_jobs",
                           "gpu_jobs", "job_extra")
    overrides = {k: getattr(args, k, None) for k in keys}
    overrides["kind"] = args.cluster
    return load_spec(args.cluster_config, overrides)


def describe(spec: JobQueueSpec) -> str:
    """One line naming the pools, e.g. ``slurm: 2 x cpu (1 cores, 2GB), 1 x gpu (...)``."""
    parts = []
    for pool in spec.pools():
        gpu = pool == "gpu"
        count = spec.gpu_jobs if gpu else spec.cpu_jobs
        cores = (spec.gpu_cores or spec.cores) if gpu else spec.cores
        memory = (spec.gpu_memory or spec.memory) if gpu else spec.memory
        gpus = f", {spec.gpus_per_job} GPU" if gpu else ""
        parts.append(f"{count if count is not None else 1} x {pool} ({cores} cores, "
                     f"{memory}{gpus})")
    return f"{spec.kind}: " + ", ".join(parts)
