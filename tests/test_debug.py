"""Debugging a run: one-process mode, failures saved and replayed, env retries, bad batches."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from daskrl import Algorithm
from daskrl.algos.actor_critic import ActorCriticLearner
from daskrl.core.failures import FragmentError, load_failure
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

REPO = Path(__file__).resolve().parent.parent
TINY = ["--num-actors", "2", "--num-envs", "4", "--num-steps", "32", "--no-progress"]

pytestmark = pytest.mark.timeout(300)

EXPLODING = textwrap.dedent('''

    import gymnasium as gym
    from pathlib import Path
    from dataclasses import replace

    MARKER = {marker!r}
    _ppo_build = build


    class Exploding(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            if self.steps == 10 and not (MARKER and Path(MARKER).exists()):
                if MARKER:
                    Path(MARKER).touch()
                raise RuntimeError("simulator crashed at step 10")
            return self.env.step(action)


    def exploding_actor(config, seed):
        if "Exploding-v0" not in gym.registry:
            gym.register("Exploding-v0", lambda **kw: Exploding(gym.make("CartPole-v1", **kw)))
        return VecEnvActor("Exploding-v0", config.num_envs, seed)


    def build(config):
        return replace(_ppo_build(config), make_actor=partial(exploding_actor, config))
''')


def _graph(tmp_path: Path, marker: str = "") -> Path:
    """graphs/ppo.py with an env that raises on its 10th step (only once, with ``marker``)."""
    path = tmp_path / "exploding.py"
    path.write_text((REPO / "graphs" / "ppo.py").read_text() + EXPLODING.format(marker=marker))
    return path


def _daskrl(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskrl.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=240)


def test_sync_scheduler_runs_in_one_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "daskrl.cli", "train",
                             str(REPO / "graphs" / "ppo.py"), "--scheduler", "sync", "--steps",
                             "2048", "--out", str(tmp_path / "run"), *TINY], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = 0
    watched = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            children = max(children, len(watched.children(recursive=True)))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert children == 0  # a Dask cluster would have started worker processes
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(sum(summary["placement"].values(), [])) == {"local"}
    assert "synchronous, in this process" in err


@pytest.mark.parametrize("where", ["sync", "cluster"])
def test_a_failed_fragment_is_saved_and_replays_its_exception(tmp_path, where):
    graph = _graph(tmp_path)
    extra = ["--scheduler", "sync"] if where == "sync" else ["--workers", "1"]
    run = _daskrl(["train", str(graph), "--steps", "4096", "--out", "run", "--env-retries",
                   "1", *extra, *TINY], tmp_path)
    assert run.returncode == 2, run.stderr
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("daskrl: error:")]
    assert len(errors) == 1 and "simulator crashed at step 10" in errors[0], run.stderr
    assert "retry 1 of 1" in run.stderr
    files = sorted((tmp_path / "run" / "failures").glob("*-it0-*.pkl"))  # rollout or learner
    assert len(files) == 1 and f"daskrl replay run/failures/{files[0].name}" in run.stderr
    record = load_failure(files[0])
    assert ", in step\n" in record["traceback"] and record["key"] == files[0].stem

    replayed = _daskrl(["replay", str(files[0])], tmp_path)
    assert replayed.returncode != 0
    assert "original traceback" in replayed.stderr
    last = replayed.stderr.strip().splitlines()[-1]
    assert last == "RuntimeError: simulator crashed at step 10", replayed.stderr


def test_replay_refuses_a_file_that_is_not_a_failure(tmp_path):
    bad = tmp_path / "x.pkl"
    bad.write_bytes(b"not a pickle")
    result = _daskrl(["replay", str(bad)], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("daskrl: error:") and "not a daskrl failure file" in (
        result.stderr)


def test_an_env_that_crashes_once_is_retried_on_rebuilt_envs(tmp_path):
    graph = _graph(tmp_path, marker=str(tmp_path / "crashed"))
    run = _daskrl(["train", str(graph), "--steps", "2048", "--out", "run", "--scheduler",
                   "sync", "--no-eval", *TINY], tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "crashed").exists() and "retry 1 of 2" in run.stderr
    assert not (tmp_path / "run" / "failures").exists()
    text = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = text[0].split(",")
    retries = [int(float(row.split(",")[header.index("env_retries")])) for row in text[1:]]
    assert retries[0] == 1 and sum(retries) == 1


class _WrongShapes:
    """An actor whose observation width depends on its seed: replicas disagree."""

    def __init__(self, seed: int) -> None:
        self.width = 4 if seed % 2 else 5

    def set_weights(self, weights, version) -> None:
        pass

    def rollout(self, num_steps: int) -> dict:
        n = num_steps
        return {"obs": np.zeros((n, self.width), np.float32), "actions": np.zeros(n, np.int64),
                "logp": np.zeros(n, np.float32), "values": np.zeros(n, np.float32),
                "advantages": np.zeros(n, np.float32), "returns": np.zeros(n, np.float32),
                "stats": {"env_steps": n, "episode_returns": [], "episode_lengths": [],
                          "t_start": 0.0, "t_end": 0.0}}


def test_replicas_with_different_observation_shapes_are_refused(tmp_path):
    widths = iter([4, 5])
    algo = Algorithm("shapes", make_actor=lambda seed: _WrongShapes(next(widths) - 4),
                     make_learner=lambda seed, device: ActorCriticLearner(4, 2, seed),
                     evaluate=lambda w, s: {}, num_steps=8, num_actors=2)
    settings = RunSettings(out=tmp_path, steps=16, progress=False, tensorboard=False,
                           eval=False)
    with pytest.raises(FragmentError, match="replicas disagree on 'obs'.*has \\(5,\\)"):
        train(SyncBackend(), algo, get_distribution("actors-learner:fuse=false"), settings)
    assert (tmp_path / "failures").is_dir()


def test_sigterm_stops_like_ctrl_c_with_a_checkpoint_and_no_workers_left(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "daskrl.cli", "train",
                             str(REPO / "graphs" / "ppo.py"), "--steps", "10000000", "--out",
                             "run", "--workers", "1", *TINY], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = tmp_path / "run" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) > 3):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
            err = proc.communicate()[1]
            pytest.fail(f"no 3 iterations in 120 s (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.1)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers  # the embedded cluster's processes
    proc.terminate()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "the last finished iteration is checkpointed" in err, err[-3000:]
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt-*.pt"))
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.pid for p in alive]


# --------------------------------------------------------------------------- one line each

INF_REWARD = textwrap.dedent('''

    import gymnasium as gym
    from dataclasses import replace


    class InfReward(gym.Wrapper):
        def step(self, action):
            obs, reward, term, trunc, info = self.env.step(action)
            return obs, float("inf"), term, trunc, info


    def inf_actor(config, seed):
        if "InfReward-v0" not in gym.registry:
            gym.register("InfReward-v0", lambda **kw: InfReward(gym.make("CartPole-v1", **kw)))
        return VecEnvActor("InfReward-v0", config.num_envs, seed)


    _ppo_build = build


    def build(config):
        return replace(_ppo_build(config), make_actor=partial(inf_actor, config))
''')


def test_a_nan_at_iteration_one_says_what_is_kept_without_numpy_warnings(tmp_path):
    graph = tmp_path / "inf_reward.py"
    graph.write_text((REPO / "graphs" / "ppo.py").read_text() + INF_REWARD)
    run = _daskrl(["train", str(graph), "--scheduler", "sync", "--steps", "2048", "--out", "run",
                   "--normalize", "on", *TINY], tmp_path)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("daskrl: error:")]
    assert len(errors) == 1 and "iteration 1: non-finite loss" in errors[0], run.stderr
    # no checkpoint exists: the line must not promise one
    assert "no iteration finished, so no checkpoint was written" in errors[0]
    assert "last good checkpoint" not in run.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert "RuntimeWarning" not in run.stderr, run.stderr  # numpy's noise on the way


BAD_SCRIPTS = {
    "syntax": ("from dataclasses import dataclass\n\n@dataclass\nclass Config:\n    x: int = 1\n"
               "\ndef build(config)\n    return None\n",
               r"daskrl: error: .*bad\.py:7: syntax error in the graph script: expected ':'$"),
    "build-raises": ("from dataclasses import dataclass\n\n@dataclass\nclass Config:\n"
                     "    env: str = 'Foo-v9'\n\ndef build(config):\n"
                     "    return {}[config.env]\n",
                     r"daskrl: error: .*bad\.py: build\(config\) raised KeyError: 'Foo-v9' "
                     r"\(at .*bad\.py:8 in build\)$"),
    "build-returns": ("from dataclasses import dataclass\n\n@dataclass\nclass Config:\n"
                      "    x: int = 1\n\ndef build(config):\n    return config\n",
                      r"daskrl: error: .*bad\.py: build\(config\) returned Config; expected a "
                      r"daskrl\.Algorithm$"),
    "field-type": ("from dataclasses import dataclass, field\n\nclass Device:\n    pass\n\n"
                   "@dataclass\nclass Config:\n    device: Device = field(default_factory=Device)"
                   "\n\ndef build(config):\n    return None\n",
                   r"daskrl: error: graph script .*bad\.py': Config field 'device' has type "
                   r"Device, which no command-line flag can hold; use bool, int, .*$"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCRIPTS))
def test_a_bad_graph_script_is_one_line(tmp_path, capsys, case):
    from daskrl.cli import main

    source, expected = BAD_SCRIPTS[case]
    (tmp_path / "bad.py").write_text(source)
    code = main(["train", str(tmp_path / "bad.py"), "--scheduler", "sync", "--steps", "64",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert re.match(expected, err), err


WRONG_ROLLOUT = textwrap.dedent('''

    from dataclasses import replace

    _ppo_build = build


    class ListActor(VecEnvActor):
        def rollout(self, steps):
            return list(super().rollout(steps).items())  # a list, not the batch dict


    def build(config):
        actor = partial(lambda config, seed: ListActor(config.env, config.num_envs, seed), config)
        return replace(_ppo_build(config), make_actor=actor)
''')


def test_a_fragment_returning_a_wrong_type_names_the_role_and_the_contract(tmp_path):
    graph = tmp_path / "wrong.py"
    graph.write_text((REPO / "graphs" / "ppo.py").read_text() + WRONG_ROLLOUT)
    # one actor: co-located replicas would be fused into one VecEnvActor
    run = _daskrl(["train", str(graph), "--scheduler", "sync", "--steps", "2048", "--out", "run",
                   *TINY, "--num-actors", "1"], tmp_path)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("daskrl: error:")]
    assert len(errors) == 1, run.stderr
    assert ("the rollout fragment: the actor's rollout(steps) returned list; expected a dict "
            "with 'stats'") in errors[0], errors[0]
    assert "Traceback" not in run.stderr, run.stderr
