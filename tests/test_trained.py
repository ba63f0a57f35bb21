"""A finished run's policy as a product: ``daskrl eval``, ``daskrl export`` (loaded by plain
torch, without daskrl), ``daskrl.load_policy``, on a short real PPO run on CartPole."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import daskrl
from daskrl.algos.networks import DiscreteActorCritic
from daskrl.core.algorithm import EvalRequest
from daskrl.trained.evaluate import evaluate_run
from daskrl.trained.load import load_run

REPO = Path(__file__).resolve().parent.parent
GRAPH = str(REPO / "graphs" / "ppo.py")

pytestmark = pytest.mark.timeout(300)


def start_cli(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "daskrl.cli", *args], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish_cli(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()  # no-op once it has exited
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def daskrl_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return finish_cli(start_cli(args, cwd))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 2,048-step PPO run on CartPole, in this process's scheduler (no cluster to start)."""
    cwd = tmp_path_factory.mktemp("trained")
    result = daskrl_cli(["train", GRAPH, "--steps", "2048", "--scheduler", "sync", "--out",
                         "run", "--no-progress", "--num-envs", "4", "--checkpoint-every", "1"],
                        cwd)
    assert result.returncode == 0, result.stderr
    return cwd / "run"


def observations(n: int = 1000) -> np.ndarray:
    """CartPole observations: half from random-action episodes, half spread wider."""
    import gymnasium as gym

    env, rng, rows = gym.make("CartPole-v1"), np.random.default_rng(0), []
    obs, _ = env.reset(seed=0)
    while len(rows) < n // 2:
        rows.append(obs)
        obs, _, term, trunc, _ = env.step(int(rng.integers(2)))
        if term or trunc:
            obs, _ = env.reset()
    wide = rng.normal(0, [1.0, 2.0, 0.2, 2.0], size=(n - len(rows), 4))
    return np.concatenate([np.stack(rows), wide]).astype(np.float32)


def training_actions(run_dir: Path, obs: np.ndarray) -> np.ndarray:
    """Greedy actions of the trained actor network (the argmax of its logits)."""
    ckpt = torch.load(load_run(run_dir).checkpoint, weights_only=True)
    net = DiscreteActorCritic(4, 2, (64, 64))
    net.load_state_dict(ckpt["learner"]["model"])
    with torch.no_grad():  # the tower itself: acting's stacked copy may round another way
        return net.actor(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()


def test_eval_prints_mean_and_std_of_return_and_length(trained):
    result = daskrl_cli(["eval", str(trained), "--episodes", "4", "--seed", "3"], trained.parent)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[0]
    assert line.startswith("CartPole-v1, 4 episodes: return ") and " ± " in line, line
    expected = evaluate_run(load_run(trained), EvalRequest(episodes=4, seed=3))
    # CartPole pays 1 per step: return and length agree, and a greedy policy is repeatable
    assert expected["eval_return_mean"] == expected["eval_length_mean"] >= 9
    assert f"return {expected['eval_return_mean']:.4g} ± {expected['eval_return_std']:.3g}" \
        in line


def test_sampled_eval_is_seeded_and_differs_from_greedy(trained):
    run = load_run(trained)
    sampled = [evaluate_run(run, EvalRequest(episodes=3, seed=5, deterministic=False))
               for _ in range(2)]
    assert sampled[0] == sampled[1]
    greedy = evaluate_run(run, EvalRequest(episodes=3, seed=5))
    assert greedy["eval_return_std"] != sampled[0]["eval_return_std"] or (
        greedy["eval_return_mean"] != sampled[0]["eval_return_mean"])


def test_exported_policy_runs_in_plain_torch_and_matches_training(trained, tmp_path):
    out = tmp_path / "policy.pt2"
    result = daskrl_cli(["export", str(trained), "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    obs = observations()
    np.save(tmp_path / "obs.npy", obs)
    script = (
        "import importlib.util, sys\n"
        "sys.path = [p for p in sys.path if 'work/main' not in p and p not in ('', '.')]\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "assert importlib.util.find_spec('daskrl') is None, 'daskrl is importable'\n"
        "import numpy, torch\n"
        "pi = torch.export.load('policy.pt2').module()\n"
        "numpy.save('exported.npy', pi(torch.from_numpy(numpy.load('obs.npy'))).numpy())\n"
    )
    plain = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, text=True,
                           capture_output=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert plain.returncode == 0, plain.stderr
    exported = np.load(tmp_path / "exported.npy")
    expected = training_actions(trained, obs)
    assert exported.shape == (1000,) and (exported == expected).all()
    assert 0.05 < expected.mean() < 0.95  # both actions occur: the comparison means something


def test_load_policy_maps_one_observation_or_a_batch_to_actions(trained):
    obs = observations(200)
    pi = daskrl.load_policy(trained)
    batch = pi(obs)
    assert batch.dtype == np.int64 and (batch == training_actions(trained, obs)).all()
    assert pi(obs[7].tolist()).shape == () and pi(obs[7]) == batch[7]


def test_eval_refuses_what_it_cannot_do_in_one_line(trained, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    # an algorithm without make_policy: the same PPO, its policy removed
    graph = tmp_path / "nopolicy.py"
    graph.write_text(
        "import dataclasses\n"
        "from daskrl.core.script import load_graph\n"
        f"_ppo = load_graph({GRAPH!r})\n"
        "Config = _ppo.Config\n"
        "def build(config):\n"
        "    return dataclasses.replace(_ppo.build(config), make_policy=None)\n")
    nopolicy = tmp_path / "nopolicy"
    (nopolicy / "checkpoints").mkdir(parents=True)
    ckpt = torch.load(load_run(trained).checkpoint, weights_only=True)
    ckpt["meta"] = {**ckpt["meta"], "graph": str(graph), "graph_file": str(graph)}
    torch.save(ckpt, nopolicy / "checkpoints" / "ckpt-00000001.pt")
    cases = {
        "no/such/run": ("eval", "no/such/run"),
        "no checkpoints/ckpt-*.pt": ("eval", str(empty)),
        "best.pt not found": ("eval", str(trained), "--best"),
        "nothere.pt not found": ("eval", str(trained), "--checkpoint", "nothere.pt"),
        "has no make_policy": ("export", str(nopolicy), "--out", str(tmp_path / "p.pt2")),
        "observations of shape (6,)": ("eval", str(trained), "--env", "Acrobot-v1"),
        "a .pt2 file": ("export", str(trained), "--out", str(tmp_path / "p.pt")),
    }
    # all at once: each is a process that imports torch and refuses (the cores take turns)
    procs = {expected: start_cli(list(args), tmp_path) for expected, args in cases.items()}
    try:
        results = {expected: finish_cli(proc) for expected, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()  # nothing once it has exited
    for expected, result in results.items():
        lines = [ln for ln in result.stderr.splitlines() if ln.startswith("daskrl: error:")]
        assert result.returncode == 2 and len(lines) == 1, (cases[expected], result.stderr)
        assert expected in lines[0] and "Traceback" not in result.stderr, lines[0]


def test_named_checkpoint_is_the_one_loaded(trained):
    newest = load_run(trained)
    older = load_run(trained, "ckpt-00000002.pt")
    assert newest.iteration == 4 and older.iteration == 2
    assert older.checkpoint == trained / "checkpoints" / "ckpt-00000002.pt"
    assert any(not torch.equal(older.weights[k], newest.weights[k]) for k in newest.weights)
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["config"]["num_envs"] == 4
    assert newest.algo.num_envs == 4  # the saved config rebuilt the run's algorithm


def test_video_records_every_episode_to_mp4(trained, tmp_path):
    pytest.importorskip("moviepy")
    result = daskrl_cli(["eval", str(trained), "--episodes", "2", "--video",
                         str(tmp_path / "videos")], tmp_path)
    assert result.returncode == 0, result.stderr
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos), videos
    assert "videos: " in result.stdout


def test_the_run_config_is_written_as_yaml_that_train_reads_back(trained):
    from daskrl.run_flags import parse_command_line

    path = trained / "config.yaml"
    assert path.is_file() and "num_envs: 4" in path.read_text()
    _, _, config = parse_command_line(["train", GRAPH, "--config", str(path)])
    summary = json.loads((trained / "summary.json").read_text())
    assert json.loads(json.dumps(dataclasses.asdict(config))) == summary["config"]


def test_a_multi_agent_run_is_evaluated_by_its_own_evaluator(tmp_path):
    import mpe2  # noqa: F401 - the reference envs (test extra): missing is a failure
    result = daskrl_cli(["train", str(REPO / "graphs" / "mappo.py"), "--steps", "3000",
                         "--scheduler", "sync", "--out", "run", "--no-progress", "--no-eval"],
                        tmp_path)
    assert result.returncode == 0, result.stderr
    result = daskrl_cli(["eval", "run", "--episodes", "4", "--opponent", "random"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("mappo, 4 episodes: return ")  # the evaluator's headline
    assert any(ln.startswith("  eval_vs_random_return_mean/") for ln in lines), lines
    export = daskrl_cli(["export", "run", "--out", "p.pt2"], tmp_path)
    assert export.returncode == 2 and "export supports single-agent" in export.stderr


def test_a_run_recorded_in_mlflow_has_its_config_metrics_and_files(trained, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from daskrl.trained.track import log_run_mlflow

    uri = (tmp_path / "mlruns").as_uri()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    run_id = log_run_mlflow(trained, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params["config.num_envs"] == "4" and run.info.status == "FINISHED"
    history = client.get_metric_history(run_id, "losses/policy_loss")
    rows = [r for r in csv.DictReader((trained / "metrics.csv").open()) if r["iteration"]]
    assert [m.step for m in history] == [int(r["env_steps"]) for r in rows]
    assert {"summary.json", "config.yaml", "metrics.csv"} <= {
        a.path for a in client.list_artifacts(run_id)}
