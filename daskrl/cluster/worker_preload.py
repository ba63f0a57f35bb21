"""What the worker fork server imports before it forks any worker.

:func:`daskrl.cluster.forkserver.worker_forkserver` names this module as the server's only preload.
It sets the environment of a worker process
(:func:`~daskrl.cluster.forkserver.worker_environ`, read when torch and numpy load their thread
pools, so before they are imported), then imports
:data:`~daskrl.cluster.forkserver.WORKER_PRELOAD` with the garbage collector paused
(:func:`~daskrl.cluster.forkserver.imports_without_gc`): every worker forked afterwards starts
with both.
"""

from __future__ import annotations

import importlib
import os

from daskrl.cluster.forkserver import WORKER_PRELOAD, imports_without_gc, worker_environ

os.environ.update(worker_environ())
with imports_without_gc():
    for _name in WORKER_PRELOAD:
        importlib.import_module(_name)
