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

from daskrl.distributions import get_distribution
from daskrl.runtime.backend import SyncBackend
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.driver import RunSettings, train

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
    "bad graph flag value": (["--num-envs", "many"],
                             "--num-envs: invalid literal for int() with base 10: 'many'; "
                             "expected --num-envs INT"),
    "abbreviated graph flag": (["--num-env", "4"],
                               "unrecognized flag --num-env; did you mean --num-envs?"),
}
XFAIL: dict[str, str] = {}


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

    start = _early_cluster(["train", "--steps", "10", graph, "--num-envs", "2"])  # graph 3rd
    assert isinstance(start, ClusterStart)
    cluster, client = start.take(workers=2)
    try:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
        assert sorted((w["name"], w["resources"]["CPU"]) for w in info) == [("w0", 1), ("w1", 1)]
        # w0 imports torch before any task of the run asks for it
        w0 = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
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


# --------------------------------------------------------------------------- flags from types

TYPED_GRAPH = '''
"""A graph whose Config holds every kind of field; build() writes what it got and stops."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional

from daskrl import setting


@dataclass
class Adam:
    eps: float = 1e-5
    """added to the denominator"""


@dataclass
class Config:
    sizes: tuple[int, int] = (64, 64)
    """hidden units of the two layers"""
    critic: Literal["central", "local"] = "central"
    """central: global state; local: own observation"""
    max_episodes: Optional[int] = None
    """stop after this many episodes (default: no limit)"""
    teams: list[str] = field(default_factory=lambda: ["good"])
    """teams that learn"""
    clip_vloss: bool = True
    """clip the value loss"""
    learning_rate: float = setting("Adam learning rate", 2.5e-4)
    num_envs: int = setting("envs per actor replica", 8)
    adam: Adam = field(default_factory=Adam)


def build(config: Config):
    with open(os.environ["TYPED_GRAPH_OUT"], "w") as fh:
        json.dump(asdict(config), fh)
    raise ValueError("built")
'''

DEFAULTS = {"sizes": [64, 64], "critic": "central", "max_episodes": None, "teams": ["good"],
            "clip_vloss": True, "learning_rate": 2.5e-4, "num_envs": 8, "adam": {"eps": 1e-5}}


@pytest.fixture
def typed_graph(tmp_path, monkeypatch) -> Path:
    script = tmp_path / "typed.py"
    script.write_text(TYPED_GRAPH)
    monkeypatch.setenv("TYPED_GRAPH_OUT", str(tmp_path / "built.json"))
    return script


def built_config(argv: list[str], script: Path, capsys) -> dict:
    """The config ``daskrl train`` passed to the typed graph's build()."""
    from daskrl.cli import main

    (script.parent / "built.json").unlink(missing_ok=True)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "daskrl: error: built", err  # build() raised, as meant
    return json.loads((script.parent / "built.json").read_text())


def test_every_field_type_is_a_flag_that_reaches_build(typed_graph, capsys):
    script = str(typed_graph)
    assert built_config(["train", script, "--scheduler", "sync"], typed_graph,
                        capsys) == DEFAULTS
    got = built_config(["train", script, "--scheduler", "sync", "--sizes", "32", "16",
                        "--critic", "local", "--max-episodes", "7", "--teams", "a", "b",
                        "--no-clip-vloss", "--learning-rate", "1e-3", "--num-envs", "4",
                        "--adam.eps", "1e-8"],
                       typed_graph, capsys)
    assert got == {"sizes": [32, 16], "critic": "local", "max_episodes": 7, "teams": ["a", "b"],
                   "clip_vloss": False, "learning_rate": 1e-3, "num_envs": 4,
                   "adam": {"eps": 1e-8}}
    got = built_config(["train", script, "--scheduler", "sync", "--max-episodes", "None",
                        "--clip-vloss", "--teams"], typed_graph, capsys)
    assert got == {**DEFAULTS, "teams": []}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_graph_script_may_stand_anywhere(typed_graph, where):
    from daskrl.cli import parse_command_line

    flags = ["--steps", "1000", "--sizes", "3", "4", "--seed", "5", "--teams", "x", "y"]
    at = {"first": 0, "middle": 3, "last": len(flags)}[where]
    args, module, config = parse_command_line(
        ["train", *flags[:at], str(typed_graph), *flags[at:]])
    assert (args.graph, args.steps, args.seed) == (str(typed_graph), 1000, 5)
    assert (config.sizes, config.teams) == ((3, 4), ["x", "y"])
    assert type(config) is module.Config


BAD_FLAGS = {
    "tuple value": (["--sizes", "1", "x"], "--sizes: "),
    "tuple too short": (["--sizes", "1"], "'--sizes'. Expected 2 values"),
    "literal": (["--critic", "global"], "invalid choice 'global' for argument '--critic'"),
    "optional": (["--max-episodes", "some"], "--max-episodes: "),
    "float": (["--learning-rate", "fast"], "--learning-rate: "),
    "abbreviated graph flag": (["--learning", "1e-3"],
                               "unrecognized flag --learning; did you mean --learning-rate?"),
    "abbreviated run flag": (["--ste", "10"], "unrecognized flag --ste; did you mean --steps?"),
    "bad run flag value": (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
    "unknown flag": (["--bogus"], "unrecognized flag --bogus"),
}


@pytest.mark.parametrize("name", BAD_FLAGS)
def test_a_bad_flag_is_one_line_naming_it(typed_graph, capsys, name):
    from daskrl.cli import main

    flags, message = BAD_FLAGS[name]
    code = main(["train", "--scheduler", "sync", *flags, str(typed_graph)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("daskrl: error: "), err
    assert message in err and "--help" in err, err  # what is wrong, and where to look
    assert not (typed_graph.parent / "built.json").exists()  # refused before build()


def test_help_lists_run_flags_and_graph_flags_with_their_docstrings(typed_graph, capsys):
    from daskrl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "10", str(typed_graph), "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for run_flag in ("--distribution", "--steps", "--scheduler", "--resume", "--cluster"):
        assert run_flag in out, run_flag
    graph_part = out[out.index("graph settings"):]
    for flag, text in [("--sizes INT INT", "hidden units of the two layers"),
                       ("--critic {central,local}", "central: global state"),
                       ("--max-episodes {None}|INT", "stop after this many episodes"),
                       ("--teams", "teams that learn"),
                       ("--clip-vloss, --no-clip-vloss", "clip the value loss"),
                       ("--learning-rate FLOAT", "Adam learning rate"),  # setting()'s text
                       ("--num-envs INT", "envs per actor replica"),
                       ("--adam.eps FLOAT", "added to the denominator")]:
        assert flag in graph_part and text in graph_part, (flag, graph_part)


def test_a_config_field_named_like_a_run_flag_is_refused(tmp_path, capsys):
    from daskrl.cli import main

    script = tmp_path / "clash.py"
    script.write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Config:\n"
                      "    seed: int = 0\n\n\ndef build(config):\n    raise ValueError\n")
    assert main(["train", str(script), "--scheduler", "sync"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskrl: error: ") and "--seed" in err and len(err.splitlines()) == 1


def test_cluster_flags_reach_the_job_spec(typed_graph):
    from daskrl.cli import _batch_spec, parse_command_line

    args, _, _ = parse_command_line(["train", str(typed_graph), "--cluster", "slurm",
                                     "--queue", "debug", "--cores", "2",
                                     "--job-extra=--constraint=v100"])
    spec = _batch_spec(args)
    assert (spec.kind, spec.queue, spec.cores, spec.job_extra) == (
        "slurm", "debug", 2, ["--constraint=v100"])
    args, _, _ = parse_command_line(["train", str(typed_graph)])
    assert _batch_spec(args) is None


def test_the_early_cluster_finds_the_graph_anywhere():
    from daskrl.cli import _early_cluster, _graph_path

    assert _graph_path(["train", "--steps", "10", GRAPH, "--num-envs", "2"]) == GRAPH
    assert _graph_path(["graph", "--out", "x.svg", GRAPH]) == GRAPH
    assert _graph_path(["train", "--steps", "10"]) is None
    assert _graph_path(["plot", "run.py"]) is None
    assert _early_cluster(["train", "--scheduler", "sync", GRAPH]) is None
    assert _early_cluster(["train", "--steps", "10", GRAPH, "--help"]) is None


def test_graph_command_passes_the_changed_fields_to_the_renderer(typed_graph, monkeypatch,
                                                                  capsys):
    import daskrl.observe.render
    from daskrl.cli import main

    calls = []
    monkeypatch.setattr(daskrl.observe.render, "render_iteration",
                        lambda *args: calls.append(args) or Path(args[2]))
    assert main(["graph", "--sizes", "3", "4", str(typed_graph), "--out", "g.svg",
                 "--critic", "central", "--distribution", "single"]) == 0, capsys.readouterr()
    assert calls == [(str(typed_graph), "single", Path("g.svg"), {"sizes": (3, 4)})]
