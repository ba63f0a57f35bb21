"""Ape-X on 2 workers with an expensive env: env-steps/s with 1, 2 and 4 actors, the
learner's busy share, the policy lag, and the ceiling the learner's share of the work sets.

``graphs/dqn.py --distribution apex`` runs on ``--workers`` workers of the embedded cluster
(one CPU slot each) with an env made expensive in one of two ways, each its own row:

cpu
    CartPole-v1 with ``--env-step-cost`` CPU seconds burnt per env step: the actors need
    cores, which the learner (and everything else on the machine) also wants.
sleep
    CartPole-v1 whose step sleeps ``--sleep`` seconds (a simulator running elsewhere, or
    waiting on I/O): the actors hold their worker's slot but not a core.
learner
    CartPole-v1 at no extra cost with a heavier learner (``--learner-hidden`` units, one
    gradient step per ``--learner-train-frequency`` env steps), 1 and 2 actors: whether the
    learner waits for data when it is the bottleneck (its busy share).
cpu-stale1, sleep-stale1
    the cpu (sleep) row's 2 actors under ``apex:stale=1`` (a refresh takes the update before
    the newest instead of waiting for it), the A/B of the default ``stale=0``.

Per run: steady env-steps/s once the buffer is warm (rows with gradient steps, the first of
them left out, and the last 4: the driver keeps 4 iterations in flight, so the actors run
that far ahead and the last rows are the learner draining what they left), the learner's
busy share as ``daskrl profile`` prints it (``learner_busy``: the share of the time between
two learner tasks' ends that it computed), the mean policy lag, and the learner's work
relative to one actor's (``learn_s / rollout_s`` of the 1-actor runs).

The learner shares a worker with an actor once there are 2 actors on 2 workers, and every
iteration waits for the slower of the two, so with ``l`` the learner's seconds per 1-actor
iteration over a rollout's: 2 actors reach at most ``2 / (1 + 2 l)`` of 1 actor's steps/s on
this placement, and ``2 / (1 + l)`` with the work spread perfectly over the 2 cores.

Medians over ``--repeats`` (seeds 1, 2, ...; repeats are the outer loop so that load from other
work spreads over all cells); the load average is recorded before and after every run.

    python benchmarks/apex.py --repeats 3      # results/apex.json and apex.md's table
    python benchmarks/apex.py --quick          # a smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    fmt,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

SLEEPY = '''"""Registers SleepyCartPole-v1 in every process of a run (Dask workers too)."""
import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

_SLEEP = float(os.environ.get("APEX_BENCH_SLEEP", "0.001"))


class SleepyCartPole(CartPoleEnv):
    def step(self, action):
        time.sleep(_SLEEP)
        return super().step(action)


gym.register("SleepyCartPole-v1", entry_point=SleepyCartPole, max_episode_steps=500)
'''
"""A ``sitecustomize`` put on the runs' ``PYTHONPATH``, so the Dask workers know the env."""


KINDS: dict[str, tuple[int, ...]] = {"cpu": (), "sleep": (), "learner": (1, 2),
                                     "cpu-stale1": (2,), "sleep-stale1": (2,)}
"""Env kinds (see the module notes) -> the actor counts they run (empty: all)."""


def run_once(out: Path, kind: str, actors: int, seed: int, args: argparse.Namespace,
             site: Path) -> dict[str, Any]:
    """One ``daskrl train`` process; its metrics boiled down."""
    iterations = args.iterations
    steps = iterations * actors * args.num_envs * args.num_steps
    env = "SleepyCartPole-v1" if kind.startswith("sleep") else "CartPole-v1"
    learner = kind == "learner"
    cmd = [sys.executable, "-m", "daskrl.cli", "train", "graphs/dqn.py", "--distribution",
           "apex:stale=1" if kind.endswith("stale1") else "apex", "--workers", str(args.workers),
           "--num-actors", str(actors), "--env", env,
           "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
           "--hidden", str(args.learner_hidden if learner else args.hidden),
           "--train-frequency",
           str(args.learner_train_frequency if learner else args.train_frequency),
           "--learning-starts", str(args.learning_starts), "--seed", str(seed), "--steps",
           str(steps), "--out", str(out), "--no-progress", "--no-eval",
           "--env-step-cost", str(args.env_step_cost if kind.startswith("cpu") else 0.0)]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "APEX_BENCH_SLEEP": str(args.sleep)}
    before = load_average()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env=environ)
    wall = time.perf_counter() - t0
    after = load_average()
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "load_before": before, "load_after": after}
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    from daskrl.observe.profile import report

    profile = report(out)
    busy_line = next((ln for ln in profile.splitlines() if ln.startswith("learner busy")), "")
    return {**boil(rows), "process_s": wall, "profile": profile, "learner_busy_line": busy_line,
            "load_before": before, "load_after": after}


LOOKAHEAD = 4
"""The driver's graphs in flight (``RunSettings.lookahead``): the actors run up to this many
iterations ahead of the recorded ones, so a run's last rows come at the learner's pace."""


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def boil(rows: list[dict[str, str]]) -> dict[str, Any]:
    """Steady env-steps/s, learner busy share, policy lag and learner/rollout seconds."""
    warm = [r for r in rows if _num(r.get("gradient_steps")) > 0][1:]
    out: dict[str, Any] = {"iterations": len(rows), "warm_iterations": len(warm)}
    # the last LOOKAHEAD rows are the learner draining rollouts done earlier: left out
    timed = warm[:-LOOKAHEAD] if len(warm) > LOOKAHEAD + 2 else warm
    if len(timed) >= 2:
        a, b = timed[0], timed[-1]
        out["steps_per_s"] = ((_num(b["env_steps"]) - _num(a["env_steps"]))
                              / (_num(b["wall_s"]) - _num(a["wall_s"])))

    def mean(key: str) -> float | None:
        values = [_num(r.get(key)) for r in warm]
        values = [v for v in values if not math.isnan(v)]
        return statistics.fmean(values) if values else None

    out.update(learner_busy=mean("learner_busy"), policy_lag=mean("policy_lag"),
               learn_s=mean("learn_s"), rollout_s=mean("rollout_s"),
               learn_over_rollout=(mean("learn_s") or 0) / (mean("rollout_s") or math.inf))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--kinds", nargs="+", default=["cpu", "sleep", "learner", "cpu-stale1"],
                   choices=list(KINDS))
    p.add_argument("--env-step-cost", type=float, default=0.002,
                   help="CPU seconds burnt per env step (cpu row)")
    p.add_argument("--sleep", type=float, default=0.002,
                   help="seconds each env step sleeps (sleep row)")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--train-frequency", type=int, default=8)
    p.add_argument("--learner-hidden", type=int, default=256)
    p.add_argument("--learner-train-frequency", type=int, default=2)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--iterations", type=int, default=16, help="iterations per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/apex.json")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.iterations, args.actors = 1, 6, [1, 2]
        args.kinds = ["cpu", "learner"]
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SLEEPY)
        for seed in range(1, args.repeats + 1):
            for kind in args.kinds:
                for n in [n for n in args.actors if n in KINDS[kind] or not KINDS[kind]]:
                    got = run_once(Path(tmp) / f"{kind}-{n}-{seed}", kind, n, seed, args, site)
                    runs.setdefault(f"{kind}/{n}", []).append(got)
                    print(f"{kind} actors={n} seed={seed}: "
                          f"{fmt(got.get('steps_per_s'))} steps/s, busy "
                          f"{fmt(got.get('learner_busy'))}, load "
                          f"{got['load_before'].get('load_1m')}", flush=True)
                    if "error" in got:
                        print(got["error"], file=sys.stderr)
    results = {"runs": runs, "settings": {k: (str(v) if isinstance(v, Path) else v)
                                          for k, v in vars(args).items()},
               "machine": machine_info()}
    text = report(results)
    print(text)
    if not args.quick:
        write_json(args.json, results)
        update_section(ROOT / "benchmarks/apex.md", "apex", text)
    return 0


def _cell(runs: list[dict[str, Any]], key: str) -> float | None:
    return median([r.get(key) for r in runs if "error" not in r])


def report(results: dict[str, Any]) -> str:
    """The markdown section: one row per env kind and actor count."""
    s, runs = results["settings"], results["runs"]
    loads = [r[w].get("load_1m") for rs in runs.values() for r in rs
             for w in ("load_before", "load_after") if r.get(w)]
    rows = []
    for kind in s["kinds"]:
        peer = kind.removesuffix("-stale0").removesuffix("-stale1")
        base = _cell(runs.get(f"{peer}/1", []), "steps_per_s")
        share = _cell(runs.get(f"{peer}/1", []), "learn_over_rollout")
        for n in s["actors"]:
            cell = runs.get(f"{kind}/{n}", [])
            if not cell:
                continue
            sps = _cell(cell, "steps_per_s")
            speedup = sps / base if sps and base else None
            env_bound = share is not None and n > 1 and kind != "learner"
            ceiling = 2 / (1 + 2 * share) if env_bound else None
            even = 2 / (1 + share) if env_bound else None
            label = {"cpu": f"CartPole + {s['env_step_cost']} CPU s/step",
                     "cpu-stale1": "the CPU env, apex:stale=1 (x its 1-actor run)",
                     "sleep-stale1": "the sleeping env, apex:stale=1 (x its 1-actor run)",
                     # runs recorded when stale=1 was the default, and stale=0 the A/B:
                     "cpu-stale0": "the CPU env, apex:stale=0 (x its 1-actor run)",
                     "sleep-stale0": "the sleeping env, apex:stale=0 (x its 1-actor run)",
                     "sleep": f"CartPole + {s['sleep']} s sleep/step",
                     "learner": f"CartPole, learner-bound ({s['learner_hidden']} hidden, a "
                                f"step per {s['learner_train_frequency']} env steps)"}[kind]
            rows.append([label, n, fmt(sps), fmt(speedup), fmt(ceiling), fmt(even),
                         fmt(_cell(cell, "learner_busy")), fmt(_cell(cell, "policy_lag")),
                         fmt(_cell(cell, "learn_over_rollout")),
                         sum("error" not in r for r in cell)])
    head = (f"Medians of {s['repeats']} repeat(s) (seeds 1..{s['repeats']}), {s['workers']} "
            f"workers of the embedded cluster (one CPU slot each), {s['num_envs']} envs x "
            f"{s['num_steps']} steps per actor per iteration, {s['iterations']} iterations per "
            f"run, DQN {s['hidden']}x{s['hidden']}, one gradient step per "
            f"{s['train_frequency']} env steps; 1-minute load average "
            f"{fmt(min(loads)) if loads else '?'}-{fmt(max(loads)) if loads else '?'} during "
            "the runs on 2 cores shared with other work.")
    table = markdown_table(
        ["env", "actors", "env-steps/s", "x 1 actor", "ceiling (this placement)",
         "ceiling (even split)", "learner busy", "policy lag", "learn s / rollout s", "runs"],
        rows)
    return head + "\n\n" + table


if __name__ == "__main__":
    raise SystemExit(main())
