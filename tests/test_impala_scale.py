"""``impala`` at many actors: co-located actors fused into one rollout stream
(``group=K``), and a learner that takes every batch that has landed (``batch=auto``)."""

from __future__ import annotations

import csv
import dataclasses
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from daskrl.algos.vtrace import VTraceLearner
from daskrl.cluster.local import local_cluster
from daskrl.core.placement import Placement, plan_placement
from daskrl.core.resources import Resources
from daskrl.core.script import load_graph
from daskrl.core.worker_state import register
from daskrl.distributions import Unsupported, get_distribution
from daskrl.distributions.impala import streams
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

ROOT = Path(__file__).resolve().parents[1]
IMPALA = load_graph(str(ROOT / "graphs" / "impala.py"))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


class SlowLearner(VTraceLearner):
    """A V-trace learner whose every update also takes 0.3 s: far slower than the actors,
    so batches pile up while it updates."""

    def update(self, batches: Any, progress: float) -> dict[str, Any]:
        time.sleep(0.3)
        return super().update(batches, progress)


def _slow(make: Any, seed: int, device: str) -> SlowLearner:
    learner = make(seed, device)
    learner.__class__ = SlowLearner
    return learner


def test_streams_group_the_actors_of_a_worker_in_replica_order() -> None:
    place = Placement({"rollout": Resources(cpu=1)},
                      {"rollout": ("w0", "w1", "w0", "w1", "w0")})
    assert [s.replicas for s in streams(place, 5, group=2)] == [(0, 2), (4,), (1, 3)]
    assert [s.worker for s in streams(place, 5, group=2)] == ["w0", "w0", "w1"]
    assert [s.replicas for s in streams(place, 5, group=8)] == [(0, 2, 4), (1, 3)]
    assert [s.replicas for s in streams(place, 5)] == [(a,) for a in range(5)]


def test_a_group_holds_one_actors_resources_and_needs_a_resizable_actor() -> None:
    algo = IMPALA.build(IMPALA.Config(num_actors=8))
    workers = {"w0": {"CPU": 1}, "w1": {"CPU": 1}}
    plan = plan_placement(get_distribution("impala").fragments(algo), workers)
    with pytest.raises(ValueError, match="hold 2 at once"):  # an actor per CPU slot
        get_distribution("impala").check_capacity(plan, workers, algo)
    # fused, each worker's actors are one task, holding one CPU slot
    get_distribution("impala:group=4").check_capacity(plan, workers, algo)
    with pytest.raises(ValueError, match="hold 2 at once"):  # two groups of 2 per worker
        get_distribution("impala:group=2").check_capacity(plan, workers, algo)
    plain = dataclasses.replace(algo, capabilities=frozenset({"vtrace"}))
    with pytest.raises(Unsupported, match="'resizable-actor'.*drop group="):
        get_distribution("impala:group=2").check(plain)
    with pytest.raises(ValueError, match="option group='0' must be >= 1"):
        get_distribution("impala:group=0")


def test_fused_groups_run_one_stream_per_worker_and_cover_every_actor(tmp_path: Path
                                                                       ) -> None:
    algo = IMPALA.build(IMPALA.Config(num_actors=4, num_envs=2, num_steps=8))
    with local_cluster([{"CPU": 1}, {"CPU": 1}], processes=False, dashboard_address="127.0.0.1:0"
                       ) as cluster, Client(cluster) as client:
        register(client)
        summary = train(client, algo, get_distribution("impala:group=2"),
                        RunSettings(out=tmp_path, steps=4 * 4 * 16, eval=False,
                                    progress=False, tensorboard=False))
    rows = _rows(tmp_path / "metrics.csv")
    assert summary["iterations"] == 4
    placed = summary["placement"]["rollout"]
    expected = {f"{g[0]}..{g[-1]}" for g in ([a for a in range(4) if placed[a] == w]
                                              for w in set(placed))}
    for r in rows:
        # two streams of two fused actors; an iteration takes both (each covers two actors)
        labels = [x.split(":")[0] for x in r["policy_lags"].split()]
        assert len(labels) == 2 and set(labels) <= expected, (labels, expected)
        # every actor's envs (less the few auto-reset steps, which carry no transition)
        assert 3 * 2 * 8 < int(float(r["iteration_env_steps"])) <= 4 * 2 * 8


def test_sync_scheduler_runs_fused_groups_in_turn(tmp_path: Path) -> None:
    algo = IMPALA.build(IMPALA.Config(num_actors=4, num_envs=2, num_steps=8))
    dist = get_distribution("impala:group=4")
    train(SyncBackend(), algo, dist, RunSettings(out=tmp_path, steps=2 * 64, eval=False,
                                                 progress=False, tensorboard=False))
    rows = _rows(tmp_path / "metrics.csv")
    # one worker ("local") holds every actor: one stream of four, one update an iteration
    assert [r["policy_lags"] for r in rows] == ["0..3:0", "0..3:0"]
    assert [int(r["weights_version"]) for r in rows] == [1, 2]


@pytest.mark.parametrize("batch, per_iteration", [("1", 4), ("auto", 1)])
def test_auto_batch_takes_every_batch_that_landed(tmp_path: Path, batch: str,
                                                  per_iteration: int) -> None:
    # a learner far slower than its 4 actors: by the time an update ends, every actor has
    # landed a batch; batch=1 still makes one update per batch, auto one of all of them
    algo = IMPALA.build(IMPALA.Config(num_actors=4, num_envs=2, num_steps=8))
    algo = dataclasses.replace(algo, make_learner=partial(_slow, algo.make_learner))
    with local_cluster([{"CPU": 4}, {"CPU": 1}], processes=False, dashboard_address="127.0.0.1:0"
                       ) as cluster, Client(cluster) as client:
        register(client)
        train(client, algo, get_distribution(f"impala:batch={batch},iterations_per_task=1"),
              RunSettings(out=tmp_path, steps=5 * 4 * 16, eval=False, progress=False,
                          tensorboard=False))
    rows = _rows(tmp_path / "metrics.csv")
    versions = [int(r["weights_version"]) for r in rows]
    steps = [b - a for a, b in zip(versions, versions[1:], strict=False)]
    # past the first iteration (whose first update took what had landed by then)
    assert steps[1:] == [per_iteration] * (len(steps) - 1), versions
    assert all(len(r["policy_lags"].split()) == 4 for r in rows)  # every actor's batch used
