"""Re-planning during a run: a worker that joins gets a rollout replica at the next iteration
boundary, and every iteration is recorded once.

A real embedded cluster of one worker, a second started mid-run (``add_workers``, as an
adaptive cluster would); a worker that leaves is the recovery path (``tests/test_chaos.py``:
every distribution survives a killed worker with each iteration recorded once).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from distributed import Client

import daskrl
from daskrl.cluster.local import add_workers, close_cluster, local_cluster
from daskrl.observe.metrics import iteration_rows

REPO = Path(__file__).resolve().parent.parent
GRAPH = REPO / "graphs" / "ppo.py"
STEPS = 2 * 2 * 32  # an iteration: 2 actors x 2 envs x 32 steps

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("distribution", ["actors-learner", "impala"])
def test_a_worker_that_joins_gets_a_rollout_replica_within_two_iterations(
        tmp_path: Path, distribution: str) -> None:
    cluster = local_cluster([{"CPU": 1}], dashboard_address=None)
    client = Client(cluster)
    out = tmp_path / "run"
    # free-running actors hold a CPU slot each: two share w0's; they drain before a re-plan
    vtrace = ({"vtrace": True, "resources": {"rollout": "CPU:0.5"}}
              if distribution == "impala" else {})
    # (their learner tasks, each several short iterations, drain first: a bound in time,
    # the look-ahead of 4 tasks of about 0.5 s, not in iterations)
    within = 2 if distribution == "actors-learner" else 24
    try:  # 4 ms a step: an iteration of about half a second, one to a task
        run = daskrl.train(GRAPH, client=client, distribution=distribution, steps=24 * STEPS,
                           out=out, wait=False, progress=False, evaluate=False,
                           num_actors=2, num_envs=2, num_steps=32, env_step_cost=0.004,
                           **vtrace)
        deadline = time.monotonic() + 120
        while len(iteration_rows(out)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.status == "running", run.error
        add_workers(cluster, [{"CPU": 1}])
        joined_at = len(iteration_rows(out))  # iterations recorded once w1 is up
        run.result(timeout=240)
    finally:
        client.close()
        close_cluster(cluster)
    summary = run.summary
    (replan,) = summary["replans"]
    assert replan["reason"] == "worker(s) w1 joined", replan
    assert "rollout 1: w0 -> w1" in replan["moves"], replan
    # the iteration recorded while w1 started, the one whose record shows the join, then w1
    assert replan["iteration"] <= joined_at + within, (replan, joined_at)
    assert summary["placement"]["rollout"] == ["w0", "w1"]
    rows = iteration_rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 25))  # each once, in order
    steps = [int(r["env_steps"]) for r in rows]  # none lost, none counted twice
    gaps = [b - a for a, b in zip([0, *steps], steps, strict=False)]
    assert all(0.9 * STEPS <= g < 1.5 * STEPS for g in gaps), gaps
    noted = [r for r in rows if r.get("replan")]
    assert len(noted) == 1 and "w1 joined" in noted[0]["replan"]
    before = {_worker(s) for r in rows[:replan["iteration"]] for s in _streams(r)}
    after = {_worker(s) for r in rows[replan["iteration"] + 1:] for s in _streams(r)}
    assert before == {"w0"} and "w1" in after, (before, after)


def _streams(row: dict[str, str]) -> list[str]:
    return [s for s in row["rollout_workers"].split(";") if s]


def _worker(stream: str) -> str:
    """``"<replica>@<worker>"`` -> the worker."""
    return stream.rsplit("@", 1)[-1]


def test_adapt_adds_a_worker_while_the_learner_waits_and_the_replica_moves_there(
        tmp_path: Path) -> None:
    """``--adapt 1:2``: one worker at first, two actors fused on it and the learner waiting
    for their 4 ms steps; the run asks Dask for a second worker, which gets actor 1."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "daskrl", "train", str(GRAPH), "--adapt", "1:2", "--steps",
         str(30 * STEPS), "--num-actors", "2", "--num-envs", "2", "--num-steps", "32",
         "--env-step-cost", "0.004", "--no-eval", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    (change,) = summary["adapt"]["changes"]
    assert (change["from"], change["to"]) == (1, 2) and change["iteration"] <= 4, change
    (replan,) = summary["replans"]
    assert replan["reason"] == "worker(s) w1 joined"
    assert "rollout 1: w0 -> w1" in replan["moves"]
    assert summary["placement"]["rollout"] == ["w0", "w1"]
    assert summary["adapt"]["worker_s"] > 0
    rows = iteration_rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 31))
    assert "--adapt: 1 change(s)" in done.stderr


def test_adapt_grows_an_apex_run_and_its_replay_goes_on(tmp_path: Path) -> None:
    """``--adapt 1:2`` under ``apex`` (DQN): free-running actors that share one worker's CPU
    wait on 4 ms env steps; the run asks for a second worker, puts an actor (and the learner)
    there, and the replay shards go on with what they held."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "daskrl", "train", str(REPO / "graphs" / "dqn.py"),
         "--distribution", "apex", "--adapt", "1:2", "--steps", str(24 * 256), "--num-envs", "2",
         "--num-actors", "2", "--env-step-cost", "0.004", "--resources", "rollout=CPU:0.5",
         "--no-eval", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    (change,) = summary["adapt"]["changes"]
    assert (change["from"], change["to"]) == (1, 2), change
    (replan,) = summary["replans"]
    assert replan["reason"] == "worker(s) w1 joined" and "rollout 1: w0 -> w1" in replan["moves"]
    assert sorted(summary["placement"]["rollout"]) == ["w0", "w1"]
    rows = iteration_rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 25))
    sizes = [int(float(r["replay_size"])) for r in rows]
    at = replan["iteration"]  # the shards hold after the re-plan what they held before it
    assert sizes[at] > sizes[at - 1], (at, sizes)


def test_adapt_is_refused_in_one_line_where_it_cannot_apply(tmp_path: Path) -> None:
    import subprocess
    import sys

    for extra, words in ((["--adapt", "3:1"], "MIN must be >= 1 and <= MAX"),
                         (["--adapt", "1:2", "--deterministic"], "not with --deterministic"),
                         (["--adapt", "1:2", "--scheduler", "tcp://127.0.0.1:1"],
                          "scale your own cluster")):
        done = subprocess.run([sys.executable, "-m", "daskrl", "train", str(GRAPH), *extra,
                               "--out", str(tmp_path / "run")], capture_output=True,
                              text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr
