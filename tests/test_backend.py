"""Backends: the in-process synchronous one, and the annotation survival check."""

from __future__ import annotations

import os
import time

import pytest
from dask import annotate, delayed
from distributed import Client, Event, LocalCluster

from daskrl.core.fragment import Fragment
from daskrl.core.resources import Resources
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.membership import MEMBERSHIP_TOPIC
from daskrl.runtime.scheduler_calls import expected_restrictions
from daskrl.runtime.sync_backend import SyncBackend


def _wait_then(value: int, event_name: str) -> int:
    Event(event_name).wait(timeout=30)
    return value


def test_sync_backend_runs_in_this_process() -> None:
    pid = delayed(os.getpid, pure=True)()
    assert SyncBackend().submit(pid).result() == os.getpid()


def test_sync_backend_offers_what_fragments_ask_but_no_phantom_gpu() -> None:
    frags = [Fragment(abs, "learner", Resources(gpu=1, fallback=Resources(cpu=2))),
             Fragment(abs, "rollout", Resources(cpu=1, custom={"fast": 1}))]
    offered = SyncBackend().workers(frags)["local"]
    assert offered["CPU"] == 2 and offered["fast"] == 1
    import torch

    assert ("GPU" in offered) == torch.cuda.is_available()


def test_annotation_check_compares_with_the_scheduler() -> None:
    with LocalCluster(n_workers=1, processes=False, resources={"CPU": 1, "GPU": 1},
                      dashboard_address=None) as cluster, Client(cluster) as client:
        event = Event("release-ann-test", client=client)
        with annotate(resources={"GPU": 1}):
            blocked = delayed(_wait_then, pure=False)(1, "release-ann-test",
                                                      dask_key_name="learner-0-it0-t")
        with annotate(resources={"CPU": 1}):
            graph = delayed(abs, pure=False)(blocked, dask_key_name="rollout-0-it0-t")
        assert expected_restrictions(graph) == {"learner-0-it0-t": {"GPU": 1},
                                                "rollout-0-it0-t": {"CPU": 1}}
        future = client.compute(graph)
        backend = DaskBackend(client)
        backend.check_annotations(graph)  # matches: no error
        with annotate(resources={"GPU": 2}):  # same keys, different annotation
            other = delayed(abs, pure=False)(blocked, dask_key_name="rollout-0-it0-t")
        with pytest.raises(RuntimeError, match="rollout-0-it0-t"):
            backend.check_annotations(other)
        event.set()
        assert future.result() == 1


def test_the_scheduler_reports_workers_leaving_and_joining_without_being_asked() -> None:
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        backend = DaskBackend(client)
        assert "daskrl-membership" in client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.plugins))
        membership = backend.membership
        joined = membership.cursor()
        cluster.scale(2)
        assert membership.wait(joined, timeout=30)  # a new worker is reported
        assert membership.left_since(joined) == set()
        client.wait_for_workers(2, timeout=30)
        before = membership.cursor()
        gone = sorted(backend.identities().values())[0]
        client.retire_workers([gone])
        deadline = time.monotonic() + 10
        while gone not in membership.left_since(before):
            assert time.monotonic() < deadline, "no report of the retired worker"
            membership.wait(membership.cursor(), timeout=1)
        assert membership.left_since(joined) == {gone}
        assert membership.left_since(membership.cursor()) == set()
        events = [e for _, e in client.get_events(MEMBERSHIP_TOPIC)]
        assert events[-1] == {"action": "remove-worker", "worker": gone}


def _comm_closed_on(address: str, dask_worker=None) -> None:
    from distributed.comm.core import CommClosedError

    if dask_worker.address == address:
        raise CommClosedError("in <TCP (closed) Scheduler Broadcast>: Stream is closed")


def test_a_scatter_to_a_worker_that_died_is_a_lost_worker() -> None:
    """Dead but still listed (the comm to it closes), then removed (an unknown address):
    either way the driver gets ``WorkersLost``, which it recovers from, not Dask's error;
    ``run_everywhere`` skips the dead worker."""
    import contextlib

    from distributed.comm.core import CommClosedError

    from daskrl.cluster.local import local_cluster
    from daskrl.runtime.attempt import WorkersLost

    cluster = local_cluster([{"CPU": 1}, {"CPU": 1}], dashboard_address=None)
    try:
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            backend = DaskBackend(client)
            doomed, kept = sorted(backend.identities().items())
            assert backend.scatter(7, doomed[1]).result(timeout=30) == 7
            with contextlib.suppress(CommClosedError):  # it exits before it answers
                client.run(os._exit, 1, workers=[doomed[1]])
            # a dead worker still listed answers a broadcast with the CommClosedError of its
            # closed comm (seldom caught live: the scheduler drops it within milliseconds)
            backend.run_everywhere(_comm_closed_on, kept[1])  # skipped
            with pytest.raises(ZeroDivisionError):  # a live worker's own error is raised
                backend.run_everywhere(divmod, 1, 0)
            failures = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with pytest.raises(WorkersLost, match=doomed[1]) as lost:
                    backend.scatter(7, doomed[1])
                failures.append(type(lost.value.__cause__).__name__)
                if doomed[1] not in backend.identities().values():
                    break
            assert doomed[1] not in backend.identities().values()
            assert set(failures) <= {"CommClosedError", "KeyError"}, failures
            with pytest.raises(WorkersLost) as lost:  # an address the scheduler no longer has
                backend.scatter(7, doomed[1])
            assert isinstance(lost.value.__cause__, KeyError)
            with pytest.raises(WorkersLost) as lost:  # a name it does not have (placements
                backend.scatter(7, "w9")  # pin names)
            assert isinstance(lost.value.__cause__, ValueError)
            assert backend.scatter(8, kept[1]).result(timeout=30) == 8  # the others go on
    finally:
        cluster.close()


def test_scheduler_sync_trains_in_one_process(tmp_path) -> None:
    import json
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskrl.cli", "train", str(root / "graphs" / "ppo.py"),
         "--scheduler", "sync", "--steps", "2000", "--num-envs", "4", "--num-steps", "50",
         "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    while proc.poll() is None:
        try:
            children |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert children == set()  # no scheduler, nanny or worker process was started
    summary = json.loads((out / "summary.json").read_text())
    assert summary["placement"]["learner"] == ["local"] and summary["iterations"] == 10
