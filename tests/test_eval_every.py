"""Periodic evaluation (``--eval-every N``): its own task of the evaluate role, rows in
metrics.csv, and the best-scoring weights kept as ``checkpoints/best.pt``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

pytestmark = pytest.mark.timeout(120)


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _settings(out: Path, algo, iterations: int, **kwargs) -> RunSettings:
    return RunSettings(out=out, steps=iterations * algo.steps_per_iteration, seed=5,
                       progress=False, eval=False, tensorboard=False, task_s=0,
                       checkpoint_every=3, eval_every=2, **kwargs)


def _check(out: Path, iterations: int) -> list[dict[str, str]]:
    rows = _rows(out)
    # one row per iteration; evaluations that finished after the last one get a row of their
    # own, with no iteration
    assert [r["iteration"] for r in rows if r["iteration"]] == [
        str(i) for i in range(1, iterations + 1)]
    evals = [r for r in rows if r["eval_iteration"]]
    assert [int(r["eval_iteration"]) for r in evals] == list(range(2, iterations + 1, 2))
    for r in evals:
        assert 1 <= float(r["eval_return_mean"]) <= 500 and float(r["eval_return_std"]) >= 0
        if r["iteration"]:  # an evaluation is recorded after the weights it evaluated
            assert int(r["iteration"]) > int(r["eval_iteration"])
    best = torch.load(out / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)
    top = max(evals, key=lambda r: float(r["eval_return_mean"]))
    assert best["eval"]["iteration"] == int(top["eval_iteration"])  # first of equals kept
    assert best["eval"]["eval_return_mean"] == pytest.approx(float(top["eval_return_mean"]),
                                                             rel=1e-5)
    assert best["iteration"] == best["version"] == best["eval"]["iteration"]
    assert {"learner", "actors", "counters", "meta"} <= set(best)
    assert "model" in best["learner"]
    # best.pt stands beside the newest checkpoints and is not pruned with them
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1] == (
        f"ckpt-{iterations:08d}.pt")
    return rows


def test_eval_every_writes_rows_and_keeps_the_best(cluster_tiny_ppo, tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    train(SyncBackend(), algo, get_distribution("actors-learner"), _settings(tmp_path, algo, 6))
    rows = _check(tmp_path, 6)
    # the weights kept are those of the evaluated iteration, not the last one's
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    last = torch.load(tmp_path / "checkpoints" / "ckpt-00000006.pt", weights_only=True)
    if best["iteration"] != 6:
        assert any(not torch.equal(best["learner"]["model"][k], v)
                   for k, v in last["learner"]["model"].items())
    assert len(rows) >= 6


def test_eval_runs_in_its_own_task_on_the_evaluate_worker(cluster_gpu_client,
                                                          cluster_tiny_ppo, tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    backend = DaskBackend(cluster_gpu_client)
    summary = train(backend, algo, get_distribution("actors-learner"),
                    _settings(tmp_path, algo, 4))
    _check(tmp_path, 4)
    stream = cluster_gpu_client.get_task_stream(start=0)
    ran = {str(r["key"]).split("-")[0] for r in stream if "-it" in str(r["key"])}
    assert "evaluate" in ran  # a task of its own, not part of the learner's
    assert summary["iterations"] == 4


def test_summary_names_the_best_evaluation_and_a_final_policy_that_forgot(
        cluster_tiny_ppo, tmp_path, capsys):
    from daskrl.runtime.evaluations import PeriodicEvals

    algo = cluster_tiny_ppo(num_actors=1)
    settings = RunSettings(out=tmp_path, steps=4 * algo.steps_per_iteration, seed=5,
                           progress=False, eval=True, tensorboard=False, task_s=0,
                           checkpoint_every=3, eval_every=2)
    summary = train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)["eval"]
    assert summary["best_eval_return_mean"] == pytest.approx(best["eval_return_mean"])
    assert summary["best_eval_iteration"] == best["iteration"] in (2, 4)
    # a final policy worse than best.pt's is said in one line naming the file to use
    evals = PeriodicEvals.__new__(PeriodicEvals)
    evals.settings, evals.best = settings, {"eval_return_mean": 480.0, "iteration": 30}
    capsys.readouterr()
    assert evals.forgetting(480.0) == {"best_eval_return_mean": 480.0,
                                       "best_eval_iteration": 30}
    assert capsys.readouterr().err == ""
    evals.forgetting(21.7)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"daskrl: the final policy evaluates at 21.7, below the best periodic "
                   f"evaluation (480 at iteration 30): the run forgot what it had learned; "
                   f"{tmp_path}/checkpoints/best.pt keeps that policy (daskrl eval {tmp_path} "
                   "--best)"]
    evals.best = None
    assert evals.forgetting(21.7) == {}


def test_evaluations_are_recorded_while_the_run_trains(cluster_gpu_client, cluster_tiny_ppo,
                                                       tmp_path):
    """A finished evaluation goes into the next iteration's row, not all of them at the
    end: a pruner (``daskrl sweep --search``) and the dashboard read them mid-run."""
    algo = cluster_tiny_ppo(num_actors=1, env_step_sleep=0.004)  # ~0.13 s per iteration
    train(DaskBackend(cluster_gpu_client), algo, get_distribution("actors-learner"),
          _settings(tmp_path, algo, 24))
    evals = [r for r in _rows(tmp_path) if r["eval_iteration"]]
    during = [r for r in evals if r["iteration"] and int(r["iteration"]) < 24]
    assert len(evals) == 12 and len(during) >= 6, [
        (r["iteration"], r["eval_iteration"]) for r in evals]
