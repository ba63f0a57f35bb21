"""The ``apex`` distribution: replay shards run on the replay role's worker, actors explore on
the epsilon ladder and refresh weights every K iterations (policy lag reported), the learner
trains on the shards' samples and sends priorities back; a killed replay worker is rebuilt
and the run goes on; deterministic mode and oversized replays are refused in one line."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client

from daskrl.cluster.local import local_cluster
from daskrl.core.placement import plan_placement
from daskrl.core.resources import Resources
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.distributions.apex import epsilon_ladder
from daskrl.runtime.driver import RunSettings, check_distribution, train
from daskrl.runtime.memory import MemoryBudgetError

REPO = Path(__file__).resolve().parent.parent
GRAPH = load_graph(str(REPO / "graphs" / "dqn.py"))

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """Workers w0, w1 (CPU) and w2, the only one offering REPLAY."""
    cluster = local_cluster([{"CPU": 1}, {"CPU": 1}, {"CPU": 1, "REPLAY": 1}])
    c = Client(cluster)
    try:
        c.wait_for_workers(3, timeout=60)
        yield c
    finally:
        c.close()
        cluster.close()


def _algo(**kw):
    config = GRAPH.Config(**{**dict(num_actors=2, replay_shards=2, num_envs=2, num_steps=32,
                                    learning_starts=200, train_frequency=4, batch_size=32,
                                    hidden=32, eval_episodes=2), **kw})
    return GRAPH.build(config).with_resources(
        {"replay": Resources(cpu=1, custom={"REPLAY": 1})})


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_epsilon_ladder_follows_apex():
    n = 8
    eps = [epsilon_ladder(i, n) for i in range(n)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert eps == sorted(eps, reverse=True)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))


def test_replay_shards_run_on_the_replay_worker(client, tmp_path):
    algo = _algo()
    summary = train(client, algo, get_distribution("apex:refresh_every=2,stale=1"),
                    RunSettings(out=tmp_path, steps=6 * algo.steps_per_iteration, seed=2,
                                progress=False, tensorboard=False, eval=False))
    rows = _rows(tmp_path)
    for r in rows:  # every shard task ran on w2, the replay worker; actors and learner did not
        assert {w.split("@")[1] for w in r["replay_workers"].split(";")} == {"w2"}
        assert "w2" not in {w.split("@")[1] for w in r["rollout_workers"].split(";")}
        assert r["learner_worker"] != "w2"
    # refreshed every 2 iterations from the output one update before the newest (stale=1)
    assert [int(r["policy_lag"]) for r in rows] == [0, 1, 1, 2, 1, 2]
    sizes = [int(r["replay_size"]) for r in rows]
    assert sizes == sorted(sizes) and int(rows[-1]["replay_size/0"]) > 0
    assert int(rows[-1]["replay_size/1"]) > 0
    assert float(rows[0]["gradient_steps"]) == 0  # waits for --learning-starts
    assert float(rows[-1]["gradient_steps"]) > 0
    assert int(rows[-1]["replay_lost"]) == 0
    # summary.json's headline figures: the steady iterations' (all but the first) means
    assert summary["policy_lag_mean"] == pytest.approx((1 + 1 + 2 + 1 + 2) / 5)
    assert summary["replay_size"] == sizes[-1]
    drawn = sum(float(r["replay_samples"]) for r in rows[1:])
    took = sum(float(r["iteration_s"]) for r in rows[1:])
    assert drawn > 0 and summary["replay_samples_per_s"] == pytest.approx(drawn / took)
    assert json.loads((tmp_path / "summary.json").read_text())["replay_size"] == sizes[-1]


def test_a_killed_replay_worker_is_rebuilt_and_the_run_goes_on(client, tmp_path):
    algo = _algo()
    steps = 14 * algo.steps_per_iteration
    settings = RunSettings(out=tmp_path, steps=steps, seed=3, progress=False,
                           tensorboard=False, eval=False, lookahead=1)
    import contextlib
    import threading
    import time

    from distributed.comm.core import CommClosedError

    def kill_when_started() -> None:
        while not (tmp_path / "metrics.csv").exists() or len(_rows(tmp_path)) < 4:
            time.sleep(0.2)
        with contextlib.suppress(CommClosedError):  # it exits before it answers
            client.run(lambda: __import__("os")._exit(1), workers=[_address(client, "w2")])

    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    summary = train(client, algo, get_distribution("apex"), settings)
    killer.join(timeout=1)
    rows = _rows(tmp_path)
    assert summary["iterations"] == 14 and len(rows) >= 14
    assert sum(int(r["replay_lost"]) for r in rows if r.get("replay_lost")) > 0
    client.wait_for_workers(3, timeout=60)  # the nanny restarts it for the next test


def _address(client: Client, name: str) -> str:
    return next(a for a, w in scheduler_workers(client).items()
                if w["name"] == name)


def test_deterministic_mode_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^--deterministic: the 'apex' distribution"):
        check_distribution(get_distribution("apex"), _algo(), deterministic=True)


def test_dqn_runs_under_single_actors_learner_and_apex_only():
    from daskrl.distributions import NAMES, Unsupported

    algo = GRAPH.build(GRAPH.Config(num_actors=2))
    served = set()
    for name in NAMES:
        try:
            get_distribution(name).check(algo)
            served.add(name)
        except Unsupported:
            pass
    assert served == {"single", "actors-learner", "apex"}


def test_fewer_actors_than_shards_is_refused():
    algo = GRAPH.build(GRAPH.Config(num_actors=1, replay_shards=2))
    with pytest.raises(ValueError, match="--replay-shards"):
        check_distribution(get_distribution("apex"), algo)


def test_a_replay_larger_than_worker_memory_is_refused_naming_the_flag(client, tmp_path):
    algo = GRAPH.build(GRAPH.Config(buffer_size=1_000_000_000))  # about 60 GiB of transitions
    with pytest.raises(MemoryBudgetError, match=r"replay .*lower --buffer-size") as info:
        train(client, algo, get_distribution("single"),
              RunSettings(out=tmp_path, steps=256, progress=False, tensorboard=False))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "metrics.csv").exists()  # refused before any task ran


def test_actors_share_the_shards_workers_before_the_learners():
    """On fewer workers than roles, one actor steps beside the shard (whose tasks take
    milliseconds), not beside the learner; four actors on two workers go two and two."""
    workers = {"w0": {"CPU": 1}, "w1": {"CPU": 1}}
    for actors, expected in ((1, ("w0",)), (2, ("w0", "w1")), (4, ("w0", "w1") * 2)):
        algo = GRAPH.build(GRAPH.Config(num_actors=actors))
        place = plan_placement(get_distribution("apex").fragments(algo), workers)
        assert place.workers["replay"] == ("w0",) and place.workers["learner"] == ("w1",)
        assert place.workers["rollout"] == expected


def _ckpt(out: Path, iteration: int) -> dict:
    return torch.load(out / "checkpoints" / f"ckpt-{iteration:08d}.pt", weights_only=True)


def _train(client, algo, out: Path, iterations: int, resume: bool = False, **kw) -> dict:
    return train(client, algo, get_distribution("apex"),
                 RunSettings(out=out, steps=iterations * algo.steps_per_iteration, seed=4,
                             progress=False, tensorboard=False, eval=False, resume=resume,
                             checkpoint_every=3, **kw))


@pytest.fixture(scope="module")
def saved_run(client, tmp_path_factory) -> Path:
    """An apex run of 6 iterations whose checkpoints (every 3) hold its 2 shards."""
    out = tmp_path_factory.mktemp("apex-saved")
    _train(client, _algo(), out, 6)
    return out


def test_checkpoints_hold_the_shards_and_a_resume_restores_them(client, saved_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    saved = _ckpt(out, 6)["learner"]["replay_shards"]
    last = _rows(out)[-1]
    assert [int(s["size"]) for s in saved] == [int(last["replay_size/0"]),
                                               int(last["replay_size/1"])]
    assert all(int(s["size"]) > 0 for s in saved)
    _train(client, _algo(), out, 9, resume=True)
    rows = _rows(out)
    first = rows[6]  # the first resumed iteration
    assert int(first["replay_restored"]) == sum(int(s["size"]) for s in saved)
    assert int(first["replay_lost"]) == 0
    again = _ckpt(out, 9)["learner"]["replay_shards"]
    for before, after in zip(saved, again, strict=True):  # the saved rows are still there
        n = int(before["size"])
        assert int(after["size"]) > n
        np.testing.assert_array_equal(after["data"]["obs"][:n], before["data"]["obs"])
        np.testing.assert_array_equal(after["leaves"][:n] > 0, True)


def test_a_resume_with_another_shard_count_deals_the_saved_transitions(client, saved_run,
                                                                     tmp_path):
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    saved = _ckpt(out, 6)["learner"]["replay_shards"]
    _train(client, _algo(replay_shards=1), out, 7, resume=True)
    first = _rows(out)[6]
    assert int(first["replay_restored"]) == sum(int(s["size"]) for s in saved)
    assert int(first["replay_lost"]) == 0 and not first.get("replay_size/1")
    obs = np.concatenate([s["data"]["obs"] for s in saved])
    after = _ckpt(out, 7)["learner"]["replay_shards"][0]["data"]["obs"]
    assert {tuple(o) for o in obs.tolist()} <= {tuple(o) for o in after.tolist()}


def test_without_saved_replay_a_resume_restarts_the_shards_empty(client, tmp_path):
    algo = _algo(save_replay=False)
    _train(client, algo, tmp_path, 3)
    saved = _ckpt(tmp_path, 3)["learner"]["replay_shards"]
    assert all(set(s) == {"size"} for s in saved)  # sizes only, no contents
    _train(client, algo, tmp_path, 4, resume=True)
    first = _rows(tmp_path)[3]
    assert int(first["replay_restored"]) == 0
    assert int(first["replay_lost"]) == sum(int(s["size"]) for s in saved) > 0


def test_more_actors_than_workers_run_and_only_a_replay_too_large_is_refused(client, tmp_path):
    algo = _algo(num_actors=4)  # 4 actors, 2 shards, a learner on 3 workers
    train(client, algo, get_distribution("apex"),
          RunSettings(out=tmp_path / "ok", steps=3 * algo.steps_per_iteration, seed=5,
                      progress=False, tensorboard=False, eval=False))
    rows = _rows(tmp_path / "ok")
    assert len(rows) == 3 and int(rows[-1]["iteration_env_steps"]) > 0
    big = _algo(num_actors=4, buffer_size=2_000_000_000)
    with pytest.raises(MemoryBudgetError, match=r"replay .*--buffer-size") as info:
        train(client, big, get_distribution("apex"),
              RunSettings(out=tmp_path / "big", steps=256, progress=False, tensorboard=False))
    assert "\n" not in str(info.value)
