"""One test per private or undocumented Dask name that :mod:`daskrl.compat` relies on: each
fails when a Dask release drops or renames it, before the function using it misbehaves."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request

import pytest
from dask import annotate, delayed
from distributed import Client

from daskrl.cluster.local import local_cluster
from daskrl.compat import (
    HEARTBEAT_FAILED,
    HeartbeatAtClose,
    current_task_resources,
    graph_annotations,
)
from daskrl.core.worker_state import register

pytestmark = pytest.mark.timeout(120)


def test_graph_annotations_reads_highlevelgraph_layer_annotations() -> None:
    """``HighLevelGraph.layers`` and ``Layer.annotations``."""
    with annotate(resources={"GPU": 1}, workers=["w1"]):
        learner = delayed(abs, pure=False)(-1, dask_key_name="learner-0")
    rollout = delayed(abs, pure=False)(learner, dask_key_name="rollout-0")
    graph = rollout.__dask_graph__()
    assert all(hasattr(layer, "annotations") for layer in graph.layers.values())
    assert graph_annotations(rollout) == {
        "learner-0": {"resources": {"GPU": 1}, "workers": ["w1"]}}


def test_current_task_resources_reads_the_workers_task_state() -> None:
    """``Worker.state.tasks[key].resource_restrictions``."""
    with local_cluster([{"CPU": 1, "GPU": 2}], processes=False, dashboard_address=None
                       ) as cluster, Client(cluster) as client:
        granted = client.submit(current_task_resources, resources={"GPU": 1}, pure=False)
        plain = client.submit(current_task_resources, pure=False)
        assert granted.result() == {"GPU": 1.0}
        assert plain.result() == {}
    assert current_task_resources() == {}  # outside a worker


def test_dashboard_on_demand_attaches_to_the_schedulers_http_application() -> None:
    """``Scheduler.http_application`` (its ``applications`` and ``add_application``),
    ``Scheduler.http_server`` and ``distributed.dashboard.scheduler.connect``: Dask's routes
    are served at once, the Bokeh pages once one is asked for."""
    from distributed.dashboard.scheduler import connect  # noqa: F401 - the name relied on

    with local_cluster([{"CPU": 1}]) as cluster, Client(cluster) as client:
        scheduler = cluster.scheduler
        assert scheduler.http_server is not None
        apps = scheduler.http_application.applications
        link = client.dashboard_link
        assert link.startswith("http://127.0.0.1:") and link.endswith("/status")
        assert client.submit(sum, [1, 2]).result() == 3
        assert not any("bokeh" in str(type(app)).lower() for app in apps)  # not yet
        with urllib.request.urlopen(link.replace("/status", "/health"), timeout=30) as page:
            assert page.read() == b"ok"
        for path in ("/status", "/individual-task-stream", "/status"):
            with urllib.request.urlopen(link.replace("/status", path), timeout=60) as page:
                assert page.status == 200 and b"bokeh" in page.read().lower()
        assert len(apps) == 1 and "bokeh" in str(type(apps[0])).lower()


def test_scale_starts_workers_from_the_new_spec_and_names_them_by_the_hook() -> None:
    """``SpecCluster.new_spec`` and ``SpecCluster._new_worker_name``: ``scale`` (and Dask's
    ``Adaptive``) start workers like ``add_workers``'s, named ``w<i>`` with resources."""
    from daskrl.cluster.local import scale_like

    with local_cluster([{"CPU": 1}], processes=False, dashboard_address=None
                       ) as cluster, Client(cluster) as client:
        scale_like(cluster, {"CPU": 1})
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info()["workers"].values()
        assert sorted(w["name"] for w in workers) == ["w0", "w1"]
        assert all(w["resources"] == {"CPU": 1} for w in workers)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _heartbeat_errors(reply: object) -> tuple[int, int, int]:
    """Failed-heartbeat errors logged while the worker runs, and as it closes, and those
    the filter dropped, on a cluster whose scheduler answers heartbeats with ``reply`` (a
    coroutine function)."""
    log, kept = logging.getLogger("distributed.worker"), _Kept()
    dropped = sum(f.dropped for f in log.filters if isinstance(f, HeartbeatAtClose))
    log.addHandler(kept)
    try:
        with local_cluster([{"CPU": 1}], processes=False, dashboard_address=None
                           ) as cluster, Client(cluster) as client:
            register(client)  # its setup on the worker installs the filter
            client.submit(abs, 1, pure=False).result()
            handlers = cluster.scheduler.handlers
            handlers["heartbeat_worker"] = reply(handlers["heartbeat_worker"])
            time.sleep(1.5)  # heartbeats every 0.5 s: one waits for its reply
            running = sum(m.startswith(HEARTBEAT_FAILED) for m in kept.messages)
        closing = sum(m.startswith(HEARTBEAT_FAILED) for m in kept.messages) - running
    finally:
        log.removeHandler(kept)
    dropped = sum(f.dropped for f in log.filters if isinstance(f, HeartbeatAtClose)) - dropped
    return running, closing, dropped


def test_a_heartbeat_cut_by_its_workers_close_is_not_logged() -> None:
    """``Worker.heartbeat`` (the frame the record is logged from, its ``self.status``) and
    its error message: a heartbeat in flight as its worker closes fails, and is dropped."""
    def slow(answer):
        async def reply(*args, **kwargs):
            await asyncio.sleep(3)
            return answer(*args, **kwargs)
        return reply

    assert _heartbeat_errors(slow) == (0, 0, 1)  # the one in flight at close is dropped


def test_a_heartbeat_failing_while_the_worker_runs_is_still_logged() -> None:
    def broken(answer):
        async def reply(*args, **kwargs):
            raise OSError("scheduler unreachable")
        return reply

    running, _, _ = _heartbeat_errors(broken)
    assert running >= 1
