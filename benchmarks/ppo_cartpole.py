"""PPO on CartPole-v1: daskrl against Stable-Baselines3 (and a lean loop), same settings.

Every run is a separate process started from here (``daskrl train`` through its CLI, SB3 and
the lean loop through this script's hidden child mode), so each pays its own start-up and
daskrl's embedded LocalCluster is isolated. Per repeat and system there are two runs:

throughput
    ``--steps`` env steps (default 200k), no final evaluation. End-to-end env-steps/s counts
    from process launch to the end of the last iteration (imports, cluster, envs and model
    included); steady-state env-steps/s leaves out the first iteration.
solve
    ``--solve-steps`` env steps (default 500k) with a final greedy evaluation (10 episodes).
    "Time to 475" is the time from process launch to the end of the first iteration at which
    the training episodes reach the threshold (see :func:`first_solved`), the same rule for
    every system, computed from each system's own per-iteration episode returns.

The Dask overhead share comes from daskrl's ``metrics.csv`` (throughput runs): per iteration,
``overhead_s = iteration_s - (rollout_s + learner time)``.

Run ``python benchmarks/ppo_cartpole.py --help``; results go to
``benchmarks/results/ppo_cartpole.json`` and a table in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    fmt,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    update_section,
    write_json,
)

ENV_ID = "CartPole-v1"
GRAPH = Path("graphs") / "ppo.py"
"""The daskrl graph script, relative to the source tree the runs import daskrl from."""
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "ppo_cartpole.json"
DEFAULT_README = ROOT / "benchmarks" / "README.md"
SYSTEMS = ("daskrl", "sb3", "lean", "daskrl-stale")
LABELS = {"daskrl": "daskrl", "sb3": "SB3", "lean": "lean loop",
          "daskrl-stale": "daskrl stale=1"}
DISTRIBUTIONS = {"daskrl": "actors-learner", "daskrl-stale": "actors-learner:stale=1"}
"""The daskrl systems: the default (on-policy) and the opt-in one-step-stale mode."""
POLL_S = 0.05


@dataclass(frozen=True)
class Hyper:
    """PPO settings shared by every system (CleanRL names)."""

    num_envs: int = 8
    num_steps: int = 128
    update_epochs: int = 4
    minibatch_size: int = 256
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    eval_episodes: int = 10

    def daskrl_flags(self) -> list[str]:
        """The same settings as ``daskrl train graphs/ppo.py`` flags."""
        flags: list[str] = []
        for name, value in asdict(self).items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else "--no-" + flag[2:])
            else:
                flags += [flag, str(value)]
        return flags


@dataclass
class Iteration:
    """One finished training iteration, as every system reports it."""

    t_end: float
    """Epoch seconds at which the iteration (rollout and update) finished."""
    env_steps: int
    """Env steps so far, counted by the system itself."""
    episodes: int
    """Training episodes that ended in this iteration's rollout."""
    return_mean: float | None
    """Mean return of those episodes (``None`` when none ended)."""


@dataclass
class Trace:
    """What a run reports: its iterations, timings and (optionally) a final evaluation."""

    t_launch: float
    t_train_start: float
    iterations: list[Iteration]
    eval_return_mean: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------
# the rule, and the numbers derived from a trace


def first_solved(iterations: list[Iteration], threshold: float, window: int) -> int | None:
    """Index of the first iteration whose recent training episodes average ``threshold``.

    The rule: walk back from iteration ``k`` over whole iterations until at least ``window``
    episodes are covered; ``k`` counts as solved when the mean return of those episodes
    (every episode weighted equally) is at least ``threshold``. Whole iterations keep the
    rule computable from per-iteration means, so it reads the same for every system; the
    window may hold a few more than ``window`` episodes.

    Examples
    --------
    >>> its = [Iteration(0, 1, 20, 20.0), Iteration(1, 2, 4, 480.0), Iteration(2, 3, 8, 490.0)]
    >>> first_solved(its, 475, 10), first_solved(its, 475, 12), first_solved(its, 495, 10)
    (2, 2, None)
    """
    for k in range(len(iterations)):
        count, total, j = 0, 0.0, k
        while j >= 0 and count < window:
            it = iterations[j]
            if it.episodes and it.return_mean is not None:
                count += it.episodes
                total += it.episodes * it.return_mean
            j -= 1
        if count >= window and total / count >= threshold:
            return k
    return None


def throughput_numbers(trace: Trace) -> dict[str, Any]:
    """End-to-end and steady-state env-steps/s, start-up and total time of a run."""
    its = trace.iterations
    if not its:
        return {"error": "no iteration finished"}
    steps = its[-1].env_steps
    e2e = its[-1].t_end - trace.t_launch
    out: dict[str, Any] = {
        "env_steps": steps,
        "iterations": len(its),
        "e2e_s": e2e,
        "startup_s": trace.t_train_start - trace.t_launch,
        "first_iteration_s": its[0].t_end - trace.t_train_start,
        "env_steps_per_s": steps / e2e if e2e > 0 else None,
        "steady_env_steps_per_s": None,
    }
    if len(its) > 1 and its[-1].t_end > its[0].t_end:
        out["steady_env_steps_per_s"] = (
            (its[-1].env_steps - its[0].env_steps) / (its[-1].t_end - its[0].t_end)
        )
    cpu = trace.extra.get("cpu_s")
    out["env_steps_per_cpu_s"] = steps / cpu if cpu else None
    return {**out, **trace.extra}


def solve_numbers(trace: Trace, threshold: float, window: int) -> dict[str, Any]:
    """Time and env steps to the threshold, and the final greedy evaluation, of a run."""
    its = trace.iterations
    k = first_solved(its, threshold, window)
    return {
        "env_steps": its[-1].env_steps if its else 0,
        "iterations": len(its),
        "reached": k is not None,
        "time_to_threshold_s": its[k].t_end - trace.t_launch if k is not None else None,
        "train_time_to_threshold_s": (
            its[k].t_end - trace.t_train_start if k is not None else None),
        "env_steps_to_threshold": its[k].env_steps if k is not None else None,
        "iteration_to_threshold": k + 1 if k is not None else None,
        "eval_return_mean": trace.eval_return_mean,
        "eval_solved": (trace.eval_return_mean is not None
                        and trace.eval_return_mean >= threshold),
        "final_train_return_mean": next(
            (it.return_mean for it in reversed(its) if it.return_mean is not None), None),
    }


# ----------------------------------------------------------------------------------------
# running one system


def snapshot_sources(dest: Path) -> dict[str, Any]:
    """Copy ``daskrl/`` and ``graphs/`` to ``dest``, so every run measures the same code.

    The working tree may change while a long benchmark runs; runs import daskrl from this
    copy instead (``PYTHONPATH``). Returns the copy's path and a SHA-256 over its files.
    """
    digest = hashlib.sha256()
    for package in ("daskrl", "graphs"):
        shutil.copytree(ROOT / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for file in sorted((dest / package).rglob("*")):
            if file.is_file():
                digest.update(str(file.relative_to(dest)).encode() + b"\0" + file.read_bytes())
    return {"path": str(dest), "sha256": digest.hexdigest()}


def _child_env(threads: int, src: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    if src != ROOT:
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(src), env.get("PYTHONPATH", "")) if x)
    return env


@dataclass
class Launch:
    """How a child process went: when it started, the load then, the CPU it used."""

    t_launch: float
    load_1m: float
    cpu_s: float
    """User + system CPU seconds of the child and every process it waited for."""


def _launch(cmd: list[str], log: Path, src: Path, threads: int, timeout: float,
            poll: Callable[[], None] | None = None) -> Launch:
    """Run ``cmd`` (output to ``log``) from ``src`` with the thread settings; wait for it."""
    with log.open("w") as fh:
        fh.write(shlex.join(cmd) + "\n")
        fh.flush()
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=src, env=_child_env(threads, src), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        _wait(proc, log, timeout, poll)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Launch(t_launch, load, cpu)


def _wait(proc: subprocess.Popen, log: Path, timeout: float,
          poll: Callable[[], None] | None = None) -> None:
    """Wait for ``proc`` (calling ``poll`` meanwhile); on failure, raise with the log's tail."""
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if poll is not None:
                poll()
            if time.monotonic() > deadline:
                raise TimeoutError(f"run exceeded {timeout:.0f}s")
            time.sleep(POLL_S)
    except BaseException:
        _kill(proc)
        raise
    if poll is not None:
        poll()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit status {proc.returncode}; see {log}:\n{tail}")


def _kill(proc: subprocess.Popen) -> None:
    """Stop a child started in its own session, with everything it started."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class CsvFollower:
    """Reads rows appended to a CSV file as they appear, noting when each was first seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: list[str] | None = None
        self.rows: list[tuple[float, dict[str, str]]] = []
        self._fh: Any = None
        self._partial = ""

    def poll(self) -> None:
        """Read any complete lines written since the last call."""
        now = time.time()
        if self._fh is None:
            if not self.path.exists():
                return
            self._fh = self.path.open(newline="")
        data = self._partial + self._fh.read()
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            values = next(csv.reader([line]))
            if self.header is None:
                self.header = values
            else:
                self.rows.append((now, dict(zip(self.header, values, strict=False))))

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()


def _float(value: str | None) -> float | None:
    try:
        out = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return None if out is None or math.isnan(out) else out


def _cumulative_steps(column: list[int], total: int) -> list[int]:
    """Env steps so far per row of ``metrics.csv``, whether the column is cumulative or not.

    The contract says cumulative; some daskrl versions write each iteration's own count
    there instead. The summary's total tells the two apart.

    Examples
    --------
    >>> _cumulative_steps([10, 20, 30], 30), _cumulative_steps([10, 10, 10], 30)
    ([10, 20, 30], [10, 20, 30])
    """
    pairs = zip(column[:-1], column[1:], strict=True)
    if column and column[-1] == total and all(a <= b for a, b in pairs):
        return column
    out, acc = [], 0
    for n in column:
        acc += n
        out.append(acc)
    if acc != total:
        raise ValueError(f"metrics.csv env_steps add up to {acc}, summary.json says {total}")
    return out


def run_daskrl(steps: int, seed: int, out: Path, hp: Hyper, evaluate: bool, workers: int | None,
               threads: int, timeout: float, src: Path, on_row: Callable[[int], None],
               distribution: str = "actors-learner") -> Trace:
    """Train with ``daskrl train graphs/ppo.py`` in a subprocess and read its outputs.

    ``workers=None`` leaves the embedded cluster's size to daskrl (its default).

    Rows of ``metrics.csv`` are followed while the run goes on; their ``wall_s`` (the
    driver's clock from the start of its loop) is placed on the epoch clock by the earliest
    row, i.e. ``t_train_start = min(seen - wall_s)`` over rows (seen within ``POLL_S``).
    """
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "daskrl.cli", "train", str(src / GRAPH), "--env", ENV_ID,
           "--steps", str(steps), "--seed", str(seed), "--distribution", distribution,
           "--out", str(out / "run"), "--no-progress", *hp.daskrl_flags()]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if not evaluate:
        cmd.append("--no-eval")
    log = out / "log.txt"
    follower = CsvFollower(out / "run" / "metrics.csv")

    def poll() -> None:
        before = len(follower.rows)
        follower.poll()
        if len(follower.rows) != before:
            on_row(len(follower.rows))

    try:
        launch = _launch(cmd, log, src, threads, timeout, poll)
    finally:
        follower.close()
    rows = follower.rows
    if not rows:
        raise RuntimeError(f"no metrics rows in {out / 'run'}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    t0 = min(seen - float(r["wall_s"]) for seen, r in rows)
    steps = _cumulative_steps([int(float(r["env_steps"])) for _, r in rows],
                              int(summary["env_steps"]))
    iterations = [
        Iteration(t0 + float(r["wall_s"]), n, int(float(r.get("episodes") or 0)),
                  _float(r.get("episode_return_mean")))
        for (_, r), n in zip(rows, steps, strict=True)
    ]
    iter_s = [_float(r.get("iteration_s")) or 0.0 for _, r in rows[1:]]
    over_s = [_float(r.get("overhead_s")) or 0.0 for _, r in rows[1:]]
    extra = {
        "dask_overhead_share": summary.get("dask_overhead_share"),
        "dask_overhead_share_total": sum(over_s) / sum(iter_s) if sum(iter_s) > 0 else None,
        "iteration_s_median": median(iter_s),
        "overhead_s_median": median(over_s),
        "driver_wall_s": summary.get("wall_s"),
        "driver_env_steps_per_s": summary.get("env_steps_per_s"),
        "placement": summary.get("placement"),
        "metrics_env_steps_cumulative": steps == [int(float(r["env_steps"])) for _, r in rows],
        "load_1m_at_launch": launch.load_1m,
        "cpu_s": launch.cpu_s,
    }
    return Trace(launch.t_launch, t0, iterations, summary.get("eval_return_mean"), extra)


def run_child(system: str, steps: int, seed: int, out: Path, hp: Hyper, evaluate: bool,
              threads: int, timeout: float, src: Path) -> Trace:
    """Run SB3 or the lean loop in a subprocess of this script and read its trace."""
    out.mkdir(parents=True, exist_ok=True)
    trace_file = out / "trace.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system,
           "--child-out", str(trace_file), "--steps", str(steps), "--seed", str(seed),
           "--torch-threads", str(threads), "--child-hyper", json.dumps(asdict(hp)),
           "--child-graph", str(src / GRAPH)]
    if evaluate:
        cmd.append("--child-eval")
    launch = _launch(cmd, out / "log.txt", src, threads, timeout)
    data = json.loads(trace_file.read_text())
    extra = {**data.get("extra", {}), "load_1m_at_launch": launch.load_1m, "cpu_s": launch.cpu_s}
    return Trace(launch.t_launch, data["t_train_start"],
                 [Iteration(**it) for it in data["iterations"]], data.get("eval_return_mean"),
                 extra)


# ----------------------------------------------------------------------------------------
# child processes: SB3 and the lean loop


def _iteration_record(t_end: float, env_steps: int, returns: list[float]) -> dict[str, Any]:
    return {"t_end": t_end, "env_steps": int(env_steps), "episodes": len(returns),
            "return_mean": float(sum(returns) / len(returns)) if returns else None}


def child_sb3(steps: int, seed: int, hp: Hyper, evaluate: bool, graph: Path
              ) -> dict[str, Any]:
    """Stable-Baselines3 PPO, DummyVecEnv of ``num_envs`` Monitor-wrapped envs, on the CPU.

    ``graph`` is unused (SB3 has no graph script); it keeps the child signatures alike.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv
    from torch import nn

    class Recorder(BaseCallback):
        """Notes each iteration's end time, env steps and Monitor episode returns."""

        def __init__(self) -> None:
            super().__init__()
            self.t_train_start = 0.0
            self.iterations: list[dict[str, Any]] = []
            self.returns: list[float] = []
            self.pending: tuple[int, list[float]] | None = None

        def _close(self) -> None:
            if self.pending is not None:
                self.iterations.append(_iteration_record(time.time(), *self.pending))
                self.pending = None

        def _on_training_start(self) -> None:
            self.t_train_start = time.time()

        def _on_rollout_start(self) -> None:
            self._close()  # the previous iteration's update has just finished

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_end(self) -> None:
            self.pending = (self.num_timesteps, self.returns)
            self.returns = []

        def _on_training_end(self) -> None:
            self._close()

    lr = hp.learning_rate
    env = make_vec_env(ENV_ID, n_envs=hp.num_envs, seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy", env, learning_rate=(lambda p: lr * p) if hp.anneal_lr else lr,
        n_steps=hp.num_steps, batch_size=hp.minibatch_size, n_epochs=hp.update_epochs,
        gamma=hp.gamma, gae_lambda=hp.gae_lambda, clip_range=hp.clip_coef,
        ent_coef=hp.ent_coef, vf_coef=hp.vf_coef, max_grad_norm=hp.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": [hp.hidden] * 2, "vf": [hp.hidden] * 2},
                       "activation_fn": nn.Tanh},
        device="cpu", seed=seed, verbose=0,
    )
    recorder = Recorder()
    model.learn(total_timesteps=steps, callback=recorder)
    result: dict[str, Any] = {"t_train_start": recorder.t_train_start,
                              "iterations": recorder.iterations}
    if evaluate:
        eval_env = make_vec_env(ENV_ID, n_envs=hp.eval_episodes, seed=seed + 10_000,
                                vec_env_cls=DummyVecEnv)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=hp.eval_episodes,
                                  deterministic=True)
        result["eval_return_mean"] = float(mean)
    return result


def child_lean(steps: int, seed: int, hp: Hyper, evaluate: bool, graph: Path
               ) -> dict[str, Any]:
    """daskrl's own PPO roles (from ``graphs/ppo.py``) called in a plain loop, no Dask.

    The same actor, learner and evaluation objects the Dask tasks use, so the gap to
    daskrl is what the task graph costs.
    """
    import daskrl
    from daskrl.cli import load_graph

    module = load_graph(str(graph))
    names = {f for f in module.Config.__dataclass_fields__}
    config = module.Config(**{k: v for k, v in asdict(hp).items() if k in names}, env=ENV_ID)
    algo = module.build(config)
    num_iterations = max(1, math.ceil(steps / algo.steps_per_iteration))
    actor = algo.make_actor(seed)
    learner = algo.make_learner(seed + 1, "cpu")
    iterations: list[dict[str, Any]] = []
    env_steps = 0
    t_train_start = time.time()
    for k in range(num_iterations):
        actor.set_weights(learner.weights(), k)
        batch = actor.rollout(algo.num_steps)
        learner.update([batch], k / num_iterations)
        env_steps += batch["stats"]["env_steps"]
        iterations.append(_iteration_record(time.time(), env_steps,
                                            list(batch["stats"]["episode_returns"])))
    result: dict[str, Any] = {"t_train_start": t_train_start, "iterations": iterations,
                              "daskrl_file": daskrl.__file__}
    if evaluate:
        result["eval_return_mean"] = float(
            algo.evaluate(learner.weights(), seed + 10_000)["eval_return_mean"])
    return result


def child_main(args: argparse.Namespace) -> int:
    """Hidden child mode: run one system and write its trace as JSON."""
    import torch

    torch.set_num_threads(args.torch_threads)
    hp = Hyper(**json.loads(args.child_hyper)) if args.child_hyper else Hyper()
    fn = {"sb3": child_sb3, "lean": child_lean}[args.child]
    result = fn(args.steps, args.seed, hp, args.child_eval, Path(args.child_graph))
    result["extra"] = {"torch_threads": torch.get_num_threads()}
    if "daskrl_file" in result:
        result["extra"]["daskrl_file"] = result.pop("daskrl_file")
    Path(args.child_out).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------------------
# the benchmark


THROUGHPUT_KEYS = ("env_steps_per_s", "steady_env_steps_per_s", "env_steps_per_cpu_s",
                   "startup_s", "e2e_s", "first_iteration_s", "env_steps", "cpu_s",
                   "load_1m_at_launch", "dask_overhead_share", "dask_overhead_share_total",
                   "iteration_s_median", "overhead_s_median")
SOLVE_KEYS = ("time_to_threshold_s", "train_time_to_threshold_s", "env_steps_to_threshold",
              "eval_return_mean")
HIGHER_IS_BETTER = ("env_steps_per_s", "steady_env_steps_per_s", "eval_return_mean")


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Median over repeats of each number, per system (never reaching counts as infinite)."""
    medians: dict[str, dict[str, Any]] = {}
    for system, reps in runs.items():
        m: dict[str, Any] = {}
        for key in THROUGHPUT_KEYS:
            m[key] = median(r.get("throughput", {}).get(key) for r in reps)
        for key in SOLVE_KEYS:
            missing = math.inf if key != "eval_return_mean" else None
            solved = [r["solve"] for r in reps if "solve" in r and "error" not in r["solve"]]
            m[key] = median((s.get(key) for s in solved), missing_as=missing)
        solved = [r["solve"] for r in reps if "solve" in r and "error" not in r["solve"]]
        m = {k: v for k, v in m.items() if v is not None}
        m["reached_threshold"] = f"{sum(s['reached'] for s in solved)}/{len(solved)}"
        m["eval_solved"] = f"{sum(s['eval_solved'] for s in solved)}/{len(solved)}"
        medians[system] = m
    return medians


def ratios(medians: dict[str, dict[str, Any]], base: str, system: str = "daskrl"
           ) -> dict[str, dict[str, Any]]:
    """``system / base`` for every numeric median both have."""
    out: dict[str, dict[str, Any]] = {}
    if system not in medians or base not in medians:
        return out
    a, b = medians[system], medians[base]
    both = {k: ratio(a[k], b.get(k)) for k in a
            if isinstance(a[k], int | float) and not isinstance(a[k], bool)}
    out[f"{system}/{base}"] = {k: v for k, v in both.items() if v is not None}
    return out


def targets(medians: dict[str, dict[str, Any]], rat: dict[str, dict[str, Any]],
            threshold: float, solve_steps: int) -> list[dict[str, Any]]:
    """The project's targets, each with the measured value and whether it is met."""
    d = medians.get("daskrl", {})
    r = rat.get("daskrl/sb3", {})
    rows: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: Any, met: bool | None) -> None:
        rows.append({"target": name, "goal": goal, "measured": value, "met": met})

    sps = r.get("env_steps_per_s")
    add("env-steps/s vs SB3 (end to end)", ">= 3x", sps, None if sps is None else sps >= 3)
    steady = r.get("steady_env_steps_per_s")
    add("env-steps/s vs SB3 (steady state)", ">= 3x", steady,
        None if steady is None else steady >= 3)
    ev = d.get("eval_return_mean")
    add(f"greedy eval after {solve_steps:,} env steps", f">= {threshold:g}", ev,
        None if ev is None else ev >= threshold)
    tt = r.get("time_to_threshold_s")
    d_tt, s_tt = d.get("time_to_threshold_s"), medians.get("sb3", {}).get("time_to_threshold_s")
    if tt is None and d_tt == math.inf:
        met_tt: bool | None = False
    elif tt is None and s_tt == math.inf and d_tt is not None:
        met_tt = True
    else:
        met_tt = None if tt is None else tt <= 1 / 3
    add(f"wall-clock to {threshold:g} vs SB3", "<= 1/3", tt, met_tt)
    ov = d.get("dask_overhead_share_total")
    add("Dask overhead share of iteration time", "<= 5%", ov, None if ov is None else ov <= 0.05)
    return rows


def _num(value: Any) -> Any:
    """Undo :func:`_common.write_json`'s ``"inf"`` for infinite numbers."""
    return math.inf if value == "inf" else value


def render_markdown(result: dict[str, Any]) -> str:
    """The README section for these results: the table, the rule and the command."""
    s, med = result["settings"], result["medians"]
    systems = [x for x in SYSTEMS if x in med]
    r = result["ratios"].get("daskrl/sb3", {})
    thr = f"{s['threshold']:g}"
    lines = [
        ("env-steps/s, end to end (launch to last iteration)", "env_steps_per_s", 4),
        ("env-steps/s, steady state (first iteration left out)", "steady_env_steps_per_s", 4),
        ("env steps per CPU-second (all processes of the run)", "env_steps_per_cpu_s", 4),
        ("start-up: launch to first iteration start (s)", "startup_s", 3),
        (f"wall-clock to {thr}, from launch (s)", "time_to_threshold_s", 3),
        (f"wall-clock to {thr}, from training start (s)", "train_time_to_threshold_s", 3),
        (f"env steps to {thr}", "env_steps_to_threshold", 4),
        (f"reached {thr} (training rule), runs", "reached_threshold", 0),
        (f"greedy eval return after {s['solve_steps']:,} steps", "eval_return_mean", 4),
        ("Dask overhead share (all iterations but the first)", "dask_overhead_share_total", 2),
        ("load average (1 min) at launch, throughput runs", "load_1m_at_launch", 3),
    ]
    headers = ["median of " + str(s["repeats"])] + [LABELS[x] for x in systems]
    headers.append("daskrl / SB3")
    rows = []
    for label, key, digits in lines:
        row: list[str] = [label]
        for x in systems:
            v = _num(med[x].get(key))
            if key.startswith("dask_overhead") and x == "daskrl-stale":
                row.append("overlapped")  # rollout and update overlap: no serial remainder
            elif key.startswith("dask_overhead") and v is not None:
                row.append(f"{100 * v:.1f}%")
            else:
                row.append(fmt(v, digits) if not isinstance(v, str) else v)
        show = key in r and "overhead" not in key and not key.startswith("load")
        row.append(fmt(r.get(key), 3) if show else "")
        rows.append(row)
    table = markdown_table(headers, rows)
    tgt = markdown_table(
        ["target", "goal", "measured", "met"],
        [[t["target"], t["goal"],
          f"{100 * t['measured']:.1f}%" if "overhead" in t["target"] and t["measured"]
          is not None else fmt(t["measured"], 3),
          {True: "yes", False: "no", None: "-"}[t["met"]]] for t in result["targets"]],
        align="llrl")
    m = result["machine"]
    before, after = m["load_before"], m["load_after"]
    busy = " (machine shared: read the ratios, not the absolute numbers)" if m.get("busy") else ""
    code = f"{m['git_commit']}{' + local changes' if m['git_dirty'] else ''}"
    if m.get("daskrl_sources_sha256"):
        code += (" (daskrl/ and graphs/ copied at the start, sha256 "
                 f"{m['daskrl_sources_sha256'][:12]})")
    workers = (f"{s['workers']} workers" if s.get("workers") else
               "daskrl's default size: 1 worker for 1 rollout replica")
    stale_workers = (f"{s['workers']} workers" if s.get("workers") else
                     "daskrl's default: 2 workers, the learner apart")
    return "\n".join([
        "## PPO on CartPole-v1: daskrl vs Stable-Baselines3",
        "",
        "`ppo_cartpole.py` trains PPO on CartPole-v1 with the same settings in every system: "
        "8 envs x 128 steps, 4 epochs, minibatch 256, lr 2.5e-4 annealed linearly to 0, "
        "gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad-norm 0.5, "
        "separate 64x64 tanh actor and critic, CPU, one torch thread per process. "
        "daskrl runs `daskrl train graphs/ppo.py` (embedded LocalCluster, "
        f"{workers}, default actors-learner distribution, on-policy); SB3 runs PPO with a "
        "DummyVecEnv of 8 Monitor-wrapped envs; the *lean loop* calls the same actor and "
        "learner objects as daskrl's tasks in a plain Python loop (no Dask). "
        + (f"*{LABELS['daskrl-stale']}* is the opt-in `--distribution actors-learner:stale=1` "
           "(rollouts act with weights one update old and overlap the update, on "
           f"{stale_workers}); it is not on-policy PPO, so the targets are read from the "
           "default daskrl column. " if "daskrl-stale" in systems else "")
        + "Each run is its own process; the order of the systems rotates between repeats.",
        "",
        table,
        "",
        tgt,
        "",
        f"- **Throughput runs**: {s['steps']:,} env steps, no evaluation. *End to end* counts "
        "from process launch (imports, cluster, envs, model) to the end of the last iteration; "
        "*steady state* leaves out the first iteration. Each system counts env steps itself "
        "(daskrl leaves out gymnasium's auto-reset steps). *Per CPU-second* divides by the "
        "user + system CPU time of every process of the run (for daskrl: driver, scheduler, "
        "nannies, workers), start-up and shutdown included; it depends less on the load than "
        "wall-clock rates do.",
        f"- **Time to {thr}**: separate runs of {s['solve_steps']:,} env steps. An iteration "
        f"reaches it when the training episodes of the latest whole iterations covering at "
        f"least {s['window']} episodes average >= {thr} (SB3: Monitor returns; daskrl: "
        "`episodes` and `episode_return_mean` of `metrics.csv`); time is taken at the end "
        "of that iteration's update. A run that never reaches it counts as infinite in the "
        f"median. The greedy evaluation is {s['hyper']['eval_episodes']} deterministic "
        "episodes at the end of the same runs.",
        "- **Dask overhead share** (daskrl, throughput runs): `sum(overhead_s) / "
        "sum(iteration_s)` over the rows of `metrics.csv` but the first (iteration time "
        "minus time inside the rollout and learner fragments; the driver runs several short "
        "iterations per task, so the gap between tasks lands on the first row of each), "
        "which is what `summary.json` reports as `dask_overhead_share`.",
        f"- Measured {m['load_before']['time']} on {m['cpu_model']} ({m['usable_cpus']} CPUs), "
        f"Python {m['python']}, torch {m['packages'].get('torch')}, dask "
        f"{m['packages'].get('dask')}, SB3 {m['packages'].get('stable-baselines3')}, daskrl "
        f"at {code}; load average "
        f"{before['load_1m']:.2f} before, {after['load_1m']:.2f} after{busy}. "
        "Raw numbers per repeat: [results/ppo_cartpole.json](results/ppo_cartpole.json).",
        "",
        "```bash",
        _command(shlex.split(result["command"])[2:]),
        "```",
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(
        description="daskrl vs Stable-Baselines3 PPO on CartPole-v1: env-steps/s, wall-clock "
        "to return 475, Dask overhead share. Medians over --repeats runs.")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs per system and measurement (default: 3; 1 with --quick)")
    p.add_argument("--steps", type=int, default=None,
                   help="env steps of a throughput run (default: 200000; 4096 with --quick)")
    p.add_argument("--solve-steps", type=int, default=None,
                   help="env steps of a time-to-threshold run, 0 to skip those runs "
                   "(default: 500000; 8192 with --quick)")
    p.add_argument("--threshold", type=float, default=475.0,
                   help="return that counts as solved (default: 475)")
    p.add_argument("--window", type=int, default=10,
                   help="training episodes the threshold rule averages over, at least "
                   "(default: 10)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the first repeat, +1 for each next one (default: 1)")
    p.add_argument("--workers", type=int, default=None,
                   help="daskrl's embedded cluster workers (default: daskrl's own default: "
                   "one per rollout replica, plus one for the learner with stale=1)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch/OpenMP threads per process, every system (default: 1)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds allowed per run (default: 1800)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 repeat, 4k/8k steps; writes JSON/README only if asked")
    p.add_argument("--json", type=Path, default=None,
                   help=f"results file (default: {DEFAULT_JSON.relative_to(ROOT)}; "
                   "a temporary file with --quick)")
    p.add_argument("--readme", type=Path, default=None,
                   help=f"README whose ppo_cartpole section to rewrite (default: "
                   f"{DEFAULT_README.relative_to(ROOT)}; none with --quick)")
    p.add_argument("--no-readme", action="store_true", help="leave the README alone")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="keep every run's output and logs here (default: a temporary folder)")
    p.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                   help="run daskrl from the working tree as it is at each launch, instead of "
                   "from a copy of daskrl/ and graphs/ taken when the benchmark starts")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="only render the markdown section of an earlier results file "
                   "(printed; also written to --readme when given)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.add_argument("--child", choices=("sb3", "lean"), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--child-eval", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-hyper", help=argparse.SUPPRESS)
    p.add_argument("--child-graph", default=str(ROOT / GRAPH), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, full, quick in (("repeats", 3, 1), ("steps", 200_000, 4096),
                              ("solve_steps", 500_000, 8192)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.repeats < 1 or args.steps < 1 or args.solve_steps < 0:
        p.error("--repeats and --steps must be >= 1, --solve-steps >= 0")
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {', '.join(sorted(unknown))}; choose from {SYSTEMS}")
    return args


def _command(argv: list[str]) -> str:
    """The command that reproduces a run, without options that do not change its numbers.

    Examples
    --------
    >>> _command(["--repeats", "3", "--work-dir", "/tmp/w", "--no-progress"])
    'python benchmarks/ppo_cartpole.py --repeats 3'
    """
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--work-dir", "--json", "--readme"):
            skip = True
        elif arg in ("--no-progress", "--no-readme") or arg.startswith(
                ("--work-dir=", "--json=", "--readme=")):
            pass
        else:
            kept.append(arg)
    return shlex.join(["python", "benchmarks/ppo_cartpole.py", *kept])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write the JSON results and the README section."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.render:
        section = render_markdown(json.loads(args.render.read_text()))
        print(section)
        if args.readme is not None and not args.no_readme:
            update_section(args.readme, "ppo_cartpole", section)
        return 0
    from tqdm.auto import tqdm

    hp = Hyper()
    json_path = args.json or (
        Path(tempfile.gettempdir()) / "ppo_cartpole.quick.json" if args.quick else DEFAULT_JSON)
    readme = None if args.no_readme else (args.readme or (None if args.quick else DEFAULT_README))
    work_ctx = (tempfile.TemporaryDirectory(prefix="ppo_cartpole-") if args.work_dir is None
                else None)
    work = Path(work_ctx.name) if work_ctx else args.work_dir
    phases = [("throughput", args.steps, False)]
    if args.solve_steps:
        phases.append(("solve", args.solve_steps, True))
    load_before = load_average()
    machine = machine_info()
    src = ROOT
    if args.snapshot:
        source = snapshot_sources(work / "src")
        src = Path(source["path"])
        machine["daskrl_sources_sha256"] = source["sha256"]
    runs: dict[str, list[dict[str, Any]]] = {x: [] for x in args.systems}
    total = args.repeats * len(args.systems) * len(phases)
    bar = tqdm(total=total, unit="run", desc="ppo_cartpole", disable=not args.progress,
               dynamic_ncols=True)
    t_start = time.time()
    try:
        for rep in range(args.repeats):
            seed = args.seed + rep
            shift = rep % len(args.systems)
            order = args.systems[shift:] + args.systems[:shift]
            record = {x: {"repeat": rep, "seed": seed} for x in order}
            for phase, steps, evaluate in phases:
                for system in order:
                    out = work / f"rep{rep}" / phase / system
                    bar.set_postfix_str(f"rep {rep + 1} {phase} {LABELS[system]}")
                    try:
                        if system in DISTRIBUTIONS:
                            def on_row(n: int, label: str = f"rep {rep + 1} {phase}") -> None:
                                bar.set_postfix_str(f"{label} daskrl it {n}")
                            trace = run_daskrl(steps, seed, out, hp, evaluate, args.workers,
                                               args.torch_threads, args.timeout, src, on_row,
                                               DISTRIBUTIONS[system])
                        else:
                            trace = run_child(system, steps, seed, out, hp, evaluate,
                                              args.torch_threads, args.timeout, src)
                        numbers = (solve_numbers(trace, args.threshold, args.window)
                                   if phase == "solve" else throughput_numbers(trace))
                    except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as exc:
                        numbers = {"error": f"{type(exc).__name__}: {exc}"}
                        tqdm.write(f"{system} {phase} repeat {rep}: {numbers['error']}")
                    record[system][phase] = numbers
                    bar.update(1)
            for system in args.systems:
                runs[system].append(record[system])
    finally:
        bar.close()
    load_after = load_average()
    medians = summarise(runs)
    rat = {**ratios(medians, "sb3"), **ratios(medians, "lean"),
           **ratios(medians, "sb3", "daskrl-stale")}
    after = machine_info()
    machine.update(load_before=load_before, load_after=load_after, snapshot=args.snapshot,
                   git_commit_after=after["git_commit"], git_dirty_after=after["git_dirty"])
    cpus = machine["usable_cpus"] or 1
    machine["busy"] = load_before["load_1m"] > 0.5 * cpus
    result = {
        "benchmark": "ppo_cartpole",
        "command": _command(argv),
        "duration_s": time.time() - t_start,
        "machine": machine,
        "settings": {
            "env": ENV_ID, "steps": args.steps, "solve_steps": args.solve_steps,
            "repeats": args.repeats, "seeds": [args.seed + r for r in range(args.repeats)],
            "threshold": args.threshold, "window": args.window, "systems": args.systems,
            "workers": args.workers, "torch_threads": args.torch_threads,
            "hyper": asdict(hp), "quick": args.quick,
            "rule": (f"first iteration k such that the training episodes of iterations "
                     f"k, k-1, ... (whole iterations, back until >= {args.window} episodes) "
                     f"have a mean return >= {args.threshold:g}; time from process launch "
                     "to the end of iteration k's update"),
            "overhead": ("daskrl metrics.csv, first row left out: dask_overhead_share_total = "
                         "sum(overhead_s) / sum(iteration_s) (= summary.json's "
                         "dask_overhead_share); dask_overhead_share is summary.json's"),
        },
        "runs": runs,
        "medians": medians,
        "ratios": rat,
    }
    result["targets"] = targets(medians, rat, args.threshold, args.solve_steps)
    write_json(json_path, result)
    section = render_markdown(json.loads(json_path.read_text()))
    print(section)
    print(f"\nwrote {json_path}")
    if readme is not None:
        update_section(readme, "ppo_cartpole", section)
        print(f"updated the ppo_cartpole section of {readme}")
    if work_ctx is not None:
        work_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
