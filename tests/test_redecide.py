"""``--distribution auto`` re-decides while the run goes on: a worker that joins makes the run
try its candidates on the cluster as it is now and switch to the fastest; a switch carries
the learner's whole state over (an off-policy replay included), and every iteration is
recorded once.

Real clusters (daskrl's own, one CPU per worker). The margin asserted is the workload's:
two actors whose env steps cost 4 ms of CPU each run about 1.8x as fast on two workers as
fused on one (1.1x asserted: the test holds beside other work on two cores).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from daskrl.cluster.local import add_workers, close_cluster, local_cluster
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.observe.metrics import iteration_rows
from daskrl.runtime.driver import train
from daskrl.runtime.redecide import RedecidePlan, Redecider, plan_from_probe
from daskrl.runtime.settings import RunSettings

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def _settings(out: Path, steps: int, plan: RedecidePlan) -> RunSettings:
    return RunSettings(out, steps=steps, redecide=plan, eval=False, progress=False,
                       tensorboard=False, advice=False, task_s=0.0)


def test_a_worker_that_joins_makes_the_run_switch_to_the_distribution_that_uses_it(
        tmp_path: Path) -> None:
    """One worker: ``single`` steps both actors' costly envs in one task. A second worker
    joins: ``single`` has no use for it, so nothing is re-placed, but the run tries
    ``actors-learner`` (an actor on each worker), finds it faster and goes on under it."""
    ppo = load_graph(str(REPO / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=2, num_steps=32, env_step_cost=0.004))
    steps = 40 * algo.steps_per_iteration
    plan = RedecidePlan(("single", "actors-learner"), "single", trial_s=1.0)
    cluster = local_cluster([{"CPU": 1}], dashboard_address=None)
    client = Client(cluster)
    out = tmp_path / "run"
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = train(client, algo, get_distribution("single"),
                                      _settings(out, steps, plan))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = exc

    worker = threading.Thread(target=run)
    try:
        worker.start()
        deadline = time.monotonic() + 120
        while len(iteration_rows(out)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        add_workers(cluster, [{"CPU": 1}])
        worker.join(timeout=240)
    finally:
        client.close()
        close_cluster(cluster)
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    (trial,) = summary["distribution_redecided"]["trials"]
    assert trial["reason"] == "worker(s) w1 joined", trial
    rates = trial["rates"]
    assert rates["actors-learner"] > 1.1 * rates["single"], rates  # about 1.8x alone
    assert trial["chosen"] == "actors-learner" == summary["distribution"], trial
    assert sorted(summary["placement"]["rollout"]) == ["w0", "w1"], summary["placement"]
    switches = [r for r in summary["replans"] if "--distribution" in " ".join(r["moves"])]
    assert len(switches) == 1, summary["replans"]
    rows = iteration_rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 41))  # each once, in order
    steps_seen = [int(r["env_steps"]) for r in rows]  # none lost, none counted twice
    gaps = [b - a for a, b in zip([0, *steps_seen], steps_seen, strict=False)]
    each = algo.steps_per_iteration
    assert all(0.9 * each <= g < 1.5 * each for g in gaps), gaps


def test_a_switch_carries_an_off_policy_learner_over_with_its_replay(
        cluster_pair: dict[int, Client], tmp_path: Path) -> None:
    """DQN, whose replay travels only in outputs that carry the full state: a plan that
    re-decides on any change of rate switches ``single`` -> ``actors-learner`` (and maybe
    back); the replay grows by each iteration's steps across every switch, and the learning
    rate's schedule goes on where it was."""
    dqn = load_graph(str(REPO / "graphs" / "dqn.py"))
    algo = dqn.build(dqn.Config(num_envs=2, num_steps=64, learning_starts=256,
                                buffer_size=100_000))
    steps = 40 * algo.steps_per_iteration
    plan = RedecidePlan(("single", "actors-learner"), "single", window=3, drift=0.0,
                        trial_s=0.2, max_trials=2)
    summary = train(cluster_pair[2], algo, get_distribution("single"),
                    _settings(tmp_path / "run", steps, plan))
    trials = summary["distribution_redecided"]["trials"]
    assert trials and set(trials[0]["rates"]) == {"single", "actors-learner"}, trials
    switches = [r["iteration"] for r in summary["replans"]
                if "--distribution" in " ".join(r["moves"])]
    assert switches, summary["replans"]
    rows = iteration_rows(tmp_path / "run")
    assert [int(r["iteration"]) for r in rows] == list(range(1, 41))
    replay = [int(float(r["replay_size"])) for r in rows]
    grown = [int(r["iteration_env_steps"]) for r in rows]
    assert replay == [sum(grown[: i + 1]) for i in range(len(rows))], (switches, replay)
    lr = [float(r["charts/learning_rate"]) for r in rows]
    assert all(b < a for a, b in zip(lr, lr[1:], strict=False)), (switches, lr)


CANDIDATES = ("single", "actors-learner", "data-parallel")


def _drifted(plan: RedecidePlan) -> Redecider:
    """A redecider under ``single`` whose rate fell by half: its trial is under way, under
    ``actors-learner``, the first candidate to try."""
    r = Redecider(plan)
    for rate in (1000.0,) * plan.window + (500.0,) * plan.window:
        decision = r.observe(rate, 1.0, left=100)
    assert decision is not None and decision[0] == "actors-learner", decision
    r.switched("actors-learner")
    return r


def test_a_cluster_change_mid_trial_starts_over_as_a_trial_of_its_own() -> None:
    r = _drifted(RedecidePlan(CANDIDATES, "single", window=2, max_trials=2))
    r.cluster_changed("worker(s) w2 joined", workers=3)
    assert r.to_try is None and r.workers == 3
    assert r.observe(800, 2.0, left=90) is None  # the graph after the re-placement
    decision = r.observe(800, 1.0, left=89)  # times actors-learner, then tries the next
    assert decision == ("single", "worker(s) w2 joined: trying single"), decision
    assert r.trials == 2 and r.measured == {"actors-learner": 800.0}


def test_a_trial_that_cannot_start_over_returns_to_the_last_choice() -> None:
    """Trials spent (or too few iterations left): the run does not stay under the candidate
    it was trying when the cluster changed."""
    r = _drifted(RedecidePlan(CANDIDATES, "single", window=2, max_trials=1))
    r.cluster_changed("worker(s) w1 left")
    r.observe(800, 2.0, left=90)
    decision = r.observe(800, 1.0, left=89)
    assert decision == ("single", "back to single, the last trial's choice"), decision
    assert r.changes[-1]["chosen"] == "single"
    r2 = _drifted(RedecidePlan(CANDIDATES, "single", window=2))
    r2.cluster_changed("worker(s) w1 left")
    r2.observe(800, 2.0, left=3)
    assert r2.observe(800, 1.0, left=1)[0] == "single"  # fewer than a window to go


def test_a_candidate_that_cannot_be_placed_is_left_out_of_the_trial() -> None:
    r = Redecider(RedecidePlan(CANDIDATES, "single", window=2))
    for rate in (1000.0, 1000.0, 500.0, 500.0):
        decision = r.observe(rate, 1.0, left=100)
    assert decision is not None and decision[0] == "actors-learner"
    r.refused("actors-learner", "no worker offers the rollout's resources")
    assert r.observe(500, 1.0, left=97) is None  # the graphs let go restart it: not timed
    decision = r.observe(500, 1.0, left=96)  # single timed again; data-parallel next
    assert decision is not None and decision[0] == "data-parallel", decision
    r.switched("data-parallel")
    r.observe(300, 2.0, left=90)
    decision = r.observe(300, 1.0, left=89)
    assert decision is not None and decision[0] == "single", decision  # back: it was faster
    trial = r.changes[-1]
    assert set(trial["rates"]) == {"single", "data-parallel"} and trial["chosen"] == "single"
    assert "could not be placed" in r.changes[0]["reason"]


def test_a_resume_goes_on_under_the_last_choice_and_may_re_decide() -> None:
    record = {"chosen": "single", "now": "actors-learner", "workers": 1, "candidates": [
        {"distribution": "single", "env_steps_per_s": 1000.0},
        {"distribution": "actors-learner", "env_steps_per_s": 900.0},
        {"distribution": "apex", "env_steps_per_s": 1200.0}]}
    plan = plan_from_probe(record)
    assert plan is not None
    assert (plan.start, plan.candidates, plan.workers) == (
        "actors-learner", ("single", "actors-learner"), 1)
    assert Redecider(plan).current == Redecider(plan).settled == "actors-learner"
    with pytest.raises(ValueError, match="cannot switch to or from apex"):
        RedecidePlan(("single", "apex"))
