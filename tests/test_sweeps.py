"""``daskrl sweep``: trials side by side on one cluster, spread over its workers; the
rliable report; a stop and a resume that lose no finished trial; Optuna's median pruner
stopping a poor trial; population-based training copying a better member's checkpoint;
identical per-seed results to single runs under ``--deterministic``; bad input refused in
one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import daskrl
from daskrl.cli import main
from daskrl.sweeps.sweep import sweep

pytest.importorskip("optuna")
pytest.importorskip("rliable")

REPO = Path(__file__).resolve().parent.parent
GRAPH = str(REPO / "graphs" / "ppo.py")
TINY = {"num_envs": 4, "num_steps": 32, "update_epochs": 2, "num_minibatches": 2,
        "eval_episodes": 2}

pytestmark = pytest.mark.timeout(420)


def _overlap(trials: dict) -> int:
    """The most trials that were training at one moment (from their start/end times)."""
    events = sorted([(r["started"], 1) for r in trials.values()]
                    + [(r["ended"], -1) for r in trials.values()])
    most = now = 0
    for _, delta in events:
        now += delta
        most = max(most, now)
    return most


def test_a_grid_of_seeds_trains_side_by_side_and_reports_iqm(cluster_pair, tmp_path, capsys):
    from scipy.stats import trim_mean

    out = tmp_path / "sweep"
    result = sweep(GRAPH, out=out, client=cluster_pair[2], seeds=4, concurrency=2,
                   grid={"learning_rate": [2.5e-4, 1e-3]}, steps=1024, progress=False,
                   **TINY)
    trials = result.trials
    assert len(trials) == 8 and {r["state"] for r in trials.values()} == {"finished"}
    for name in trials:  # each trial a run of its own, with the usual files
        assert {"metrics.csv", "summary.json", "checkpoints"} <= {
            p.name for p in (out / name).iterdir()}
    assert _overlap(trials) == 2  # side by side, never more than --concurrency
    rows = {r["configuration"]: r for r in result.report["configurations"]}
    assert set(rows) == {"learning_rate=0.00025", "learning_rate=0.001"}
    reps = os.environ["DASKRL_BOOTSTRAP_REPS"]  # tests/conftest.py
    assert result.report["interval"].endswith(f"(rliable), {reps} resamples")
    for group, row in rows.items():
        finals = [trials[n]["eval_return_mean"] for n in trials
                  if n.split("-", 1)[1].startswith(group)]
        assert sorted(row["final_returns"]) == sorted(finals) and len(finals) == 4
        assert row["iqm"] == pytest.approx(trim_mean(finals, 0.25))
        assert row["iqm_low"] <= row["iqm"] <= row["iqm_high"]
        assert row["task_compute_s"] > 0 and row["wall_s"] > 0
    assert "IQM [95 % CI]" in (out / "report.md").read_text()
    assert (out / "curves.png").stat().st_size > 0
    assert main(["sweep-status", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "8 trials: 8 finished" in printed and "t007-learning_rate=0.001-seed4" in printed


def test_runs_started_together_are_spread_over_the_workers(cluster_pair, tmp_path):
    """Two small runs from one process: the second prefers the worker the first leaves
    idle (every fragment of one small run fits on one worker)."""
    runs = [daskrl.train(GRAPH, client=cluster_pair[2], steps=2048, out=tmp_path / f"r{i}",
                         wait=False, progress=False, seed=i, **TINY) for i in (1, 2)]
    learners = {run.result().summary["placement"]["learner"][0] for run in runs}
    assert learners == {"w0", "w1"}


def test_identical_per_seed_results_to_single_runs_when_deterministic(cluster_pair, tmp_path):
    """Four trials at once under --deterministic: each is the same seed trained alone, bit
    for bit, on another cluster (trials start while others build their learners: nothing
    may draw from torch's generator between a learner's seed and its weights)."""
    result = sweep(GRAPH, out=tmp_path / "sweep", client=cluster_pair[2], seeds=4,
                   concurrency=4, steps=512, deterministic=True, progress=False, **TINY)
    assert _overlap(result.trials) >= 2
    swept = {rec["seed"]: json.loads((tmp_path / "sweep" / name / "summary.json").read_text())
             for name, rec in result.trials.items()}
    for seed in (1, 2, 3, 4):
        alone = daskrl.train(GRAPH, client=cluster_pair[1], steps=512, seed=seed,
                             deterministic=True, out=tmp_path / f"alone{seed}",
                             progress=False, evaluate=False, **TINY)
        assert swept[seed]["weights_sha256"] == alone.summary["weights_sha256"], seed
    assert len({s["weights_sha256"] for s in swept.values()}) == 4  # seeds differ


def test_a_stopped_sweep_resumes_and_keeps_its_finished_trials(tmp_path, cluster_python):
    out = tmp_path / "sweep"
    command = [cluster_python, "-m", "daskrl", "sweep", GRAPH, "--seeds", "3",
               "--concurrency", "1", "--workers", "1", "--steps", "6000", "--out", str(out),
               "--no-progress", "--checkpoint-every", "2",
               *[w for k, v in TINY.items() for w in (f"--{k.replace('_', '-')}", str(v))]]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the first finished, the second under way
            time.sleep(0.3)
            try:
                trials = json.loads((out / "sweep.json").read_text())["trials"]
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            second = out / "t001-seed2" / "checkpoints"
            if (trials.get("t000-seed1", {}).get("state") == "finished"
                    and len(list(second.glob("ckpt-*.pt"))) >= 1):
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "--resume` goes on" in err
    trials = json.loads((out / "sweep.json").read_text())["trials"]
    assert trials["t000-seed1"]["state"] == "finished"
    assert trials["t001-seed2"]["state"] == "stopped"
    kept = (out / "t000-seed1" / "summary.json").read_bytes()
    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = json.loads((out / "sweep.json").read_text())["trials"]
    assert {r["state"] for r in trials.values()} == {"finished"}
    assert (out / "t000-seed1" / "summary.json").read_bytes() == kept  # not trained again
    rows = (out / "t001-seed2" / "metrics.csv").read_text().splitlines()[1:]
    iterations = [int(r.split(",")[0]) for r in rows if r.split(",")[0]]
    assert iterations == list(range(1, len(iterations) + 1))  # went on, no gap, no repeat
    assert json.loads((out / "t001-seed2" / "summary.json").read_text())["env_steps"] >= 6000


def test_evaluations_of_fused_iterations_are_pruned_at_the_step_they_were_due(tmp_path):
    """A trial whose tasks each ran two iterations is evaluated at 11, 21 where the first
    trial was at 10, 20: reported at the step each was due, the pruner compares them."""
    from daskrl.sweeps.search import eval_step, open_study

    study = open_study(tmp_path, "random", "median", seed=0, startup=1)
    first = study.ask()
    for iteration in (10, 20):
        first.report(500.0, step=eval_step(iteration, 10))
    study.tell(first, 500.0)
    second = study.ask()
    for iteration in (11, 21):
        second.report(8.4, step=eval_step(iteration, 10))
    assert second.should_prune()


def test_the_median_pruner_stops_a_trial_below_the_earlier_ones(cluster_pair, tmp_path):
    """Optuna tries a learning rate that learns, then one that cannot (1e-7): the second's
    evaluations fall below the first's at the same iterations and it is pruned early."""
    out = tmp_path / "search"
    result = sweep(GRAPH, out=out, client=cluster_pair[2], search="optuna", trials=2,
                   space=["learning_rate=1e-7,3e-3"], enqueue=[{"learning_rate": 3e-3},
                                                              {"learning_rate": 1e-7}],
                   concurrency=1, steps=12_800, eval_every=10, progress=False,
                   **{**TINY, "num_steps": 64, "eval_episodes": 5, "env_step_sleep": 0.002})
    states = {r["config"]["learning_rate"]: r for r in result.trials.values()}
    assert states[3e-3]["state"] == "finished"
    assert states[1e-7]["state"] == "pruned", states[1e-7]
    assert states[1e-7]["env_steps"] < 12_800
    import optuna

    study = optuna.load_study(study_name="daskrl-sweep", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal"))))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    assert json.loads((out / "sweep.json").read_text())["best"]["config"] == {
        "learning_rate": 3e-3}


def test_pbt_copies_a_better_members_checkpoint_and_perturbs_its_settings(cluster_pair,
                                                                           tmp_path):
    out = tmp_path / "pbt"
    result = sweep(GRAPH, out=out, client=cluster_pair[2], pbt=True, population=2,
                   quantile=0.5, interval=4, space=["learning_rate=1e-6:1e-2:log"],
                   steps=1024, checkpoint_every=1000, progress=False, **TINY)
    sweep_json = json.loads((out / "sweep.json").read_text())
    lineage = sweep_json["lineage"]
    assert sweep_json["round"] == 2 and len(lineage) == 1  # 8 iterations, one copy at 4
    copy = lineage[0]
    assert copy["iteration"] == 4 and copy["member_return"] <= copy["donor_return"]
    member, donor = out / copy["member"], out / copy["copied"]
    # the member went on from the donor's checkpoint: the same bytes at iteration 4
    assert ((member / "checkpoints" / "ckpt-00000004.pt").read_bytes()
            == (donor / "checkpoints" / "ckpt-00000004.pt").read_bytes())
    donor_lr = result.trials[copy["copied"]]["initial_config"]["learning_rate"]
    ratio = copy["after"]["learning_rate"] / donor_lr
    assert ratio == pytest.approx(0.8) or ratio == pytest.approx(1.2)
    assert result.trials[copy["member"]]["config"] == copy["after"]
    assert {r["state"] for r in result.trials.values()} == {"finished"}
    assert (out / "lineage.png").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["--grid", "lr=1e-3,1e-4"], "Config has no field 'lr'"),
    (["--pbt", "--space", "hidden=32,64"], "--pbt cannot change 'hidden' mid-run"),
    (["--search", "optuna"], "search needs a space"),
    (["--grid", "learning_rate=1e-3", "--pbt", "--space", "learning_rate=1e-4:1e-3"],
     "choose one of grid, search and pbt"),
    (["--seeds", "0"], "seeds must be >= 1"),
    (["--space", "learning_rate=1e-4:1e-3"], "space is what search or pbt draws from"),
    (["--start", "learning_rate=1e-4"], "add pbt=True"),
])
def test_bad_sweeps_are_refused_in_one_line_before_anything_trains(argv, message, tmp_path,
                                                                   capsys):
    assert main(["sweep", GRAPH, "--out", str(tmp_path / "s"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "s").exists()


def test_a_bad_bootstrap_count_is_refused_before_anything_trains(tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("DASKRL_BOOTSTRAP_REPS", "many")
    assert main(["sweep", GRAPH, "--out", str(tmp_path / "s"), "--cluster", "local"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("daskrl: error: DASKRL_BOOTSTRAP_REPS='many': give a whole number of "
                   "bootstrap resamples, at least 100"), err
    assert not (tmp_path / "s").exists()


def test_a_sweep_folder_is_not_overwritten_without_resume(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    assert main(["sweep", GRAPH, "--out", str(tmp_path / "s")]) == 2
    assert "pass --resume to continue it, or choose another --out" in capsys.readouterr().err
    assert (tmp_path / "s" / "notes.txt").read_text() == "mine"


def test_pbt_perturbation_stays_in_its_range():
    from daskrl.sweeps.pbt import explore
    from daskrl.sweeps.spec import Dimension

    dim = Dimension("learning_rate", low=1e-4, high=1e-3, log=True)
    rng = np.random.default_rng(0)
    values = {round(explore({"learning_rate": 1e-3}, [dim], rng)["learning_rate"], 9)
              for _ in range(50)}
    assert values == {8e-4, 1e-3}  # x1.2 is held at the top of the range


def test_a_trial_whose_settings_are_refused_fails_alone(cluster_pair, tmp_path):
    result = sweep(GRAPH, out=tmp_path / "s", client=cluster_pair[2],
                   grid={"num_envs": [0, 4]}, steps=512, progress=False,
                   **{k: v for k, v in TINY.items() if k != "num_envs"})
    bad, good = (result.trials[n] for n in sorted(result.trials))
    assert bad["state"] == "failed" and "num_envs must be an int >= 1" in bad["error"]
    assert good["state"] == "finished"
    rows = {r["configuration"]: r for r in result.report["configurations"]}
    assert rows["num_envs=0"]["finished"] == 0 and rows["num_envs=4"]["finished"] == 1


def test_a_sweep_on_batch_jobs_keeps_their_logs_beside_its_trials(tmp_path, capsys):
    """``--cluster local`` (dask-jobqueue's LocalCluster of jobs): the jobs' logs go to
    OUT/jobs, which does not count as an earlier sweep in OUT."""
    out = tmp_path / "sweep"
    code = main(["sweep", GRAPH, "--cluster", "local", "--cpu-jobs", "1", "--seeds", "1",
                 "--steps", "512", "--out", str(out), "--no-progress",
                 *[w for k, v in TINY.items() for w in (f"--{k.replace('_', '-')}", str(v))]])
    assert code == 0, capsys.readouterr().err
    assert (out / "jobs").is_dir()
    assert json.loads((out / "sweep.json").read_text())["trials"]["t000-seed1"]["state"] == (
        "finished")
