"""What the driver needs from an execution engine: a :class:`Backend` and its :class:`Handle`s.

The driver talks to a :class:`Backend` only, so ``--scheduler sync``
(:class:`~daskrl.runtime.sync_backend.SyncBackend`) runs the very same iteration graphs in
the driver's process, where ``breakpoint()`` inside a fragment works, and a Dask cluster
(:class:`~daskrl.runtime.dask_backend.DaskBackend`) runs them on its workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dask.delayed import Delayed

from daskrl.core.fragment import Fragment
from daskrl.runtime.membership import Membership


class Handle(Protocol):
    """A submitted computation: a ``distributed.Future`` or a finished local result."""

    status: str
    """``"pending"``, ``"finished"``, ``"error"``...: tells a task's own ``TimeoutError``
    from a fetch that timed out."""

    def result(self, timeout: float | None = None) -> Any:
        """Wait (up to ``timeout`` seconds, else raise ``TimeoutError``) and return the value."""

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error the computation raised (None if it did not)."""

    def cancel(self) -> Any:
        """Give up on it."""

    def release(self) -> Any:
        """Let go of it: the cluster forgets what nothing else needs."""


class Backend(Protocol):
    """What the driver needs from an execution engine."""

    name: str

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """Worker name -> advertised resources."""

    def scatter(self, value: Any, worker: str | None) -> Any:
        """Place ``value`` (near ``worker``) as an input for later graphs.

        Raises :class:`~daskrl.runtime.attempt.WorkersLost` when ``worker`` is gone (the
        run places its fragments again), ``ConnectionError`` when the scheduler is.
        """

    def submit(self, graph: Delayed) -> Handle:
        """Start computing a delayed graph."""

    def as_input(self, handle: Handle) -> Any:
        """What a later graph takes in place of ``handle``'s value."""

    def done(self, handle: Handle, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether ``handle`` has finished (or failed)."""

    def fetch(self, handle: Handle, timeout: float) -> Any:
        """``handle``'s value (``TimeoutError`` after ``timeout`` seconds). The task's own
        error is raised as it is; losing the engine meanwhile is a ``ConnectionError``."""

    membership: Membership
    """Workers joining and leaving, as they are reported (no question asked per check)."""

    def identities(self) -> dict[str, str]:
        """Worker name -> address now (a restarted worker keeps its name, not its address)."""

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in every live worker process (one that died meanwhile is
        skipped)."""

    def check_annotations(self, graph: Delayed) -> None:
        """Raise if the scheduler lost a task's resource annotation."""

    def memory_limits(self) -> dict[str, int | None]:
        """Worker name -> memory limit in bytes (None: no limit)."""

    def worker_processes(self) -> dict[str, str]:
        """Worker name -> the process it runs in (thread workers share one)."""

    def worker_environ(self, names: tuple[str, ...]) -> dict[str, dict[str, str | None]]:
        """Worker name -> the values of the environment variables ``names`` in its process
        (None: not set)."""

    def task_stream(self, since: int | None) -> tuple[int, list[dict[str, Any]]]:
        """Dask's task-stream records after cursor ``since``, and the next cursor."""

    watched: bool
    """Whether tasks run where a watchdog can see and stop them (not in this process)."""

    def activity(self) -> Activity:
        """The tasks executing now, how long each worker has been silent, recent durations."""

    def call_stack(self, key: str, timeout: float) -> list[str] | None:
        """Where the running task ``key`` is, as its worker shows it: one text per frame,
        outermost first (None: no answer)."""

    def restart_worker(self, name: str, timeout: float) -> str:
        """Stop worker ``name`` (its nanny starts it again; without one it is removed)."""

    def publish(self, topic: str, msg: Any) -> None:
        """Send a small message to the scheduler's plugins (the run's page on the
        dashboard, :mod:`daskrl.observe.board`); nowhere when there is no scheduler."""


@dataclass(frozen=True)
class Activity:
    """What the scheduler knows of running tasks and live workers, at one moment.

    Durations come from the workers' heartbeats, so a task on a worker that stopped
    answering keeps growing: the time since its last heartbeat is added.
    """

    running: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Task key -> (worker name, seconds it has been executing, or since it last reported
    progress when it runs several iterations)."""
    silent: dict[str, float] = field(default_factory=dict)
    """Worker name -> seconds since the scheduler last heard from it."""
    durations: dict[str, list[float]] = field(default_factory=dict)
    """Role (a key's first word) -> compute seconds of its recently finished tasks."""
