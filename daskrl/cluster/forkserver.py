"""The process embedded-cluster workers are forked from, started before anything else.

``daskrl train`` on its embedded cluster calls :func:`worker_forkserver` first thing, before
it imports Dask, torch or the graph script: the server then
imports what workers need on the other core meanwhile. This module imports only the
standard library (``dask.config`` when :func:`worker_environ` is called).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager

WORKER_MALLOC: dict[str, int] = {
    "MALLOC_TRIM_THRESHOLD_": 128 * 2**20,
    "MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
}
"""glibc allocator settings for worker processes, set before they start.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so that freed memory goes
back to the OS quickly. An RL iteration allocates and frees the same arrays thousands of
times: with that setting every large array is a fresh ``mmap`` and the heap is trimmed
after each free, which slows the update and env stepping noticeably
(``benchmarks/distributions.py`` compares them). These values keep arrays up to 32 MiB on
the heap and trim it only past 128 MiB of free memory. Memory a worker frees is returned
to the OS later.
"""

WORKER_DASK_ENV: dict[str, str] = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
"""Dask settings for the workers daskrl starts, as environment variables; one already set
in the environment daskrl runs in wins. Embedded workers get them through their nanny's
config (:func:`daskrl.cluster.local.dask_settings`), batch jobs as exports in the job script.

Dask's statistical profiler samples each worker's running task every 10 ms, which
costs a tight RL iteration a few percent, while ``daskrl profile`` and the task stream
already show where iteration time goes.
``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True`` brings the dashboard's Profile page back.
"""

WORKER_PRELOAD = ("distributed", "distributed.nanny", "distributed.worker", "torch",
                  "gymnasium", "daskrl.algos.actor_critic", "daskrl.distributions",
                  "daskrl.core.roles", "torch._dynamo")
"""Modules the worker fork server imports once, before it forks any worker
(:mod:`daskrl.cluster.worker_preload`). ``torch._dynamo`` is among them because building any
``torch.optim`` optimiser imports it (``add_param_group`` is wrapped to keep the compiler out):
imported here, with the collector paused and shared by every forked worker, it is not the
learner's first update's cost in each worker."""


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """Import with the garbage collector paused, then freeze what was imported.

    Importing torch, Dask and gymnasium creates ~10^6 objects, almost none of them
    garbage, and the collector's passes over them are a sizeable part of the import time.
    Frozen objects (:func:`gc.freeze`) are left out of later passes and stay shared with
    forked workers instead of being copied when a pass touches them.

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


WORKER_THREADS: dict[str, str] = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""One BLAS/OpenMP thread per worker process. A worker runs one task per thread it has,
and a task that wants more sets torch's threads from its CPU grant; pools sized to every
core in every worker would oversubscribe the machine. These are read when numpy and torch
load, so the fork server sets them before its imports."""

WORKER_NUMERICS: dict[str, str] = {"MKL_CBWR": "AUTO"}
"""MKL's conditional numerical reproducibility for every worker: one code path per CPU,
whatever the alignment of the data. Without it MKL's single-precision matrix product picks
its kernel by the operands' alignment, and the bits of its result change with it: a
``(n, 64) @ (64, 2)`` product (a 64-unit policy head) gives 4 different results over 16
alignments of the same input on this project's CI machine (``tests/test_determinism_stress.py``
checks it). Tensors that arrive in Dask's message frames, or live in numpy's heap, fall at
any alignment, so results would depend on what a process allocated before. MKL reads it on
its first call; it costs nothing measurable (a PPO update and rollout within 3 %). A value
already set in the environment wins."""

WORKER_HASH_SEED = "6640"
"""``PYTHONHASHSEED`` of every worker, so that all hash strings alike (Dask's nanny gives
the workers it spawns the same value; a forked worker keeps its server's, read when the
server's interpreter starts)."""

_ENVIRON_KEY = "distributed.nanny.pre-spawn-environ"


def worker_environ() -> dict[str, str]:
    """The environment of a worker process: :data:`WORKER_THREADS` and
    :data:`WORKER_NUMERICS`, then Dask's
    ``distributed.nanny.pre-spawn-environ`` (user settings win), then
    :data:`WORKER_MALLOC` and :data:`WORKER_HASH_SEED`.

    It needs only ``dask.config``: the fork server calls it before it imports
    ``distributed`` (whose defaults set the same thread counts).

    Examples
    --------
    >>> env = worker_environ()
    >>> env["MALLOC_TRIM_THRESHOLD_"] == str(WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"])
    True
    >>> env["OMP_NUM_THREADS"], env["PYTHONHASHSEED"], env["MKL_CBWR"]
    ('1', '6640', 'AUTO')
    """
    import dask.config

    numerics = {k: os.environ.get(k, v) for k, v in WORKER_NUMERICS.items()}
    environ = {**WORKER_THREADS, **numerics, **dask.config.get(_ENVIRON_KEY, default={}),
               **WORKER_MALLOC, "PYTHONHASHSEED": WORKER_HASH_SEED}
    return {k: str(v) for k, v in environ.items() if v is not None}


def worker_forkserver() -> str | None:
    """Start the process that embedded-cluster workers are forked from; ``"forkserver"``,
    or ``None`` where the platform has no fork server.

    It starts at once and imports :data:`WORKER_PRELOAD` on its own core while this process
    goes on (:mod:`daskrl.cluster.worker_preload`), so a worker forked from it has torch and
    gymnasium imported already (a spawned worker imports them itself). Dask's
    ``distributed.worker.multiprocessing-method: forkserver`` setting then makes its nanny
    start workers from this server. A forked worker keeps its server's environment, so the
    server gets :func:`worker_environ`: the allocator settings and the hash seed when it
    starts (both are read at interpreter start), the rest (one thread per BLAS/OpenMP pool)
    before its imports. Nothing here imports Dask, which would delay the server. It imports
    and starts no thread before it forks. Calling it again does nothing more.

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
    environ["PYTHONHASHSEED"] = WORKER_HASH_SEED
    multiprocessing.get_context("forkserver").set_forkserver_preload(["daskrl.cluster.worker_preload"])
    saved = dict(os.environ)
    try:
        os.environ.update(environ)
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return "forkserver"
