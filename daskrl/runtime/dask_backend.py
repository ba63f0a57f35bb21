"""A ``distributed.Client`` as the driver's :class:`~daskrl.runtime.engine.Backend`:
submitting graphs, waiting for them, and asking the scheduler (workers, identities, memory
limits, activity, restarts) with a lost connection turned into one line saying how to go on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dask.delayed import Delayed
from distributed import Client, Scheduler, Status, wait
from distributed.comm.core import CommClosedError

from daskrl.cluster.local import worker_id, worker_processes, worker_resources
from daskrl.cluster.upkeep import advise
from daskrl.core.fragment import Fragment
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.worker_state import mark_driver_process
from daskrl.core.worker_state import register as register_resident_state
from daskrl.observe.board_plugin import RunBoard
from daskrl.runtime.attempt import WorkersLost
from daskrl.runtime.engine import Activity, Handle
from daskrl.runtime.membership import MEMBERSHIP_TOPIC, Membership, MembershipPlugin
from daskrl.runtime.scheduler_calls import (
    TaskClock,
    expected_restrictions,
    scheduler_activity,
    scheduler_restart,
    scheduler_restrictions,
)


class DaskBackend:
    """A ``distributed.Client``: tasks run on the cluster's workers.

    Subscribes to the scheduler's membership reports (:class:`MembershipPlugin`) on
    creation and registers the dashboard page's plugin
    (:class:`~daskrl.observe.board_plugin.RunBoard`), so the scheduler must be able to
    import daskrl, as it already must to check annotations; prints
    :func:`~daskrl.cluster.upkeep.upkeep_advice`'s line when many workers share a process
    with Dask's per-worker upkeep on.

    ``scheduler``: the cluster's scheduler when it runs in this process (an embedded
    cluster). Once it has stopped, the connection counts as lost at the next wait, instead
    of after the client's reconnection attempts and the next question's timeout (30 s
    each), so ``--max-restarts`` starts the new cluster at once.
    """

    name = "distributed"

    def __init__(self, client: Client, scheduler: Scheduler | None = None) -> None:
        self.client = client
        self.scheduler = scheduler
        self.membership = Membership()
        mark_driver_process()  # thread workers of this process give its thread counts back
        client.subscribe_topic(MEMBERSHIP_TOPIC, self.membership.on_event)
        with self._asking_scheduler():
            client.register_plugin(MembershipPlugin())
            client.register_plugin(TaskClock())
            client.register_plugin(RunBoard())  # the dashboard's daskrl page
            self._await_subscription()
            register_resident_state(client)  # once per cluster: a no-op when it has it
            advise(client)  # many thread workers with Dask's upkeep on: say what slows them

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
        """Send ``value`` to ``worker`` (a future with no lineage behind it).

        A worker that dies under the scatter fails it in several ways, depending on when
        the scheduler learns of it: a closed comm (still listed), ``KeyError`` (an address
        it no longer has), ``ValueError`` (a name it no longer has), ``TimeoutError`` (no
        running worker within the client's connect timeout). Each is
        :class:`~daskrl.runtime.attempt.WorkersLost` while the scheduler answers, so the
        run places its fragments again; the message keeps Dask's error, and
        ``--max-recoveries`` bounds the retries if it is something else. The scatter is a
        ``ConnectionError`` when the scheduler does not answer.
        """
        try:
            return self.client.scatter(value, hash=False, workers=[worker] if worker else None)
        except (OSError, asyncio.TimeoutError, KeyError, ValueError) as exc:
            self._raise_if_scheduler_gone(exc)
            raise WorkersLost(f"worker {worker or '(any)'} did not take the input sent to it "
                              f"({type(exc).__name__}: {exc})") from exc

    def submit(self, graph: Delayed) -> Handle:
        """``client.compute`` without graph optimisation: low-level fusion would merge
        tasks and drop their resource annotations, whatever the user's Dask config says."""
        return self.client.compute(graph, optimize_graph=False)

    def as_input(self, handle: Handle) -> Any:
        """The future itself: the next graph waits on it inside the cluster."""
        return handle

    def identities(self) -> dict[str, str]:
        """Worker name -> address, as the scheduler sees them now."""
        with self._asking_scheduler():
            info = scheduler_workers(self.client)
        return {worker_id(w["name"], addr): addr for addr, w in info.items()}

    def done(self, handle: Handle, timeout: float) -> bool:
        """``distributed.wait`` with a timeout; with none (0), whether it is done now."""
        self._check_connected()
        if timeout <= 0:  # wait(timeout=0) times out even on a finished future
            return handle.status in ("finished", "error", "cancelled")
        try:
            wait(handle, timeout=timeout)
        except TimeoutError:
            return False
        return True

    def fetch(self, handle: Handle, timeout: float) -> Any:
        """``handle.result(timeout)``. A comm that closed while the result was fetched
        (the scheduler shut down between the wait and the fetch) is a ``ConnectionError``
        when the scheduler no longer answers; when it does, it was the task's own error."""
        try:
            return handle.result(timeout=timeout)
        except CommClosedError as exc:
            self._raise_if_scheduler_gone(exc)
            raise

    def _raise_if_scheduler_gone(self, exc: BaseException) -> None:
        """Raise a ``ConnectionError`` from ``exc`` when the scheduler does not answer."""
        if not self._embedded_running():
            raise self._lost(f"{type(exc).__name__}: {exc}") from exc
        try:
            self.client.sync(self.client.scheduler.identity, callback_timeout=5)
        except Exception:  # noqa: BLE001 - whatever the failure, it does not answer
            raise self._lost(f"{type(exc).__name__}: {exc}") from exc

    def _check_connected(self) -> None:
        # A client whose scheduler connection broke would otherwise wait forever.
        if not self._embedded_running() or self.client.status in ("closing", "closed",
                                                                     "failed"):
            raise self._lost(self.client.status)

    def _embedded_running(self) -> bool:
        """False once the embedded scheduler (when there is one) has stopped."""
        return self.scheduler is None or self.scheduler.status == Status.running

    def _lost(self, why: str) -> ConnectionError:
        """The error of a lost scheduler, which names an embedded one that stopped (however
        the loss showed: a closed comm, a timeout, the client's status)."""
        if not self._embedded_running():
            assert self.scheduler is not None
            why = f"the embedded Dask scheduler stopped ({self.scheduler.status.name})"
        else:
            why = f"lost the connection to the Dask scheduler ({why})"
        return ConnectionError(f"{why}: restart the run with --resume")

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
            raise self._lost(f"{type(exc).__name__}: {exc}") from exc

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """``client.run`` on every worker. A worker that died since the scheduler last
        listed it (its comm closed) is skipped: its process, and what ``fn`` would have
        done there, is gone; an error ``fn`` raises on a live worker is raised."""
        with self._asking_scheduler():
            results = self.client.run(fn, *args, on_error="return")
        for result in results.values():
            if isinstance(result, Exception) and not isinstance(result, OSError):
                raise result

    def memory_limits(self) -> dict[str, int | None]:
        """Each worker's ``memory_limit`` as the scheduler sees it (0 is no limit)."""
        with self._asking_scheduler():
            info = scheduler_workers(self.client)
        return {worker_id(w["name"], addr): int(w.get("memory_limit") or 0) or None
                for addr, w in info.items()}

    def worker_processes(self) -> dict[str, str]:
        """Each worker's ``host:pid`` (:func:`~daskrl.cluster.local.worker_processes`)."""
        with self._asking_scheduler():
            return worker_processes(self.client)

    def worker_environ(self, names: tuple[str, ...]) -> dict[str, dict[str, str | None]]:
        """``client.run`` on every worker: its process's values of ``names``."""
        with self._asking_scheduler():
            info = scheduler_workers(self.client)
            found = self.client.run(_environ_of, names, on_error="ignore")
        return {worker_id(w["name"], addr): found.get(addr, dict.fromkeys(names))
                for addr, w in info.items()}

    def task_stream(self, since: int | None) -> tuple[int, list[dict[str, Any]]]:
        """The scheduler's task-stream records (start/stop of each task's compute and
        transfers) from cursor ``since`` on; ``since=None`` starts recording and returns
        the current cursor with no records."""
        client = self.client
        with self._asking_scheduler():
            if since is None:
                return client.sync(client.scheduler.get_task_stream_index,
                                   callback_timeout=30), []
            records = client.sync(client.scheduler.get_task_stream, start_index=since,
                                  callback_timeout=30)
        return since + len(records), records

    watched = True

    def activity(self) -> Activity:
        """Running tasks and silent workers, from the scheduler (one question)."""
        with self._asking_scheduler():
            return self.client.run_on_scheduler(scheduler_activity)

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
            return self.client.run_on_scheduler(scheduler_restart, name=name, timeout=timeout)

    def publish(self, topic: str, msg: Any) -> None:
        """``Client.log_event``: the scheduler's plugins hear it (``log_event`` hook)."""
        self.client.log_event(topic, msg)

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
            with self._asking_scheduler():
                seen = self.client.run_on_scheduler(scheduler_restrictions,
                                                    keys=[*expected, final])
            if final not in seen:
                time.sleep(0.01)
        for key, want in expected.items():
            if key in seen and seen[key] != {k: float(v) for k, v in want.items()}:
                raise RuntimeError(
                    f"task {key!r} was annotated with resources {want} but the scheduler holds "
                    f"{seen[key]}; compute daskrl's graphs with optimize_graph=False (fusion "
                    "drops annotations)")


def _environ_of(names: tuple[str, ...]) -> dict[str, str | None]:
    """This process's values of the environment variables ``names`` (run on a worker)."""
    return {n: os.environ.get(n) for n in names}
