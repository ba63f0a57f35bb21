"""Where iteration graphs run: a Dask cluster, or Dask's synchronous scheduler in-process.

The driver talks to a :class:`Backend` only, so ``--scheduler sync`` runs the very same
iteration graphs in the driver's process, where ``breakpoint()`` inside a fragment works.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import dask
from dask.delayed import Delayed
from distributed import Client, wait
from distributed.diagnostics.plugin import SchedulerPlugin

from daskrl.cluster.local import (
    scheduler_workers,
    worker_id,
    worker_processes,
    worker_resources,
)
from daskrl.compat import graph_annotations
from daskrl.core.fragment import Fragment
from daskrl.core.worker_state import register as register_resident_state


class Handle(Protocol):
    """A submitted computation: a ``distributed.Future`` or a finished local result."""

    status: str
    """``"pending"``, ``"finished"``, ``"error"``...: tells a task's own ``TimeoutError``
    from a fetch that timed out."""

    def result(self, timeout: float | None = None) -> Any:
        """Wait (up to ``timeout`` seconds, else raise ``TimeoutError``) and return the value."""

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
        """Place ``value`` (near ``worker``) as an input for later graphs."""

    def submit(self, graph: Delayed) -> Handle:
        """Start computing a delayed graph."""

    def as_input(self, handle: Handle) -> Any:
        """What a later graph takes in place of ``handle``'s value."""

    def done(self, handle: Handle, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether ``handle`` has finished (or failed)."""

    membership: Membership
    """Workers joining and leaving, as they are reported (no question asked per check)."""

    def identities(self) -> dict[str, str]:
        """Worker name -> address now (a restarted worker keeps its name, not its address)."""

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in every worker process."""

    def check_annotations(self, graph: Delayed) -> None:
        """Raise if the scheduler lost a task's resource annotation."""

    def memory_limits(self) -> dict[str, int | None]:
        """Worker name -> memory limit in bytes (None: no limit)."""

    def worker_processes(self) -> dict[str, str]:
        """Worker name -> the process it runs in (thread workers share one)."""

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


@dataclass(frozen=True)
class Activity:
    """What the scheduler knows of running tasks and live workers, at one moment.

    Durations come from the workers' heartbeats, so a task on a worker that stopped
    answering keeps growing: the time since its last heartbeat is added.
    """

    running: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Task key -> (worker name, seconds it has been executing)."""
    silent: dict[str, float] = field(default_factory=dict)
    """Worker name -> seconds since the scheduler last heard from it."""
    durations: dict[str, list[float]] = field(default_factory=dict)
    """Role (a key's first word) -> compute seconds of its recently finished tasks."""


MEMBERSHIP_TOPIC = "daskrl-membership"
"""The scheduler event topic on which :class:`MembershipPlugin` reports workers."""


class Membership:
    """Workers that joined and left, in the order they were reported.

    Each report advances a cursor; :meth:`left_since` answers from what was reported, so a
    driver checks its pinned workers as often as it likes without asking the scheduler.
    A worker restarted at its old address still counts as left after the cursor taken
    before its restart (its state went with it).

    Examples
    --------
    >>> m = Membership()
    >>> before = m.cursor()
    >>> m.on_event((0.0, {"action": "remove-worker", "worker": "tcp://a:1"}))
    >>> m.left_since(before), m.left_since(m.cursor())
    ({'tcp://a:1'}, set())
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._count = 0
        self._left: dict[str, int] = {}  # address -> the count at its last departure

    def cursor(self) -> int:
        """How many reports (joins, departures, subscriptions) came so far."""
        with self._changed:
            return self._count

    def left_since(self, cursor: int) -> set[str]:
        """Addresses of the workers that left after ``cursor``."""
        with self._changed:
            return {addr for addr, at in self._left.items() if at > cursor}

    def wait(self, cursor: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a report after ``cursor``; whether one came."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count > cursor, timeout=timeout)

    def on_event(self, event: tuple[float, Mapping[str, Any]]) -> None:
        """Take one ``(timestamp, message)`` event of :data:`MEMBERSHIP_TOPIC`."""
        _, msg = event
        with self._changed:
            self._count += 1
            if msg.get("action") == "remove-worker":
                self._left[str(msg["worker"])] = self._count
            self._changed.notify_all()


class MembershipPlugin(SchedulerPlugin):
    """Reports every worker that joins or leaves on :data:`MEMBERSHIP_TOPIC`.

    The scheduler calls these hooks as it adds and removes workers; clients that subscribe
    to the topic (``Client.subscribe_topic``) hear of a lost worker as soon as the
    scheduler does.
    """

    name = "daskrl-membership"
    idempotent = True  # one per scheduler, shared by every driver connected to it

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """Report a joining worker."""
        scheduler.log_event(MEMBERSHIP_TOPIC, {"action": "add-worker", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        """Report a leaving worker (closed, lost or retired)."""
        scheduler.log_event(MEMBERSHIP_TOPIC, {"action": "remove-worker", "worker": worker})


class TaskClock(SchedulerPlugin):
    """Keeps the compute time of the last tasks of each role, for the watchdog's bound.

    The scheduler calls :meth:`transition` for every task; a finished one carries its
    ``startstops`` (the same records as Dask's task stream).
    """

    name = "daskrl-task-clock"
    idempotent = True
    keep = 32

    def __init__(self) -> None:
        self.recent: dict[str, deque[float]] = {}

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Record a finished task's compute time under its role."""
        if start != "processing" or finish != "memory":
            return
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                role = str(key).split("-", 1)[0]
                self.recent.setdefault(role, deque(maxlen=self.keep)).append(
                    ss["stop"] - ss["start"])


def _scheduler_activity(dask_scheduler: Any) -> Activity:
    """:class:`Activity` as the scheduler sees it (runs on the scheduler)."""
    now = time.time()
    running: dict[str, tuple[str, float]] = {}
    silent: dict[str, float] = {}
    for addr, ws in dask_scheduler.workers.items():
        quiet = max(0.0, now - ws.last_seen)
        name = worker_id(ws.name, addr)
        silent[name] = quiet
        for ts, seconds in ws.executing.items():
            running[str(ts.key)] = (name, seconds + quiet)
    clock = dask_scheduler.plugins.get(TaskClock.name)
    durations = {role: list(d) for role, d in clock.recent.items()} if clock else {}
    return Activity(running, silent, durations)


async def _scheduler_restart(dask_scheduler: Any, name: str, timeout: float) -> str:
    """Restart (nanny) or remove (no nanny) worker ``name`` without waiting for it to
    answer: a worker that stopped answering cannot be retired gracefully."""
    addrs = [addr for addr, ws in dask_scheduler.workers.items()
             if worker_id(ws.name, addr) == name]
    if not addrs:
        return "gone"
    out = await dask_scheduler.restart_workers(
        addrs, timeout=timeout, wait_for_workers=False, on_error="return",
        stimulus_id=f"daskrl-watchdog-{time.time()}")
    return str(out.get(addrs[0], "restarted"))


class DaskBackend:
    """A ``distributed.Client``: tasks run on the cluster's workers.

    Subscribes to the scheduler's membership reports (:class:`MembershipPlugin`) on
    creation, so the scheduler must be able to import daskrl, as it already must to check
    annotations.
    """

    name = "distributed"

    def __init__(self, client: Client) -> None:
        self.client = client
        self.membership = Membership()
        client.subscribe_topic(MEMBERSHIP_TOPIC, self.membership.on_event)
        with self._asking_scheduler():
            client.register_plugin(MembershipPlugin())
            client.register_plugin(TaskClock())
            self._await_subscription()
            register_resident_state(client)  # once per cluster: a no-op when it has it

    def _await_subscription(self, timeout: float = 30.0) -> None:
        """Return once this client hears the topic, so no later departure can be missed.

        The subscription travels on the client's batched stream, which nothing else here
        waits for; an event published after it took effect comes back through it.
        """
        start = self.membership.cursor()
        deadline = time.monotonic() + timeout
        pause = 0.002  # the stream sends every few milliseconds: ask again soon, then less
        while True:
            self.client.log_event(MEMBERSHIP_TOPIC, {"action": "subscribed",
                                                     "client": self.client.id})
            if self.membership.wait(start, timeout=pause):
                return
            pause = min(2 * pause, 0.1)
            if time.monotonic() > deadline:
                raise ConnectionError(f"the Dask scheduler did not confirm the subscription to "
                                      f"{MEMBERSHIP_TOPIC!r} in {timeout:.0f} s")

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        """The workers the scheduler knows now."""
        with self._asking_scheduler():
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

    def identities(self) -> dict[str, str]:
        """Worker name -> address, as the scheduler sees them now."""
        with self._asking_scheduler():
            info = scheduler_workers(self.client)
        return {worker_id(w["name"], addr): addr for addr, w in info.items()}

    def done(self, handle: Handle, timeout: float) -> bool:
        """``distributed.wait`` with a timeout."""
        self._check_connected()
        try:
            wait(handle, timeout=timeout)
        except TimeoutError:
            return False
        return True

    def _check_connected(self) -> None:
        # A client whose scheduler connection broke would otherwise wait forever.
        if self.client.status in ("closing", "closed", "failed"):
            raise ConnectionError(f"lost the connection to the Dask scheduler "
                                  f"({self.client.status}): restart the run with --resume")

    @contextmanager
    def _asking_scheduler(self) -> Iterator[None]:
        """A scheduler that is gone or does not answer (comm closed, timeout) is a
        ``ConnectionError`` saying how to go on, not a traceback from deep in Dask."""
        self._check_connected()
        try:
            yield
        except ConnectionError:
            raise
        except OSError as exc:
            raise ConnectionError(f"lost the connection to the Dask scheduler "
                                  f"({type(exc).__name__}: {exc}): restart the run with "
                                  "--resume") from exc

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """``client.run`` on every worker."""
        self.client.run(fn, *args)

    def memory_limits(self) -> dict[str, int | None]:
        """Each worker's ``memory_limit`` as the scheduler sees it (0 is no limit)."""
        return {worker_id(w["name"], addr): int(w.get("memory_limit") or 0) or None
                for addr, w in scheduler_workers(self.client).items()}

    def worker_processes(self) -> dict[str, str]:
        """Each worker's ``host:pid`` (:func:`~daskrl.cluster.local.worker_processes`)."""
        with self._asking_scheduler():
            return worker_processes(self.client)

    def task_stream(self, since: int | None) -> tuple[int, list[dict[str, Any]]]:
        """The scheduler's task-stream records (start/stop of each task's compute and
        transfers) from cursor ``since`` on; ``since=None`` starts recording and returns
        the current cursor with no records."""
        client = self.client
        if since is None:
            return client.sync(client.scheduler.get_task_stream_index, callback_timeout=30), []
        records = client.sync(client.scheduler.get_task_stream, start_index=since,
                              callback_timeout=30)
        return since + len(records), records

    watched = True

    def activity(self) -> Activity:
        """Running tasks and silent workers, from the scheduler (one question)."""
        with self._asking_scheduler():
            return self.client.run_on_scheduler(_scheduler_activity)

    def call_stack(self, key: str, timeout: float) -> list[str] | None:
        """``Client.call_stack`` for one key, bounded: a frozen worker never answers."""
        try:
            with self._asking_scheduler():
                found = self.client.sync(self.client.scheduler.call_stack, keys=[key],
                                         callback_timeout=timeout)
        except (TimeoutError, ConnectionError):
            return None
        for stacks in (found or {}).values():
            if key in stacks:
                return [str(frame) for frame in stacks[key]]
        return None

    def restart_worker(self, name: str, timeout: float) -> str:
        """Restart ``name`` through its nanny, or remove it from the scheduler."""
        with self._asking_scheduler():
            return self.client.run_on_scheduler(_scheduler_restart, name=name, timeout=timeout)

    def check_annotations(self, graph: Delayed) -> None:
        """Compare the scheduler's resource restrictions with the graph's annotations.

        Raises ``RuntimeError`` naming the task when an annotation did not survive
        submission (which would silently place it on the wrong worker).
        """
        expected = expected_restrictions(graph)
        final = graph.key
        deadline = time.monotonic() + 10.0
        seen: dict[Any, dict[str, float]] = {}
        while final not in seen and time.monotonic() < deadline:  # the graph is still in transit
            seen = self.client.run_on_scheduler(_scheduler_restrictions,
                                                   keys=[*expected, final])
            if final not in seen:
                time.sleep(0.01)
        for key, want in expected.items():
            if key in seen and seen[key] != {k: float(v) for k, v in want.items()}:
                raise RuntimeError(
                    f"task {key!r} was annotated with resources {want} but the scheduler holds "
                    f"{seen[key]}; keep dask's 'optimization.fuse.delayed' off")


def expected_restrictions(graph: Delayed) -> dict[Any, dict[str, float]]:
    """Task key -> the resources its layer was annotated with.

    Examples
    --------
    >>> from dask import annotate, delayed
    >>> with annotate(resources={"GPU": 1}):
    ...     d = delayed(abs, pure=False)(-1, dask_key_name="learner-0")
    >>> expected_restrictions(d)
    {'learner-0': {'GPU': 1}}
    """
    return {key: dict(notes["resources"]) for key, notes in graph_annotations(graph).items()
            if notes.get("resources")}


def _scheduler_restrictions(dask_scheduler: Any, keys: list[Any]) -> dict[Any, dict[str, float]]:
    tasks = dask_scheduler.tasks
    return {k: {r: float(v) for r, v in (tasks[k].resource_restrictions or {}).items()}
            for k in keys if k in tasks}


class _Done:
    status = "finished"

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value

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

    def check_annotations(self, graph: Delayed) -> None:
        """Nothing to check: no scheduler places tasks."""
