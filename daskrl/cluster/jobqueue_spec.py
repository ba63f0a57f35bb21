"""Batch-job settings: :class:`JobQueueSpec`, read from YAML and ``daskrl train`` flags.

``examples/cluster.yaml`` documents every key; :mod:`daskrl.cluster.jobqueue` turns a
spec into pools of jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dask.utils import parse_bytes, parse_timedelta

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


JOB_FLAGS = ("queue", "walltime", "cores", "memory", "gpus_per_job", "cpu_jobs", "gpu_jobs",
             "job_extra")
"""The spec fields that are ``daskrl train`` flags too (``--gpus-per-job``, ...)."""


def add_jobqueue_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """``--cluster`` and the batch-job flags of ``daskrl train``; returns their actions.

    :func:`spec_from_args` reads them back.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> "--gpus-per-job" in [s for a in add_jobqueue_flags(parser) for s in a.option_strings]
    True
    """
    group = parser.add_argument_group("batch cluster (--cluster local|slurm|pbs)")
    return [
        group.add_argument("--cluster", choices=KINDS, default=None,
                           help="start workers as batch jobs: a CPU pool and, with "
                                "--gpus-per-job, a GPU pool (default: the embedded cluster)"),
        group.add_argument("--cluster-config", default=None, metavar="FILE.yaml",
                           help="job settings (see examples/cluster.yaml); flags override it"),
        group.add_argument("--queue", default=None, help="partition / queue of every job"),
        group.add_argument("--walltime", default=None, help="job time limit, HH:MM:SS"),
        group.add_argument("--cores", type=int, default=None, help="cores per job"),
        group.add_argument("--memory", default=None, help="memory per job, e.g. 4GB"),
        group.add_argument("--gpus-per-job", type=int, default=None,
                           help="GPUs per GPU job (0: no GPU pool)"),
        group.add_argument("--cpu-jobs", type=int, default=None,
                           help="CPU jobs (default: sized to the distribution)"),
        group.add_argument("--gpu-jobs", type=int, default=None,
                           help="GPU jobs (default: sized to the distribution)"),
        group.add_argument("--job-extra", action="append", default=None, metavar="DIRECTIVE",
                           help="extra job directive, e.g. --job-extra=--constraint=v100 "
                                "(repeatable)"),
    ]


def cluster_spec(kind: str | None, config: str | os.PathLike | None = None,
                 **flags: Any) -> JobQueueSpec | None:
    """The spec of ``--cluster KIND [--cluster-config FILE] [--queue Q ...]``; None without
    a kind.

    Parameters
    ----------
    kind
        ``local``, ``slurm`` or ``pbs``; None: no batch cluster.
    config
        A YAML file of spec fields (``examples/cluster.yaml``).
    **flags
        Fields of :data:`JOB_FLAGS` given on the command line; None values are ignored, so
        the file's (or the default) stands.

    Raises
    ------
    ValueError
        On a bad file or value, or a file without a kind, with one line naming it.

    Examples
    --------
    >>> cluster_spec("slurm", None, queue="debug", cores=None).queue
    'debug'
    >>> cluster_spec(None) is None
    True
    """
    unknown = sorted(set(flags) - set(JOB_FLAGS))
    if unknown:
        raise ValueError(f"unknown cluster flag(s) {', '.join(unknown)}; known: "
                         f"{', '.join(JOB_FLAGS)}")
    if kind is None:
        if config:
            raise ValueError("--cluster-config needs --cluster local|slurm|pbs")
        return None
    return load_spec(config, {**flags, "kind": kind})


def spec_from_args(args: argparse.Namespace) -> JobQueueSpec | None:
    """:func:`cluster_spec` of the flags :func:`add_jobqueue_flags` parsed into ``args``.

    Raises
    ------
    ValueError
        On a bad file or value, with one line naming it.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> _ = add_jobqueue_flags(parser)
    >>> spec_from_args(parser.parse_args(["--cluster", "pbs", "--cores", "2"])).cores
    2
    """
    values = vars(args)
    return cluster_spec(values["cluster"], values["cluster_config"],
                        **{key: values[key] for key in JOB_FLAGS})


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
