"""``daskrl.train`` from a plain Python session against a user's ``Client``: a run that
waits, a run in the background stopped with a checkpoint, and bad settings refused."""

from __future__ import annotations

import csv
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import daskrl

GRAPH = str(Path(__file__).resolve().parent.parent / "graphs" / "ppo.py")
TINY = {"num_actors": 2, "num_envs": 4, "num_steps": 32, "update_epochs": 2,
        "num_minibatches": 2, "eval_episodes": 2}

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def users_client() -> Iterator[Client]:
    """What a notebook user starts: two thread workers in this process, nothing declared."""
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        yield client


def test_train_waits_and_returns_a_run_with_summary_metrics_and_policy(users_client, tmp_path):
    pandas = pytest.importorskip("pandas")
    run = daskrl.train(GRAPH, client=users_client, steps=512, out=tmp_path / "run",
                       progress=False, **TINY)
    assert run.status == "finished" and run.progress == 1.0
    assert run.summary["iterations"] == 2 and run.summary["eval_return_mean"] > 0
    metrics = run.metrics
    assert isinstance(metrics, pandas.DataFrame) and len(metrics) == 2
    assert metrics["env_steps"].iloc[-1] == run.summary["env_steps"] >= 512
    assert run.dashboard_link == users_client.dashboard_link
    act = run.policy()
    assert np.asarray(act(np.zeros((3, 4), dtype=np.float32))).shape == (3,)
    assert users_client.status == "running"  # the user's client is left as it was


def test_a_run_in_the_background_stops_with_a_checkpoint(users_client, tmp_path):
    run = daskrl.train(GRAPH, client=users_client, steps=10**7, out=tmp_path / "run",
                       wait=False, progress=False, **TINY)
    assert run.status == "running"
    deadline = time.monotonic() + 120
    while run.progress == 0 and run.status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)  # the notebook goes on meanwhile
    assert 0 < run.progress < 1, run.error
    run.stop()
    assert run.status == "stopped" and run.result() is run
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt-*.pt"))
    with pytest.raises(RuntimeError, match="is stopped: it has no summary"):
        _ = run.summary


def test_bad_settings_are_refused_before_anything_trains(users_client, tmp_path):
    with pytest.raises(ValueError, match=r"ppo.py: no setting\(s\) \['num_env'\] in its Config"):
        daskrl.train(GRAPH, client=users_client, out=tmp_path / "a", num_env=4)
    with pytest.raises(ValueError, match="unknown distribution|distribution"):
        daskrl.train(GRAPH, client=users_client, out=tmp_path / "b", distribution="nope")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_without_a_client_it_trains_on_an_embedded_cluster_and_closes_it(tmp_path):
    run = daskrl.train(GRAPH, steps=256, out=tmp_path / "run", progress=False,
                       **{**TINY, "num_actors": 1})
    assert run.summary["iterations"] == 2 and run.status == "finished"
    assert run.client.status == "closed"  # its cluster went with the run


def test_a_stopped_run_resumes_from_python_with_the_run_s_keywords(users_client, tmp_path):
    out = tmp_path / "run"
    run = daskrl.train(GRAPH, client=users_client, steps=10**7, out=out, wait=False,
                       progress=False, checkpoint_every=1, **TINY)
    deadline = time.monotonic() + 120
    while run.progress == 0 and run.status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    run.stop(timeout=120)
    assert run.status == "stopped", run.error
    done = len((out / "metrics.csv").read_text().splitlines()) - 1
    assert done >= 1
    with pytest.raises(ValueError, match=r"pass resume=True to continue it, or choose another "
                                         r"out$"):
        daskrl.train(GRAPH, client=users_client, steps=512 * (done + 2), out=out,
                     progress=False, **TINY)
    resumed = daskrl.train(GRAPH, client=users_client, steps=256 * (done + 2), out=out,
                           resume=True, progress=False, eval_every=1, evaluate=False, **TINY)
    assert resumed.status == "finished"
    assert resumed.summary["iterations"] == done + 2
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    iterations = [int(r["iteration"]) for r in rows if r["iteration"]]
    assert iterations == list(range(1, done + 3))  # continued, nothing redone or lost
    evals = [r for r in rows if r.get("eval_return_mean")]  # eval_every=1: one per iteration
    assert len(evals) == 2 and "eval_return_mean" not in resumed.summary


def test_a_stop_before_the_first_iteration_ends_the_run_at_once(users_client, tmp_path):
    run = daskrl.train(GRAPH, client=users_client, steps=10**7, out=tmp_path / "run",
                       wait=False, progress=False, **TINY)
    run.stop(timeout=60)
    assert run.status == "stopped", run.error


def test_resources_replace_a_role_s_and_bad_ones_are_named(users_client, tmp_path):
    with pytest.raises(ValueError, match="resources 'learner=GPU'"):
        daskrl.train(GRAPH, client=users_client, out=tmp_path / "a",
                     resources={"learner": "GPU"}, **TINY)
    with pytest.raises(ValueError, match="no worker offers|offers"):
        daskrl.train(GRAPH, client=users_client, steps=256, out=tmp_path / "b",
                     progress=False, resources={"learner": "GPU:1"}, **TINY)
    run = daskrl.train(GRAPH, client=users_client, steps=256, out=tmp_path / "c",
                       progress=False, resources={"learner": daskrl.Resources(cpu=1)},
                       deterministic=True, **TINY)
    assert run.summary["determinism"]["threads_per_task"] == 1


def test_daskrl_s_dask_settings_stay_with_its_own_clusters(tmp_path):
    """A run on an embedded cluster leaves the session's Dask config as it found it: a
    cluster the user starts afterwards has Dask's defaults, not daskrl's timeouts and
    worker environment."""
    import dask

    keys = ("distributed.scheduler.no-workers-timeout", "distributed.nanny.pre-spawn-environ",
            "distributed.worker.profile.enabled", "optimization.fuse.delayed")
    before = {k: dask.config.get(k, None) for k in keys}
    run = daskrl.train(GRAPH, steps=256, out=tmp_path / "run", progress=False,
                       evaluate=False, **{**TINY, "num_actors": 1})
    assert run.status == "finished"
    assert {k: dask.config.get(k, None) for k in keys} == before
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as later:
        assert later.scheduler.no_workers_timeout is None  # Dask's default: wait
