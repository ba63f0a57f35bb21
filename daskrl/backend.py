"""Where iteration graphs run: a Dask cluster, or Dask's synchronous scheduler in-process.

The driver talks to a :class:`Backend` only, so ``--scheduler sync`` runs the very same
iteration graphs in the driver's process, where ``breakpoint()`` inside a fragment works.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import dask
from dask.delayed import Delayed
from distributed import Client

from .cluster import worker_resources
from .fragment import Fragment


class Handle(Protocol):
    """A submitted computation: a ``distributed.Future`` or a finished local result."""

    def result(self) -> Any:
        """Wait for and return the value."""

    def cancel(self) -> Any:
        """Give up on it."""


class Backend(Protocol):
    """What the driver needs from an execution engine."""

    name: str

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """Worker name -> advertised resources."""

    def scatter(self, value: Any, worker: str | None) -> Any:
        """Place ``value`` (near ``worker``) as an input for later graphs."""

    def submit(self, graph: Delayed) -> Handle:
        """Start computing a delayed graph."""

    def as_input(self, handle: Handle) -> Any:
        """What a later graph takes in place of ``handle``'s value."""

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in every worker process."""


class DaskBackend:
    """A ``distributed.Client``: tasks run on the cluster's workers."""

    name = "distributed"

    def __init__(self, client: Client) -> None:
        self.client = client

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """The workers the scheduler knows now."""
        return worker_resources(self.client)

    def scatter(self, value: Any, worker: str | None) -> Any:
        """Send ``value`` to ``worker`` (a future with no lineage behind it)."""
        return self.client.scatter(value, hash=False, workers=[worker] if worker else None)

    def submit(self, graph: Delayed) -> Handle:
        """``client.compute``: annotations reach the scheduler."""
        return self.client.compute(graph)

    def as_input(self, handle: Handle) -> Any:
        """The future itself: the next graph waits on it inside the cluster."""
        return handle

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """``client.run`` on every worker."""
        self.client.run(fn, *args)


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value

    def cancel(self) -> None:
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

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """One process that offers what the fragments ask for (GPUs only if torch sees one)."""
        from .cluster import _visible_gpus

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

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn`` here."""
        fn(*args)
