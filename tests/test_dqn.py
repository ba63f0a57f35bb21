"""DQN: learns CartPole under ``single`` on a real cluster, runs under ``actors-learner`` with
the replay resident in the learner, is deterministic, resumes with its replay, and refuses a
continuous action space in one line."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

from daskrl.cluster.local import local_cluster
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent
GRAPH = load_graph(str(REPO / "graphs" / "dqn.py"))

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    cluster = local_cluster([{"CPU": 1}] * 2)
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _settings(out: Path, steps: int, **kw) -> RunSettings:
    return RunSettings(out=out, steps=steps, seed=3, progress=False, tensorboard=False, **kw)


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_dqn_learns_cartpole_under_single(client, tmp_path):
    # a small network with a Polyak-averaged target: stable enough to judge in a short run
    algo = GRAPH.build(GRAPH.Config(hidden=64, tau=0.01, target_network_frequency=2,
                                    eval_episodes=10))
    summary = train(client, algo, get_distribution("single"), _settings(tmp_path, 6_000))
    rows = _rows(tmp_path)
    # the learner waited for --learning-starts transitions before its first gradient step
    first = next(r for r in rows if float(r["gradient_steps"] or 0) > 0)
    assert int(first["replay_size"]) >= 1000
    assert float(rows[0]["gradient_steps"]) == 0
    assert summary["eval_return_mean"] >= 100, summary["eval_return_mean"]  # random: ~20


def test_actors_learner_feeds_the_resident_replay(client, tmp_path):
    algo = GRAPH.build(GRAPH.Config(num_actors=2, num_envs=2, num_steps=32, learning_starts=200,
                                    n_step=3, prioritized_replay=True, eval_episodes=2))
    train(client, algo, get_distribution("actors-learner:fuse=false"),
          _settings(tmp_path, 6 * algo.steps_per_iteration))
    rows = _rows(tmp_path)
    workers = {w.split("@")[1] for w in rows[-1]["rollout_workers"].split(";")}
    assert len(workers) == 2  # one actor per worker, both writing to the learner's replay
    sizes = [int(r["replay_size"]) for r in rows]
    assert sizes == sorted(sizes) and sizes[-1] > 5 * 100
    assert float(rows[-1]["gradient_steps"]) > 0


def test_deterministic_runs_match_and_resume_keeps_the_replay(client, tmp_path):
    # a constant learning rate: the half run below is a run of 3 iterations, whose annealed
    # schedule would end at 0 where the 6-iteration run's is at half
    algo = GRAPH.build(GRAPH.Config(num_envs=2, num_steps=32, learning_starts=64,
                                    eval_episodes=1, hidden=32, anneal_lr=False))
    steps = 6 * algo.steps_per_iteration
    kw = {"deterministic": True, "eval": False, "checkpoint_every": 3}
    a = train(client, algo, get_distribution("single"), _settings(tmp_path / "a", steps, **kw))
    b = train(client, algo, get_distribution("single"), _settings(tmp_path / "b", steps, **kw))
    assert a["weights_sha256"] == b["weights_sha256"]
    # resume from the checkpoint of iteration 3 (replay included): the same weights at the end
    half = train(client, algo, get_distribution("single"),
                 _settings(tmp_path / "c", 3 * algo.steps_per_iteration, **kw))
    assert half["iterations"] == 3
    resumed = train(client, algo, get_distribution("single"),
                    _settings(tmp_path / "c", steps, resume=True, **kw))
    assert resumed["weights_sha256"] == a["weights_sha256"]


def test_continuous_env_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "daskrl", "train", str(REPO / "graphs/dqn.py"),
                           "--env", "Pendulum-v1", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("daskrl: error")]
    assert len(errors) == 1, proc.stderr  # (a loaded machine may add Dask's slowness warnings)
    assert "Discrete" in errors[0] and "Box" in errors[0] and "sac" in errors[0]


def test_without_save_replay_a_resume_says_the_buffer_restarts_empty(capsys):
    from daskrl.algos.dqn_learner import DQNHyper, DQNLearner
    from daskrl.algos.q_actor import QActor

    hyper = DQNHyper(save_replay=False, learning_starts=10, batch_size=8)
    learner = DQNLearner(4, 2, seed=0, hidden=(8,), hyper=hyper)
    learner.update([QActor("CartPole-v1", 2, seed=0, hidden=(8,)).rollout(16)], 0.1)
    state = learner.state_dict()
    assert "replay" not in state and state["replay_size"] > 0
    resumed = DQNLearner(4, 2, seed=1, hidden=(8,), hyper=hyper)
    resumed.load_state_dict(state)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "restarts empty" in err[0] and "--no-save-replay" in err[0]
    assert len(resumed.replay) == 0 and resumed.env_steps == learner.env_steps
    saved = DQNLearner(4, 2, seed=0, hidden=(8,), hyper=DQNHyper())
    saved.update([QActor("CartPole-v1", 2, seed=0, hidden=(8,)).rollout(16)], 0.1)
    again = DQNLearner(4, 2, seed=2, hidden=(8,), hyper=DQNHyper())
    again.load_state_dict(saved.state_dict())
    assert len(again.replay) == len(saved.replay) > 0


@pytest.mark.parametrize(("double_q", "anneal_lr"), [(True, False), (False, False),
                                                     (True, True)])
def test_update_matches_one_gradient_step_at_a_time(double_q, anneal_lr):
    """The learner's fast path (one sample per iteration, the target's Q of a whole segment in
    one pass, fused Adam) takes the same steps as a plain loop: per step its own minibatch,
    the target's forward, Huber loss, clipping, Adam (at the learning rate annealed to the
    run's progress with ``anneal_lr``), and the hard target update after the steps that
    cross ``target_network_frequency`` env steps."""
    import copy

    import numpy as np
    import torch
    import torch.nn.functional as F

    from daskrl.algos.dqn_learner import DQNHyper, DQNLearner
    from daskrl.algos.q_actor import QActor
    from daskrl.algos.qnet import q_and_target

    hyper = DQNHyper(learning_starts=0, batch_size=8, train_frequency=2,
                     target_network_frequency=8, double_q=double_q, learning_rate=1e-2,
                     max_grad_norm=0.5, anneal_lr=anneal_lr)
    learner = DQNLearner(4, 2, seed=0, hidden=(16,), hyper=hyper)
    actor = QActor("CartPole-v1", 2, seed=0, hidden=(16,))
    fill = actor.rollout(32)
    fill["stats"]["env_steps"] = 0  # added, no gradient step
    learner.update([fill], 0.1)
    batch = actor.rollout(8)
    batch["stats"]["env_steps"] = 16  # 8 gradient steps; the target updates after the 4th, 8th
    replay, net = copy.deepcopy(learner.replay), copy.deepcopy(learner.net)
    target = copy.deepcopy(learner.target)
    lr = hyper.learning_rate * (0.6 if anneal_lr else 1.0)  # 40 % of the run done
    opt = torch.optim.Adam(net.parameters(), lr=lr, foreach=False)
    metrics = learner.update([batch], 0.4)
    assert metrics["gradient_steps"] == 8
    assert metrics["charts/learning_rate"] == pytest.approx(lr)

    replay.add(batch)
    sample = replay.sample(8 * 8)
    for i in range(8):
        rows = slice(8 * i, 8 * (i + 1))
        b = {k: torch.as_tensor(np.asarray(sample[k][rows])) for k in
             ("obs", "actions", "rewards", "next_obs", "discounts")}
        with torch.no_grad():
            next_target = target(b["next_obs"])
        q, target_q = q_and_target(net, b["obs"], b["next_obs"], b["actions"], b["rewards"],
                                   b["discounts"], next_target, double_q)
        loss = F.smooth_l1_loss(q, target_q)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), hyper.max_grad_norm, foreach=False)
        opt.step()
        if i in (3, 7):
            target.q.load_state_dict(net.q.state_dict())
    for mine, ref in ((learner.net.q, net.q), (learner.target.q, target.q)):
        for a, b in zip(mine.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _small(**kw):
    return GRAPH.build(GRAPH.Config(**{**dict(num_envs=2, num_steps=32, learning_starts=64,
                                              hidden=16, eval_episodes=1), **kw}))


def test_actors_learner_outputs_between_checkpoints_carry_no_replay():
    """Only a checkpointed (or deterministic) iteration's output copies the replay; the
    others carry the learner's light state: networks, optimiser and counters."""
    from daskrl.core.algorithm import LearnerOutput
    from daskrl.distributions import IterationInputs
    from daskrl.runtime.driver import place
    from daskrl.runtime.sync_backend import SyncBackend

    algo = _small()
    dist = get_distribution("actors-learner:fuse=false")
    placement = place(SyncBackend(), algo, dist)
    learner = algo.make_learner(0, "cpu")
    out = LearnerOutput(0, learner.state_dict(), learner.weights())
    for k, (checkpoint, deterministic) in enumerate(
            [(False, False), (True, False), (False, False), (False, True)]):
        inputs = IterationInputs(algo, placement, "light-state", 1, k, 10, out,
                                 deterministic=deterministic, checkpoint=checkpoint)
        out = dist.iteration(inputs).compute(scheduler="sync")
        full = checkpoint or deterministic
        assert ("replay" in out.state) is full and out.state.get("light") is (None if full
                                                                             else True)
        assert out.state["replay_size"] == out.metrics["replay_size"] > 64 * k
        assert out.state["env_steps"] == out.metrics["learner_env_steps"] > 60 * (k + 1)
        assert "optimizer" in out.state and "target" in out.state


def _address(client: Client, name: str) -> str:
    return next(a for a, w in scheduler_workers(client).items()
                if w["name"] == name)


def test_a_killed_learner_worker_is_rebuilt_and_reports_the_replay_lost(client, tmp_path):
    """Between checkpoints the driver holds the learner's light state: the learner rebuilt
    from it has the latest networks and an empty replay, reports the transitions lost, and
    the run goes on (no hang)."""
    import contextlib
    import threading
    import time

    from distributed.comm.core import CommClosedError

    algo = _small(num_actors=2, learning_starts=128, train_frequency=4)
    settings = _settings(tmp_path, 12 * algo.steps_per_iteration, eval=False, lookahead=1,
                         checkpoint_every=100)
    killed: list[str] = []

    def kill_when_started() -> None:
        while not (tmp_path / "metrics.csv").exists() or len(_rows(tmp_path)) < 4:
            time.sleep(0.2)
        name = _rows(tmp_path)[-1]["learner_worker"]
        killed.append(name)
        with contextlib.suppress(CommClosedError):  # it exits before it answers
            client.run(lambda: __import__("os")._exit(1), workers=[_address(client, name)])

    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    summary = train(client, algo, get_distribution("actors-learner:fuse=false"), settings)
    killer.join(timeout=1)
    rows = _rows(tmp_path)
    assert killed and summary["iterations"] == 12
    lost = [(i, int(r["replay_lost"])) for i, r in enumerate(rows) if int(r["replay_lost"])]
    assert len(lost) == 1, lost  # once, by the rebuilt learner's first update
    i, n = lost[0]
    assert rows[i]["learner_built"] == "True" and n == int(rows[i - 1]["replay_size"]) >= 256
    # the rebuilt learner kept its counters and refilled the replay from empty
    assert 0 < int(rows[i]["replay_size"]) <= algo.steps_per_iteration
    counts = [int(r["learner_env_steps"]) for r in rows]
    assert counts == sorted(set(counts)) and len(counts) == 12
    assert float(rows[-1]["gradient_steps"]) > 0
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it for the next test


def test_actors_learner_resume_keeps_the_replay_and_deterministic_runs_match(client, tmp_path):
    algo = _small(anneal_lr=False)  # the half run's annealed schedule would end at 0
    steps = 6 * algo.steps_per_iteration
    dist = "actors-learner:fuse=false"
    kw = {"deterministic": True, "eval": False, "checkpoint_every": 3}
    a = train(client, algo, get_distribution(dist), _settings(tmp_path / "a", steps, **kw))
    half = train(client, algo, get_distribution(dist),
                 _settings(tmp_path / "b", 3 * algo.steps_per_iteration, **kw))
    assert half["iterations"] == 3
    resumed = train(client, algo, get_distribution(dist),
                    _settings(tmp_path / "b", steps, resume=True, **kw))
    assert resumed["weights_sha256"] == a["weights_sha256"]
    # not deterministic: the outputs between checkpoints are light, the checkpoints are not
    kw = {"eval": False, "checkpoint_every": 2}
    train(client, algo, get_distribution(dist),
          _settings(tmp_path / "c", 3 * algo.steps_per_iteration, **kw))
    import torch

    for name in ("ckpt-00000002.pt", "ckpt-00000003.pt"):
        saved = torch.load(tmp_path / "c" / "checkpoints" / name, weights_only=True)["learner"]
        assert "light" not in saved and len(saved["replay"]["data"]["rewards"]) == (
            saved["replay_size"])
    train(client, algo, get_distribution(dist), _settings(tmp_path / "c", steps, resume=True,
                                                         **kw))
    rows = _rows(tmp_path / "c")
    first = next(r for r in rows if int(r["iteration"]) == 4)
    assert int(first["replay_lost"]) == 0
    assert int(first["replay_size"]) > 3 * algo.steps_per_iteration  # 3 restored + 1 new
