"""``--max-restarts``: when the embedded cluster's scheduler goes away, the driver starts a new
cluster by itself and resumes from the last checkpoint; the restart is counted in
``summary.json``. Real processes: ``daskrl train`` with its embedded cluster."""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path

import pytest
from distributed import Client
from test_chaos import (
    ITERATIONS,
    PPO_SMALL,
    _check_metrics,
    _finished,
    _stop,
    _train,
    _wait_rows,
)

pytestmark = pytest.mark.chaos


def test_a_lost_scheduler_is_restarted_and_the_run_resumes(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "train.log"
    train = _train(tmp_path, "graphs/ppo.py", out, ["--workers", "2", "--max-restarts", "1",
                                                    "--checkpoint-every", "2", *PPO_SMALL])
    try:
        _wait_rows(train, out, log, 5)  # a checkpoint at 2 or 4
        address = re.search(r"scheduler: (tcp://\S+)", log.read_text()).group(1)
        with Client(address, timeout=30) as client:
            client.shutdown()  # the scheduler and its workers go away
        text = _finished(train, log, limit=240)
    finally:
        _stop([train])
    _check_metrics(out)  # every iteration once, in order, despite the redone ones
    assert "starting a new cluster and resuming from the last checkpoint (restart 1 of 1)" in (
        text), text[-3000:]
    assert len(re.findall(r"^scheduler: ", text, flags=re.M)) == 2, text[-3000:]
    (restart,) = json.loads((out / "summary.json").read_text())["restarts"]
    # the scheduler runs in the driver's process: its stop is seen at the next wait, not
    # after the client's reconnection attempts and a question's 30 s timeout
    assert re.fullmatch(r"the embedded Dask scheduler stopped \((closing|closed)\)",
                        restart["reason"]), restart
    # the last finished iteration is checkpointed on the way out of the lost cluster
    assert 2 <= restart["resumed_from_iteration"] < ITERATIONS
    assert restart["restart_s"] > 0
    # redone: the iterations recorded before the loss past the checkpoint resumed from,
    # their rows kept in the backup (none without a backup)
    backups = list(out.glob("metrics.csv.bak*"))
    if backups:
        (backup,) = backups
        with backup.open(newline="") as fh:
            recorded = max(int(float(r["iteration"])) for r in csv.DictReader(fh)
                           if r.get("iteration"))
        assert restart["iterations_redone"] == recorded - restart["resumed_from_iteration"] > 0
    else:
        assert restart["iterations_redone"] == 0


def test_max_restarts_is_refused_with_an_external_scheduler(tmp_path: Path) -> None:
    from daskrl.cli import main

    code = main(["train", "graphs/ppo.py", "--scheduler", "tcp://127.0.0.1:1", "--max-restarts",
                 "1", "--out", str(tmp_path / "run")])
    assert code == 2


def test_a_comm_closed_while_fetching_is_a_lost_scheduler_only_when_it_is_gone() -> None:
    # the scheduler can go away between the driver's wait and its fetch: the fetch then
    # fails with a closed comm, which must reach --max-restarts as a lost connection (it
    # ended the run with a traceback); while the scheduler answers, it is the task's error
    from distributed.comm.core import CommClosedError

    from daskrl.cluster.local import close_cluster, local_cluster
    from daskrl.runtime.dask_backend import DaskBackend

    class Closed:
        def result(self, timeout: float | None = None) -> None:
            raise CommClosedError("in <TCP (closed) ConnectionPool.gather>: Stream is closed")

    cluster = local_cluster([{"CPU": 1}], processes=False, dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    try:
        backend = DaskBackend(client)
        embedded = DaskBackend(client, scheduler=cluster.scheduler)  # as the CLI makes it
        for each in (backend, embedded):
            with pytest.raises(CommClosedError):
                each.fetch(Closed(), 1.0)
        cluster.sync(cluster.scheduler.close)
        with pytest.raises(ConnectionError, match="lost the connection to the Dask "
                                                  r"scheduler \(CommClosedError: .*--resume"):
            backend.fetch(Closed(), 1.0)
        # knowing the scheduler, the loss is named the same whichever call shows it
        for call in (lambda: embedded.fetch(Closed(), 1.0), embedded.identities):
            with pytest.raises(ConnectionError, match=r"^the embedded Dask scheduler stopped "
                                                      r"\(closed\): restart the run with"):
                call()
    finally:
        client.close(timeout=2)
        started = time.monotonic()
        close_cluster(cluster)
        # not a speed claim: the close must not wait out the 30 s connect timeout on a
        # scheduler that is gone (it did, before close_cluster)
        assert time.monotonic() - started < 20
