"""The only module that reads private or undocumented parts of Dask, one function each.

Everything else in daskrl uses Dask's public API. Each function here says which name it
relies on and why no public way exists; ``tests/test_compat.py`` has one test per name that
fails when a new Dask release drops or renames it (pyproject bounds Dask to the releases
tested). This module imports only the standard library at import time, so that importing it
costs nothing before Dask is loaded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Any


def graph_annotations(collection: Any) -> dict[Hashable, dict[str, Any]]:
    """Task key -> the annotations (``resources``, ``workers``, ``priority``, ...) that
    ``dask.annotate`` gave it, for a Dask collection such as a ``Delayed``.

    Uses ``HighLevelGraph.layers`` and ``Layer.annotations``. Dask has no public way to
    read a task's annotations back from a collection before it is submitted (they reach
    the scheduler with ``Client.compute``); daskrl draws them in its graph pictures and
    checks them against the scheduler's task restrictions. Keys of an unannotated layer
    are left out.

    Examples
    --------
    >>> from dask import annotate, delayed
    >>> with annotate(resources={"GPU": 1}):
    ...     d = delayed(abs, pure=False)(-1, dask_key_name="learner-0")
    >>> graph_annotations(d)
    {'learner-0': {'resources': {'GPU': 1}}}
    """
    graph = collection.__dask_graph__()
    out: dict[Hashable, dict[str, Any]] = {}
    for layer in graph.layers.values():
        notes = layer.annotations
        if notes:
            for key in layer:
                out[key] = dict(notes)
    return out


def current_task_resources() -> dict[str, float]:
    """The resources (e.g. ``{"GPU": 1}``) held by the Dask task running this code;
    ``{}`` outside a Dask worker.

    Uses ``Worker.state.tasks[key].resource_restrictions`` (the worker's state machine).
    ``get_worker().get_current_task()`` is public and names the task, but nothing public
    says what it was granted, and a fragment picks its device from its grant.

    Examples
    --------
    >>> current_task_resources()
    {}
    """
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return {}
    ts = worker.state.tasks.get(worker.get_current_task())
    restrictions = ts.resource_restrictions if ts is not None else None
    return {k: float(v) for k, v in (restrictions or {}).items()}


def serve_dashboard_on_demand(scheduler: Any) -> None:
    """Import and attach the Bokeh dashboard of ``scheduler`` (started with
    ``dashboard=False``) when its first page is requested, not at start.

    Uses ``Scheduler.http_application`` (its routing of sub-applications) and
    ``Scheduler.http_server``, and ``distributed.dashboard.scheduler.connect``, which
    the scheduler itself calls when started with ``dashboard=True``. Dask imports the
    dashboard (bokeh) while the scheduler starts, and offers no lazy
    dashboard. An embedded scheduler shares the driver's process, which during start-up
    imports torch and the graph on the way to the first iteration, so that import delays
    the first iteration (``benchmarks/startup.md``). The first request waits for the
    import, then is redirected to the same page, which Bokeh serves from then on; Dask's
    own routes (``/health``, ``/metrics``, the JSON API) are served from the start.
    """
    from tornado import web

    attached: list[asyncio.Future] = []

    async def attach() -> None:
        await scheduler.loop.run_in_executor(None, _import_board)
        from distributed.dashboard import scheduler as board

        scheduler.http_application.applications.remove(trigger)
        board.connect(scheduler.http_application, scheduler.http_server, scheduler, "/")

    class OnDemand(web.RequestHandler):
        async def get(self, *args: Any) -> None:
            if not attached:
                attached.append(asyncio.ensure_future(attach()))
            await attached[0]
            self.redirect(self.request.uri)

    trigger = web.Application([(r"/.*", OnDemand)])
    scheduler.http_application.add_application(trigger)


def _import_board() -> None:
    from distributed.dashboard import scheduler  # noqa: F401


def set_new_workers(cluster: Any, spec: dict[str, Any], name: Any) -> None:
    """Make ``cluster.scale`` (and :class:`distributed.deploy.Adaptive`, which calls it)
    start workers from ``spec`` (``{"cls": ..., "options": ...}``) named ``name(i)``.

    Relies on ``SpecCluster.new_spec``, the template ``scale`` copies for each new worker,
    and ``SpecCluster._new_worker_name``, the hook its docstring invites subclasses to
    override: ``LocalCluster`` takes neither resources nor names for the workers ``scale``
    adds, and has no public way to set them.
    """
    cluster.new_spec = spec
    cluster._new_worker_name = name


HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"
"""The start of the error ``Worker.heartbeat`` logs when its call to the scheduler fails."""


def quiet_heartbeat_at_close() -> None:
    """Keep a closing worker's failed heartbeat out of this process's log (once per
    process; a worker that is running or paused still logs it).

    A heartbeat still waiting for the scheduler's reply when its worker closes fails as
    ``Worker.close`` closes the worker's connections, and ``Worker.heartbeat`` logs that as
    an error with two tracebacks, at the end of a run that went well (more often on a
    loaded machine, where the reply is slow). The filter finds the worker by the
    ``heartbeat`` frame the record is logged from (``Worker.heartbeat``'s ``self``) and
    drops the record only while that worker's ``status`` is neither running nor paused
    (closing, closed, or retiring). Dask has no public way to cancel an in-flight heartbeat
    or to tell a closing worker's failure from a lost scheduler.
    """
    log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, HeartbeatAtClose) for f in log.filters):
        log.addFilter(HeartbeatAtClose())


class HeartbeatAtClose:
    """The filter :func:`quiet_heartbeat_at_close` installs; ``dropped`` counts the records
    it kept out."""

    def __init__(self) -> None:
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a failed heartbeat of a worker that is closing."""
        if not str(record.msg).startswith(HEARTBEAT_FAILED):
            return True
        try:
            closing = _heartbeat_worker_closing()
        except Exception:  # noqa: BLE001 - a filter that raises would lose the record
            return True
        self.dropped += closing
        return not closing


def _heartbeat_worker_closing() -> bool:
    """Whether the worker whose ``heartbeat`` frame is on this thread's stack is closing."""
    import sys

    from distributed import Status

    frame = sys._getframe(2)
    while frame is not None:
        worker = frame.f_locals.get("self")
        if frame.f_code.co_name == "heartbeat" and hasattr(worker, "status"):
            return worker.status not in (Status.running, Status.paused)
        frame = frame.f_back
    return False
