"""The process embedded-cluster workers are forked from, started before anything else.

``daskrl train`` on its embedded cluster calls :func:`worker_forkserver` first thing, before
it imports Dask (~0.4 s with ``distributed``), torch or the graph script: the server then
imports what workers need on the other core meanwhile. This module imports only the
standard library (``dask.config`` when :func:`worker_environ` is called).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WORKER_MALLOC: dict[str, int] = {
    "MALLOC_TRIM_THRESHOLD_": 128 * 2**20,
    "MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
}
"""glibc allocator settings for worker processes, set before they start.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so that freed memory goes
back to the OS quickly. An RL iteration allocates and frees the same arrays thousands of
times: with that setting every large array is a fresh ``mmap`` and the heap is trimmed
after each free, which made the PPO update 25% slower and a 1024-env ``single`` iteration
35% slower here. These values keep arrays up to 32 MiB on the heap and trim it only
past 128 MiB of free memory (as fast as glibc's defaults, measured in
``benchmarks/distributions.py``). Memory a worker frees is returned to the OS later.
"""

WORKER_DASK_ENV: dict[str, str] = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
"""Dask settings for the workers daskrl starts, as environment variables; one already set
in the environment daskrl runs in wins. Embedded workers get them through their nanny's
config (:func:`daskrl.cluster.configure_dask`), batch jobs as exports in the job script.

Dask's statistical profiler samples each worker's running task every 10 ms. In a tight RL
iteration it cost ~6% here (PPO on CartPole: 27.2 -> 25.5 ms per iteration, medians of
three runs), and ``daskrl profile`` and the task stream show where iteration time goes.
``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True`` brings the dashboard's Profile page back.
"""

WORKER_PRELOAD = ("distributed", "distributed.nanny", "distributed.worker", "torch",
                  "gymnasium", "daskrl.algos.actor_critic", "daskrl.distributions",
                  "daskrl.roles")
"""Modules the worker fork server imports once, before it forks any worker
(:mod:`daskrl.worker_preload`)."""


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """Import with the garbage collector paused, then freeze what was imported.

    Importing torch, Dask and gymnasium creates ~10^6 objects, almost none of them
    garbage, and the collector's passes over them took ~12% of the import time here
    (1.45 -> 1.25 s for the fork server's imports, medians of 6). Frozen objects
    (:func:`gc.freeze`) are left out of later passes and stay shared with forked workers
    instead of being copied when a pass touches them.

    Examples
    --------
    >>> with imports_without_gc():
    ...     import json
    >>> gc.isenabled()
    True
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


_ENVIRON_KEY = "distributed.nanny.pre-spawn-environ"


def worker_environ() -> dict[str, str]:
    """The environment Dask's nanny gives a worker process it starts, with
    :data:`WORKER_MALLOC` instead of its allocator setting (dask config, user files
    included; Dask's defaults read without importing ``distributed``).

    Examples
    --------
    >>> worker_environ()["MALLOC_TRIM_THRESHOLD_"] == str(WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"])
    True
    """
    import dask.config

    if dask.config.get(_ENVIRON_KEY, default=None) is None and "distributed" not in sys.modules:
        spec = importlib.util.find_spec("distributed")
        defaults = Path(spec.origin).with_name("distributed.yaml") if spec and spec.origin else None
        if defaults is not None and defaults.is_file():
            import yaml

            dask.config.update_defaults(yaml.safe_load(defaults.read_text()))
        else:  # an unusual layout: let distributed load its own defaults
            import distributed  # noqa: F401
    environ = {**dask.config.get(_ENVIRON_KEY, default={}), **WORKER_MALLOC}
    return {k: str(v) for k, v in environ.items() if v is not None}


def worker_forkserver() -> str | None:
    """Start the process that embedded-cluster workers are forked from; ``"forkserver"``,
    or ``None`` where the platform has no fork server.

    It starts at once and imports :data:`WORKER_PRELOAD` on its own core while this process
    goes on (:mod:`daskrl.worker_preload`), so a worker forked from it has torch and
    gymnasium imported already (a spawned worker imports them itself, ~1 s here). A forked
    worker keeps its server's environment, so the server gets the one Dask's nanny would
    give a worker: :data:`WORKER_MALLOC` and the hash seed when it starts (both are read
    at interpreter start), the rest of :func:`worker_environ` (one thread per BLAS/OpenMP
    pool) before its imports. Nothing here imports Dask, which would delay the server by
    ~0.1 s. It imports and starts no thread before it forks. Calling it again does nothing
    more.

    Examples
    --------
    >>> worker_forkserver()  # doctest: +SKIP
    'forkserver'
    """
    import multiprocessing
    import multiprocessing.forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    environ = {k: str(v) for k, v in WORKER_MALLOC.items()}
    environ["PYTHONHASHSEED"] = "6640"  # what the nanny sets for the workers it spawns
    multiprocessing.get_context("forkserver").set_forkserver_preload(["daskrl.worker_preload"])
    saved = dict(os.environ)
    try:
        os.environ.update(environ)
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return "forkserver"
