"""The ``daskrl`` command line as users run it: a short training run, --resume, and bad input.

Bad input must stop with a non-zero exit and exactly one ``daskrl: error:`` line on stderr,
quickly. Those commands run concurrently (most never start a cluster) to keep this fast.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs import block_named

from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

REPO = Path(__file__).resolve().parent.parent
GRAPH = str(REPO / "graphs" / "ppo.py")

pytestmark = pytest.mark.timeout(300)


def daskrl_command() -> list[str]:
    """The ``daskrl`` console script of this environment (else ``python -m daskrl.cli``)."""
    script = Path(sys.executable).with_name("daskrl")
    if script.exists():
        return [str(script)]
    found = shutil.which("daskrl")
    return [found] if found else [sys.executable, "-m", "daskrl.cli"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("daskrl: error:")]


def start(args: list[str], cwd: Path) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*daskrl_command(), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, time.monotonic()


def finish(proc: subprocess.Popen, t0: float, timeout: float = 240) -> Result:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"`daskrl {' '.join(proc.args[1:])}` did not finish in {timeout} s\n{err}")
    return Result(proc.returncode, out, err, time.monotonic() - t0)


def daskrl(args: list[str], cwd: Path, timeout: float = 240) -> Result:
    return finish(*start(args, cwd), timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- a short run


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    result = daskrl(["train", GRAPH, "--steps", "4000", "--out", "tmp", "--no-progress",
                     "--num-envs", "4"], cwd)
    return cwd / "tmp", result


def test_short_run_writes_metrics_summary_and_checkpoints(short_run):
    out, result = short_run
    assert result.returncode == 0, result.stderr
    assert "daskrl: error" not in result.stderr and "Traceback" not in result.stderr
    assert "eval_return_mean=" in result.stdout and "env_steps_per_s=" in result.stdout
    rows = read_csv(out / "metrics.csv")
    per_iteration = 4 * 128  # --num-envs 4, default --num-steps 128 and one actor
    assert len(rows) == math.ceil(4000 / per_iteration) == 8
    assert list(rows[0])[:4] == ["iteration", "env_steps", "wall_s", "episode_return_mean"]
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9))
    steps = [int(r["env_steps"]) for r in rows]
    # cumulative, and at least the iterations' steps (envs step on past auto-resets)
    assert steps == sorted(steps) and 8 * per_iteration <= steps[-1] < 1.1 * 8 * per_iteration
    summary = json.loads((out / "summary.json").read_text())
    for key in ("graph", "distribution", "env_steps", "iterations", "wall_s",
                "env_steps_per_s", "eval_return_mean"):
        assert key in summary, key
    assert summary["distribution"] == "actors-learner" and summary["iterations"] == 8
    assert summary["env_steps"] == steps[-1]
    assert summary["env_steps_per_s"] > 0 and summary["wall_s"] > 0
    assert 1 <= summary["eval_return_mean"] <= 500
    assert summary["config"]["num_envs"] == 4
    ckpt = load_latest(out / "checkpoints")
    assert ckpt["iteration"] == 8 and ckpt["counters"]["env_steps"] == steps[-1]


def test_resume_continues_the_short_run(short_run):
    out, first = short_run
    assert first.returncode == 0, first.stderr
    before = read_csv(out / "metrics.csv")
    result = daskrl(["train", GRAPH, "--steps", "5000", "--out", str(out), "--no-progress",
                     "--num-envs", "4", "--resume", "--no-eval"], out.parent)
    assert result.returncode == 0, result.stderr
    rows = read_csv(out / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, 11))
    assert rows[:8] == before
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[7] == int(before[-1]["env_steps"])
    assert load_latest(out / "checkpoints")["iteration"] == 10


def test_resuming_a_finished_run_says_it_is_complete(short_run):
    out, first = short_run
    assert first.returncode == 0, first.stderr
    before = (out / "metrics.csv").read_text(), (out / "summary.json").read_text()
    result = daskrl(["train", GRAPH, "--steps", "4000", "--out", str(out), "--no-progress",
                     "--num-envs", "4", "--resume", "--scheduler", "sync"], out.parent)
    assert result.returncode == 0, result.stderr
    assert f"daskrl: {out} is already complete" in result.stderr, result.stderr
    assert "pass a larger --steps" in result.stderr and result.stdout == ""
    assert ((out / "metrics.csv").read_text(), (out / "summary.json").read_text()) == before


def test_help_shows_the_defaults_of_steps_and_seed(tmp_path):
    result = daskrl(["train", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "whole iterations (default: 500000)" in text and "evaluation (default: 1)" in text


def test_a_run_takes_at_least_the_steps_asked_for(cluster_tiny_ppo, tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    steps = 3 * algo.steps_per_iteration
    settings = RunSettings(out=tmp_path, steps=steps, progress=False, eval=False,
                           tensorboard=False)
    summary = train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    assert summary["env_steps"] >= steps


# --------------------------------------------------------------------------- bad input

BAD = {
    "unknown env": (["--env", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
    "unknown distribution": (["--distribution", "bogus"], "unknown distribution 'bogus'"),
    "malformed resources": (["--resources", "learner"], "malformed --resources 'learner'"),
    "resource nobody offers": (["--resources", "learner=TPU:1"],
                               "fragment 'learner' needs TPU:1, which no worker offers"),
    "unreachable scheduler": (["--scheduler", "tcp://127.0.0.1:{port}"],
                              "cannot reach the Dask scheduler at 'tcp://127.0.0.1:{port}'"),
    "resume without checkpoints": (["--resume"], "--resume: no checkpoints under"),
    "missing graph": (None, "graph script 'no_such_graph.py' not found"),
    "zero workers": (["--workers", "0"], "--workers must be >= 1"),
    "zero checkpoint interval": (["--checkpoint-every", "0"], "--checkpoint-every"),
    "negative replan wait": (["--replan-timeout", "-1"],
                             "--replan-timeout must be a finite number of seconds >= 0"),
    "bad graph flag value": (["--num-envs", "many"],
                             "--num-envs: invalid literal for int() with base 10: 'many'; "
                             "expected --num-envs INT"),
    "abbreviated graph flag": (["--num-env", "4"],
                               "unrecognized flag --num-env; did you mean --num-envs?"),
    "steps not a number": (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    "out is a file": (["--out", GRAPH], f"--out {GRAPH}: {GRAPH} is a file, not a folder"),
    "out under a file": (["--out", f"{GRAPH}/run"], f"{GRAPH} is a file, not a folder"),
    "report without a scheduler": (["--scheduler", "sync", "--report", "r.html"],
                                   "--scheduler sync runs without one"),
}
XFAIL: dict[str, str] = {}
REFUSED_BEFORE_ANY_CLUSTER = {"unknown distribution", "malformed resources", "zero workers",
                              "zero checkpoint interval", "negative replan wait",
                              "bad graph flag value", "abbreviated graph flag",
                              "steps not a number"}
"""Cases whose check does not depend on the scheduler: they run with ``--scheduler sync``,
so that only the others (unknown env, a resource nobody offers, resume without checkpoints)
pay for the embedded cluster that ``daskrl train`` starts before it reads the graph, and
show that it is stopped after the error."""


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory) -> dict[str, tuple[Result, str]]:
    """Every bad command's result and expected message; three run at a time, each timed
    from its own start to its own exit."""
    cwd = tmp_path_factory.mktemp("bad")
    port = free_port()
    queue = []
    for name, (flags, message) in BAD.items():
        if flags is None:
            args = ["train", "no_such_graph.py", "--steps", "100"]
        else:
            args = ["train", GRAPH, "--steps", "600", "--num-envs", "2", "--num-steps", "64",
                    "--no-progress", "--no-eval", "--out", str(cwd / name.replace(" ", "_")),
                    *[f.format(port=port) for f in flags]]
            if name in REFUSED_BEFORE_ANY_CLUSTER:
                args += ["--scheduler", "sync"]
        queue.append((name, args, message.format(port=port)))
    running: dict[str, tuple[subprocess.Popen, float, str]] = {}
    results: dict[str, tuple[Result, str]] = {}
    deadline = time.monotonic() + 600
    while queue or running:
        while queue and len(running) < 3:
            name, args, message = queue.pop(0)
            running[name] = (*start(args, cwd), message)
        for name, (proc, t0, message) in list(running.items()):
            if proc.poll() is not None or time.monotonic() > deadline:
                # the process has exited; its pipes close when the worker fork server
                # it started (which inherited them) sees it gone, after its imports
                results[name] = (finish(proc, t0, timeout=30), message)
                del running[name]
        time.sleep(0.05)
    return results


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=XFAIL[n], raises=AssertionError, strict=True))
    if n in XFAIL else n for n in BAD])
def test_bad_input_stops_with_one_clear_error_line(bad_runs, name):
    result, message = bad_runs[name]
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.error_lines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]
    assert result.stderr.rstrip().splitlines()[-1] == lines[0]  # the last word is the error
    assert result.stdout == ""
    limit = 75 if name == "unreachable scheduler" else 60  # 10 s connect timeout + start-up
    assert result.seconds < limit, result.seconds


def test_train_starts_its_cluster_while_importing_and_grows_it(tmp_path):
    """``daskrl train`` on the embedded cluster starts worker w0 before the graph script is
    imported; taking it adds the other workers, and an untaken start is stopped."""
    from distributed import Client

    from daskrl.cli import _early_cluster
    from daskrl.cluster.local import ClusterStart

    graph = str(Path(__file__).resolve().parents[1] / "graphs" / "ppo.py")
    assert _early_cluster(["train", graph, "--scheduler", "sync"]) is None
    assert _early_cluster(["train", graph, "--cluster=local"]) is None
    assert _early_cluster(["train", graph, "-h"]) is None
    assert _early_cluster(["graph", graph]) is None
    assert _early_cluster(["train", graph, "--out", graph]) is None  # a file: refused first
    assert _early_cluster(["train", graph, f"--out={graph}/run"]) is None

    start = _early_cluster(["train", "--steps", "10", graph, "--num-envs", "2"])  # graph 3rd
    assert isinstance(start, ClusterStart)
    cluster, client = start.take(workers=2)
    try:
        info = scheduler_workers(client).values()
        assert sorted((w["name"], w["resources"]["CPU"]) for w in info) == [("w0", 1), ("w1", 1)]
        # w0 imports torch before any task of the run asks for it
        w0 = next(a for a, w in scheduler_workers(client).items()
                  if w["name"] == "w0")
        first = client.submit(lambda: "torch" in sys.modules, pure=False, workers=[w0])
        assert first.result(timeout=60) is True
        # forked from the fork server, workers still get what the nanny gives spawned ones
        assert start.method == "forkserver"

        def setup(dask_worker) -> tuple:
            import gc

            import torch

            return (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"),
                    os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.getppid() != driver,
                    "profile" in dask_worker.periodic_callbacks,
                    gc.isenabled() and gc.get_freeze_count() > 100_000)

        driver = os.getpid()
        trim = str(128 * 2**20)
        # ... and the server's imports are frozen out of the collector's passes
        assert list(client.run(setup).values()) == [(1, "1", trim, True, False, True)] * 2
        start.close()  # taken: left to its new owner
        assert client.submit(lambda: 2, pure=False).result(timeout=30) == 2
    finally:
        client.close()
        cluster.close()

    untaken = ClusterStart()
    untaken.close()
    assert untaken.cluster is not None and untaken.cluster.status.name == "closed"
    with pytest.raises(OSError):
        Client(untaken.cluster.scheduler_address, timeout=2)


def test_the_documented_graph_runs_as_written_and_its_policy_evaluates(tmp_path):
    (tmp_path / "my_graph.py").write_text(block_named("howto/own-graph.md", "my-graph"))
    result = daskrl(["train", "my_graph.py", "--steps", "256", "--num-envs", "2",
                     "--num-steps", "32", "--scheduler", "sync", "--no-progress", "--out",
                     "run"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "summary.json").is_file()
    result = daskrl(["eval", "run", "--episodes", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Acrobot-v1, 2 episodes: return ")
    assert "examples/local_run.py" in (REPO / "README.md").read_text()  # and from Python


def test_a_longer_resume_continues_the_learning_rate_schedule(cluster_tiny_ppo, tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    per = algo.steps_per_iteration
    settings = RunSettings(out=tmp_path, steps=4 * per, progress=False, eval=False,
                           tensorboard=False, checkpoint_every=1, task_s=0.0)  # one per task
    train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    for late in ("ckpt-00000003.pt", "ckpt-00000004.pt"):  # as if stopped after iteration 2
        (tmp_path / "checkpoints" / late).unlink()
    resumed = RunSettings(out=tmp_path, steps=8 * per, resume=True, progress=False,
                          eval=False, tensorboard=False, task_s=0.0)
    summary = train(SyncBackend(), algo, get_distribution("actors-learner"), resumed)
    rates = [float(r["charts/learning_rate"]) for r in read_csv(tmp_path / "metrics.csv")]
    lr = 2.5e-4
    # iterations 1-2 on the 4-iteration schedule; from 3 on, 0.5 -> 1 over 6 iterations
    expected = [lr * (1 - p) for p in (0, 1 / 4, *(0.5 + 0.5 * j / 6 for j in range(6)))]
    assert rates == pytest.approx(expected, rel=1e-5)  # the CSV keeps 6 digits
    assert summary["schedule"] == {"start": 2, "at": 0.5, "iterations": 8}
