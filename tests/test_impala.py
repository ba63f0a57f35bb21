"""The ``impala`` distribution: free-running actors on real workers, lag recorded per batch,
a killed actor worker that does not stop the learner, learning, and bad input."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client

from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.distributions import Unsupported, get_distribution
from daskrl.distributions.base import IterationInputs
from daskrl.observe.profile import learner_waits, report
from daskrl.runtime.driver import place
from daskrl.runtime.sync_backend import SyncBackend

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskrl.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=_env(), timeout=timeout)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=_env(),
                            start_new_session=True, cwd=ROOT)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


# ------------------------------------------------------------------ bad input


def test_bad_input_is_one_line_before_any_worker() -> None:
    with pytest.raises(ValueError, match=r"^option max_lag='-1' must be >= 0$"):
        get_distribution("impala:max_lag=-1")
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config())  # no --vtrace: its batches carry no sequences
    with pytest.raises(Unsupported, match="'vtrace' capability.*graphs/ppo.py --vtrace"):
        get_distribution("impala").check(algo)
    get_distribution("impala").check(ppo.build(ppo.Config(vtrace=True)))
    three = load_graph(str(ROOT / "graphs" / "impala.py")).build(
        load_graph(str(ROOT / "graphs" / "impala.py")).Config(num_actors=3))
    with pytest.raises(Unsupported, match=r"^impala:batch=2 must divide --num-actors 3 .*"
                                          r"use batch=1 or 3, or --num-actors 4$"):
        get_distribution("impala:batch=2").check(three)
    done = _cli("train", "graphs/ppo.py", "--distribution", "impala", "--steps", "1000",
                "--out", "/tmp/daskrl-impala-refused")
    assert "'vtrace' capability" in _refusal(done)
    # --vtrace on a graph without a state-value head
    done = _cli("train", "graphs/dqn.py", "--vtrace", "--steps", "1000",
                "--out", "/tmp/daskrl-impala-refused")
    line = _refusal(done)
    assert "--vtrace" in line and "no state-value head" in line, line
    # more actors than the workers hold: the numbers and the fixes, before any task
    done = _cli("train", "graphs/impala.py", "--workers", "2", "--num-actors", "3", "--steps",
                "1000", "--out", "/tmp/daskrl-impala-refused")
    line = _refusal(done)
    assert ("--num-actors 3: the workers that may host actors (w0, w1) hold 2 at once"
            in line and "--resources rollout=CPU:0.666667" in line), line


def _refusal(done: subprocess.CompletedProcess) -> str:
    """The one line of a refused run (a busy machine may add Dask's warnings about a slow
    start of the embedded cluster, which starts while the command line is checked)."""
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("daskrl:")]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "scheduler:" not in done.stderr, done.stderr
    return lines[0]


def test_actors_are_counted_against_what_the_workers_hold() -> None:
    from daskrl.core.placement import plan_placement

    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(num_actors=4))
    dist = get_distribution("impala:apart=true")
    two = {"a": {"CPU": 2}, "b": {"CPU": 2}, "c": {"CPU": 2}}
    dist.check_capacity(plan_placement(dist.fragments(algo), two), two, algo)  # b, c hold 4
    one = {"a": {"CPU": 2}, "b": {"CPU": 2}, "c": {"CPU": 1}}  # the learner's a is not counted
    with pytest.raises(ValueError, match=r"\(b, c\) hold 3 at once.*1 more worker like"):
        dist.check_capacity(plan_placement(dist.fragments(algo), one), one, algo)
    plain = {"a": {}, "b": {}}  # no worker declares CPU: Dask runs a task per thread
    get_distribution("impala").check_capacity(plan_placement(dist.fragments(algo), plain),
                                              plain, algo)


# ------------------------------------------------------------------ sync, placement, sketch


def test_placement_keeps_actors_off_the_learner_and_sketch_shows_the_pipeline() -> None:
    from dask.core import get_dependencies

    from daskrl.core.placement import plan_placement

    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(num_actors=3))
    dist = get_distribution("impala:in_flight=2,apart=true")
    p = plan_placement(dist.fragments(algo), {"a": {"CPU": 1}, "b": {"CPU": 1}, "c": {"CPU": 1}})
    assert p.workers["learner"] == ("a",) and set(p.workers["rollout"]) == {"b", "c"}
    graph = dist.sketch(IterationInputs(algo, p, "run", 0, 0, 10, None))
    keys = {str(k) for k in dict(graph.dask)}
    assert {f"rollout-{a}-it0-s{j}-run" for a in range(3) for j in range(3)} & keys
    assert {"update-v1-it0-run", "update-v3-it0-run", "publish-v3-it0-run"} <= keys
    assert sum(k.startswith("rollout-") for k in keys) == 3 * 2 + 3  # K each + one per batch
    # with batch=3 one update takes the three batches
    graph = get_distribution("impala:in_flight=2,apart=true,batch=3").sketch(
        IterationInputs(algo, p, "run", 0, 0, 10, None))
    updates = sorted(str(k) for k in dict(graph.dask) if str(k).startswith("update-"))
    assert updates == ["update-v1-it0-run"]
    deps = get_dependencies(dict(graph.dask), "update-v1-it0-run")
    assert sum(str(d).startswith("rollout-") for d in deps) == 3


def test_sync_scheduler_runs_the_actors_in_turn(tmp_path: Path) -> None:
    from daskrl.runtime.driver import RunSettings, train

    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(num_actors=2, num_envs=2, num_steps=16))
    dist = get_distribution("impala")
    assert place(SyncBackend(), algo, dist).worker("learner", 0) == "local"
    summary = train(SyncBackend(), algo, dist,
                    RunSettings(out=tmp_path, steps=4 * 64, eval=False, progress=False,
                                meta={"graph": "graphs/impala.py", "config": {"num_actors": 2}}))
    rows = _rows(tmp_path / "metrics.csv")
    assert summary["iterations"] == 4 and len(rows) == 4
    assert all(r["policy_lags"] == "0:0 1:0" for r in rows)
    # in turn, the learner waits for every rollout (how long depends on the machine)
    assert all(0 < float(r["learner_busy"]) <= 1 for r in rows)
    assert "learner busy: " in report(tmp_path)
    # summary.json carries the headline figures: the means after the first iteration
    saved = json.loads((tmp_path / "summary.json").read_text())
    busy = [float(r["learner_busy"]) for r in rows[1:]]
    assert saved["learner_busy_mean"] == pytest.approx(sum(busy) / len(busy))
    assert saved["policy_lag_mean"] == 0


def test_update_epochs_pass_over_each_update_s_batches() -> None:
    # --update-epochs E --num-minibatches M: E x M optimiser steps per update (APPO's passes,
    # what the scale lab's learner-bound rows use); IMPALA's one step by default
    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    steps = {}
    for epochs, minibatches in ((1, 1), (3, 2)):
        algo = impala.build(impala.Config(num_envs=2, num_steps=8, update_epochs=epochs,
                                          num_minibatches=minibatches))
        learner, actor = algo.make_learner(0, "cpu"), algo.make_actor(0)
        actor.set_weights(learner.weights(), 0)
        learner.update([actor.rollout(8)], 0.0)
        steps[epochs, minibatches] = {int(s["step"]) for s in learner.optimizer.state.values()}
    assert steps == {(1, 1): {1}, (3, 2): {6}}
    for field, flag in (("update_epochs", "--update-epochs"),
                        ("num_minibatches", "--num-minibatches")):
        with pytest.raises(ValueError, match=rf"^{flag} must be > 0, got 0$"):
            impala.build(impala.Config(**{field: 0}))


def test_batch_makes_one_update_of_several_rollouts(tmp_path: Path) -> None:
    # impala:batch=2 with 2 actors: one gradient step per iteration on both batches (as
    # lockstep actors-learner makes), so the weights version counts iterations
    from daskrl.runtime.driver import RunSettings, train

    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(num_actors=2, num_envs=2, num_steps=16))
    for spec, per_iteration in (("impala", 2), ("impala:batch=2", 1)):
        out = tmp_path / spec.replace(":", "_")
        train(SyncBackend(), algo, get_distribution(spec),
              RunSettings(out=out, steps=3 * 64, eval=False, progress=False))
        rows = _rows(out / "metrics.csv")
        assert [int(r["weights_version"]) for r in rows] == [
            per_iteration * (i + 1) for i in range(3)], spec
        assert all(r["policy_lags"] == "0:0 1:0" for r in rows), spec


def test_profile_says_actor_bound_and_how_many_actors_to_add() -> None:
    rows = [{"learner_busy": 0.5, "actors_for_busy": 5.0}, {"learner_busy": 0.7,
                                                            "actors_for_busy": 7.0}]
    text = learner_waits(rows, {"num_actors": 2})
    assert text is not None and "waiting for batches 40.0%" in text
    assert "actor-bound: add 4 actors (--num-actors 6)" in text
    assert "actor-bound" not in (learner_waits([{"learner_busy": 0.97}], {"num_actors": 2})
                                 or "")
    assert learner_waits([{"episode_return_mean": 1.0}]) is None  # not a free-running run


def test_ppo_with_vtrace_runs_under_impala(tmp_path: Path) -> None:
    from daskrl.runtime.driver import RunSettings, train

    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(vtrace=True, num_actors=2, num_envs=2, num_steps=16,
                                update_epochs=2, num_minibatches=2))
    summary = train(SyncBackend(), algo, get_distribution("impala"),
                    RunSettings(out=tmp_path, steps=2 * 64, eval=False, progress=False))
    rows = _rows(tmp_path / "metrics.csv")
    assert summary["iterations"] == 2 and all(r["policy_lags"] == "0:0 1:0" for r in rows)
    assert all(abs(float(r["vtrace/rho_mean"]) - 1) < 1e-4 for r in rows[:1])  # on-policy
    assert "losses/clipfrac" in rows[0]  # PPO's loss, on V-trace targets


# ------------------------------------------------------------------ real workers


def test_learns_cartpole_with_free_running_actors(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _cli("train", "graphs/impala.py", "--workers", "2", "--steps", "80000", "--seed", "1",
                "--out", str(out), "--no-progress", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distribution"] == "impala"
    assert summary["eval_return_mean"] >= 195, summary
    rows = _rows(out / "metrics.csv")
    for r in rows:  # every batch's lag, in arrival order: num_actors batches an iteration
        lags = [int(x.split(":")[1]) for x in r["policy_lags"].split()]
        assert len(lags) == 2  # (a free-running actor may land both of them)
        # no batch acted on weights newer than the learner's, and the row's figures are
        # these batches' (a lag counted from the wrong version breaks one of them)
        assert 0 <= min(lags) and max(lags) < int(r["weights_version"])
        assert float(r["policy_lag"]) == pytest.approx(sum(lags) / 2)
        assert int(r["policy_lag_max"]) == max(lags)
        assert 0 < float(r["learner_busy"]) <= 1
    # the actors did not wait for the learner: batches acted on weights updates behind
    assert max(float(r["policy_lag_max"]) for r in rows) >= 1
    assert "learner busy: " in report(out)
    # by default the actors are spread over both workers, the learner's too (any one row may
    # hold two batches of the same actor: the learner takes batches as they land)
    assert {w.split("@")[1] for r in rows for w in r["rollout_workers"].split(";")} == {"w0", "w1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_killed_actor_worker_does_not_stop_the_learner(tmp_path: Path) -> None:
    """``--scheduler ADDRESS`` with nanny workers l (learner), x and y (actors): kill -9 x
    mid-run; the learner goes on (no recovery, every iteration once), x's actor goes on
    elsewhere or on x's replacement."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    procs = [_spawn([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                     "127.0.0.1", "--port", address.rsplit(":", 1)[1], "--dashboard-address",
                     "127.0.0.1:0"], tmp_path / "scheduler.log")]
    for name in ("l", "x", "y"):
        procs.append(_spawn([sys.executable, "-m", "distributed.cli.dask_worker", address,
                             "--host", "127.0.0.1", "--nthreads", "1", "--name", name,
                             "--resources", "CPU=1", "--dashboard-address", "127.0.0.1:0"],
                            tmp_path / f"worker-{name}.log"))
    out, log = tmp_path / "run", tmp_path / "train.log"
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            names = {a: str(w["name"]) for a, w in scheduler_workers(client).items()}
            pids = {names[a]: pid for a, pid in client.run(os.getpid).items()}
        iterations = 24
        train = _spawn([sys.executable, "-m", "daskrl.cli", "train", "graphs/impala.py",
                        "--scheduler", address,
                        "--distribution", "impala:iterations_per_task=1,apart=true",
                        "--num-actors", "2", "--num-envs", "4", "--num-steps", "32",
                        "--env-step-cost", "0.0003", "--steps", str(iterations * 256),
                        "--out", str(out), "--no-progress", "--no-eval"], log)
        procs.append(train)
        deadline = time.monotonic() + 120
        while len(_rows(out / "metrics.csv")) < 4:
            assert train.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        killed_at = len(_rows(out / "metrics.csv"))
        os.kill(pids["x"], signal.SIGKILL)
        assert train.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        _stop(procs)
    text = log.read_text()
    assert "lost (" not in text, text[-3000:]  # the learner was never resubmitted
    rows = _rows(out / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, iterations + 1))
    assert {r["learner_worker"] for r in rows} == {"l"}
    assert killed_at < iterations  # the kill landed mid-run
    later = rows[killed_at + 1:]
    # x's actor kept landing batches, its envs rebuilt on y or on x's replacement
    def landed(rs: list[dict[str, str]], where: str = "@") -> set[str]:
        return {w.split("@")[0] for r in rs for w in r["rollout_workers"].split(";")
                if where in w}

    x_actor = landed(rows[:killed_at], "@x")
    assert x_actor, [r["rollout_workers"] for r in rows[:killed_at]]
    assert any(int(r["actors_built"]) for r in later), [r["rollout_workers"] for r in later]
    assert x_actor <= landed(later), [r["rollout_workers"] for r in later]
    assert all(len(r["policy_lags"].split()) == 2 for r in rows)
