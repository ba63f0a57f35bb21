"""Dask's synchronous scheduler in the driver's process, as a
:class:`~daskrl.runtime.engine.Backend`: ``--scheduler sync``, where ``breakpoint()`` inside a
fragment works."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import dask
from dask.delayed import Delayed

from daskrl.core.fragment import Fragment
from daskrl.core.worker_state import mark_driver_process
from daskrl.runtime.engine import Activity, Handle
from daskrl.runtime.membership import Membership


class _Done:
    status = "finished"

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value

    def exception(self, timeout: float | None = None) -> None:
        """None: a local result is computed without error or not at all."""
        return None

    def cancel(self) -> None:
        return None

    def release(self) -> None:
        return None


class SyncBackend:
    """Dask's synchronous scheduler in this process: one worker called ``local``.

    Examples
    --------
    >>> from dask import delayed
    >>> SyncBackend().submit(delayed(sum)([1, 2])).result()
    3
    """

    name = "sync"

    def __init__(self) -> None:
        self.membership = Membership()  # one process: nobody joins or leaves
        mark_driver_process()  # tasks run in the caller's thread: its thread counts come back

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """One process that offers what the fragments ask for (GPUs only if torch sees one)."""
        from daskrl.cluster.local import _visible_gpus

        offered: dict[str, float] = {}
        for frag in fragments:
            res = frag.resources
            while res is not None:
                for key, value in res.to_dask().items():
                    offered[key] = max(offered.get(key, 0), value)
                res = res.fallback
        gpus = _visible_gpus()
        if gpus:
            offered["GPU"] = max(gpus, offered.get("GPU", 0))
        else:
            offered.pop("GPU", None)
        return {"local": offered}

    def scatter(self, value: Any, worker: str | None) -> Any:
        """The value itself."""
        return value

    def submit(self, graph: Delayed) -> Handle:
        """Compute now, in this thread."""
        with dask.config.set(scheduler="sync"):
            return _Done(graph.compute())

    def as_input(self, handle: Handle) -> Any:
        """The finished value."""
        return handle.result()

    def done(self, handle: Handle, timeout: float) -> bool:
        """Always finished: it ran at submission."""
        return True

    def fetch(self, handle: Handle, timeout: float) -> Any:
        """The finished value."""
        return handle.result(timeout)

    def identities(self) -> dict[str, str]:
        """This process."""
        return {"local": "local"}

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn`` here."""
        fn(*args)

    def memory_limits(self) -> dict[str, int | None]:
        """No limit: this process."""
        return {"local": None}

    def worker_processes(self) -> dict[str, str]:
        """One worker, this process."""
        return {"local": "local"}

    def worker_environ(self, names: tuple[str, ...]) -> dict[str, dict[str, str | None]]:
        """This process's values."""
        return {"local": {n: os.environ.get(n) for n in names}}

    def task_stream(self, since: int | None) -> tuple[int, list[dict[str, Any]]]:
        """No task stream: nothing is scheduled."""
        return 0, []

    watched = False  # every task runs in this thread: nothing could stop one

    def activity(self) -> Activity:
        """Nothing runs in the background."""
        return Activity()

    def call_stack(self, key: str, timeout: float) -> list[str] | None:
        """No task runs while the driver asks."""
        return None

    def restart_worker(self, name: str, timeout: float) -> str:
        """This process is the only worker: it is not restarted."""
        raise RuntimeError("the synchronous scheduler has no worker to restart")

    def publish(self, topic: str, msg: Any) -> None:
        """No scheduler, no dashboard: the message goes nowhere."""

    def check_annotations(self, graph: Delayed) -> None:
        """Nothing to check: no scheduler places tasks."""
