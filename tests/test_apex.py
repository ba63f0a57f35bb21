"""The ``apex`` distribution: replay shards run on the replay role's worker, actors explore on
the epsilon ladder and refresh weights every K iterations (policy lag reported), the learner
trains on the shards' samples and sends priorities back; a killed replay worker is rebuilt
and the run goes on; deterministic mode and oversized replays are refused in one line."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

from daskrl.cluster.local import local_cluster
from daskrl.core.resources import Resources
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
    config = GRAPH.Config(num_actors=2, replay_shards=2, num_envs=2, num_steps=32,
                          learning_starts=200, train_frequency=4, batch_size=32, hidden=32,
                          eval_episodes=2, **kw)
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
    train(client, algo, get_distribution("apex:refresh_every=2"),
          RunSettings(out=tmp_path, steps=6 * algo.steps_per_iteration, seed=2, progress=False,
                      tensorboard=False, eval=False))
    rows = _rows(tmp_path)
    for r in rows:  # every shard task ran on w2, the replay worker; actors and learner did not
        assert {w.split("@")[1] for w in r["replay_workers"].split(";")} == {"w2"}
        assert "w2" not in {w.split("@")[1] for w in r["rollout_workers"].split(";")}
        assert r["learner_worker"] != "w2"
    assert [int(r["policy_lag"]) for r in rows] == [0, 1] * 3  # refreshed every 2 iterations
    sizes = [int(r["replay_size"]) for r in rows]
    assert sizes == sorted(sizes) and int(rows[-1]["replay_size/0"]) > 0
    assert int(rows[-1]["replay_size/1"]) > 0
    assert float(rows[0]["gradient_steps"]) == 0  # waits for --learning-starts
    assert float(rows[-1]["gradient_steps"]) > 0
    assert int(rows[-1]["replay_lost"]) == 0


def test_a_killed_replay_worker_is_rebuilt_and_the_run_goes_on(client, tmp_path):
    algo = _algo()
    steps = 14 * algo.steps_per_iteration
    settings = RunSettings(out=tmp_path, steps=steps, seed=3, progress=False,
                           tensorboard=False, eval=False, lookahead=1)
    import threading
    import time

    def kill_when_started() -> None:
        while not (tmp_path / "metrics.csv").exists() or len(_rows(tmp_path)) < 4:
            time.sleep(0.2)
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
    return next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
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
