"""Worker-resident state (vector envs, policy copies, learners) that lives across iterations.

Objects are keyed by ``(run, role, replica)``, created lazily by a factory the first time a
task on a worker asks for them, and rebuilt from their seeds when a replica lands on a worker
that does not hold them (a fresh or replacement worker). They live on the
``distributed.Worker`` object, never in ``worker.data`` (which Dask spills and moves).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_LOCAL: dict[Hashable, Any] = {}  # used outside a Dask worker (synchronous scheduler)
_LOCK = threading.Lock()
_ATTR = "_daskrl_resident"


def _store(worker: Any = None) -> dict[Hashable, Any]:
    if worker is None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return _LOCAL
    store = getattr(worker, _ATTR, None)
    if store is None:
        store = {}
        setattr(worker, _ATTR, store)
    return store


def worker_name() -> str:
    """Name of the Dask worker running the caller, or ``"local"`` outside a worker.

    Examples
    --------
    >>> worker_name()
    'local'
    """
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return "local"


def resident(key: Hashable, build: Callable[[], T]) -> tuple[T, bool]:
    """Return the object stored under ``key`` on this worker, building it if absent.

    Returns
    -------
    obj, built : (object, bool)
        ``built`` is True when the object was created by this call.

    Examples
    --------
    >>> obj, built = resident(("run", "rollout", 0), lambda: [1, 2])
    >>> built, resident(("run", "rollout", 0), list)[1]
    (True, False)
    >>> drop_run("run")
    1
    """
    store = _store()
    with _LOCK:
        if key in store:
            return store[key], False
        obj = build()
        store[key] = obj
        return obj, True


def drop_key(key: Hashable) -> bool:
    """Forget (and close) the object under ``key`` on this worker; whether there was one.

    Examples
    --------
    >>> _ = resident(("run", "rollout", 1), list)
    >>> drop_key(("run", "rollout", 1)), drop_key(("run", "rollout", 1))
    (True, False)
    """
    store = _store()
    with _LOCK:
        obj = store.pop(key, None)
    if obj is not None:
        _close(obj)
    return obj is not None


def _close(obj: Any) -> None:
    closer = getattr(obj, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass


def drop_run(run: str, dask_worker: Any = None) -> int:
    """Forget every object of ``run`` on this worker; returns how many.

    Call it on every worker at the end of a run with ``client.run(drop_run, run)``, which
    passes the worker as ``dask_worker`` (``get_worker()`` works only inside tasks).
    """
    store = _store(dask_worker)
    with _LOCK:
        keys = [k for k in store if isinstance(k, tuple) and k and k[0] == run]
        for k in keys:
            _close(store.pop(k))
    return len(keys)
