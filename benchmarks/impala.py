"""IMPALA's free-running actors against lockstep and one-step-stale ``actors-learner``.

The same graph (``graphs/impala.py``: a V-trace actor-critic, one gradient step per batch)
runs under three distributions on ``--workers`` workers of the embedded cluster:

``impala``
    free-running actors (``in_flight`` rollouts each), the learner updates on each batch as
    it lands;
``lockstep``
    ``actors-learner``: every rollout waits for the previous update (lag 0);
``stale=1``
    ``actors-learner:stale=1``: rollouts act one update behind, overlapping the update.

Phases (``--phases``, all by default):

speed
    CartPole-v1 and the same with ``--env-step-cost`` CPU seconds burnt per env step, with
    1, 2 and 4 actors: steady env-steps/s (first iteration left out), the learner's busy
    share (``impala``: its ``learner_busy``; ``actors-learner``: learner task time over
    iteration time) and the mean policy lag (updates between the acting weights and the
    learner's).
learn
    CartPole-v1 with ``--learn-actors`` actors up to ``--learn-steps`` env steps, evaluated
    every ``--eval-steps`` env steps (10 greedy episodes, ``--eval-every``): wall clock and
    env steps at the first evaluation reaching ``--threshold``, and the final evaluation.
mujoco
    ``--mujoco-env`` (Hopper-v5; continuous actions, the Gaussian head) with
    ``--learn-actors`` actors for a fixed budget of ``--mujoco-steps`` env steps: steady
    env-steps/s, learner busy share, mean policy lag, and the final evaluation (10 greedy
    episodes) after the budget.

Medians over ``--repeats`` (seeds 1, 2, ...; repeats are the outer loop so that load from
other work on the machine spreads over all cells); the load average is recorded before and
after each run. Run ``python benchmarks/impala.py --help``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

SYSTEMS = {"impala": "impala", "lockstep": "actors-learner", "stale=1": "actors-learner:stale=1"}
"""Column name -> ``--distribution``. ``--systems`` also takes a distribution spec of its own
(``impala:in_flight=1``), named by itself."""


def run_once(out: Path, system: str, actors: int, seed: int, steps: int, workers: int,
             step_cost: float = 0.0, eval_every: int = 0, env: str = "CartPole-v1",
             final_eval: bool = False, extra: Sequence[str] = ()) -> dict[str, Any]:
    """One ``daskrl train graphs/impala.py`` process; its metrics boiled down.

    ``eval_every`` iterations an evaluation (and the final one); ``final_eval`` alone: only
    the final one; ``extra``: more flags of the graph (``--learning-rate 5e-4``)."""
    args = [sys.executable, "-m", "daskrl.cli", "train", "graphs/impala.py", "--env", env,
            "--workers", str(workers), "--num-actors", str(actors), "--distribution",
            SYSTEMS.get(system, system), "--seed", str(seed), "--steps", str(steps), "--out",
            str(out), "--no-progress", "--env-step-cost", str(step_cost), *extra]
    if eval_every:
        args += ["--eval-every", str(eval_every)]
    elif not final_eval:
        args += ["--no-eval"]
    if actors > workers:  # more actors than CPU slots: each actor asks for its share of one
        args += ["--resources", f"rollout=CPU:{workers / actors:g}"]
    before = load_average()
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    after = load_average()
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "load_before": before, "load_after": after}
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    summary = json.loads((out / "summary.json").read_text())
    return {**boil(rows), "process_s": wall, "final_eval": summary.get("eval_return_mean"),
            "load_before": before, "load_after": after}


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def boil(rows: list[dict[str, str]], threshold: float = 475.0) -> dict[str, Any]:
    """Steady env-steps/s, learner busy share, mean policy lag, time to ``threshold``."""
    train = [r for r in rows if _num(r.get("iteration_s")) == _num(r.get("iteration_s"))]
    first, last = train[0], train[-1]
    steady = (_num(last["env_steps"]) - _num(first["env_steps"])) / max(
        1e-9, _num(last["wall_s"]) - _num(first["wall_s"]))
    later = train[1:] or train
    busy = [_num(r.get("learner_busy")) for r in later]
    busy = [b for b in busy if not math.isnan(b)]
    if not busy:  # a lockstep or stale learner: its task time over the iteration's
        learn = sum(_num(r.get("learn_s")) for r in later)
        total = sum(_num(r.get("iteration_s")) for r in later)
        busy = [learn / total] if total > 0 else []
    lags = [_num(r.get("policy_lag")) for r in later]
    lags = [x for x in lags if not math.isnan(x)]
    by_iteration = {int(_num(r["iteration"])): r for r in train}
    reached = None
    evals: list[tuple[float, float]] = []  # (env steps, return) of each evaluation
    for r in rows:  # eval rows name the iteration whose weights they scored
        score = _num(r.get("eval_return_mean"))
        if math.isnan(score):
            continue
        at = by_iteration.get(int(_num(r.get("eval_iteration"))), r)
        evals.append((_num(at["env_steps"]), score))
        if reached is None and score >= threshold:
            reached = {"wall_s": _num(at["wall_s"]), "env_steps": _num(at["env_steps"])}
    # the mean evaluation over the run's last fifth: whether what was reached was kept
    late = [v for s, v in evals if s >= 0.8 * _num(last["env_steps"])]
    idle = [_num(r.get("learner_idle_s")) for r in later]
    walls = [_num(r.get("iteration_s")) for r in later]
    idle_share = (sum(idle) / sum(walls) if idle and not any(map(math.isnan, idle))
                  and sum(walls) > 0 else None)
    return {"env_steps_per_s": steady, "learner_busy": statistics.fmean(busy) if busy else None,
            "learner_idle_share": idle_share,
            "policy_lag": statistics.fmean(lags) if lags else 0.0,
            "to_threshold": reached, "iterations": len(train), "evals": evals,
            "late_eval": statistics.fmean(late) if late else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3,
                   help="seeds per cell; the systems alternate within each seed")
    p.add_argument("--first-seed", type=int, default=1,
                   help="seeds first-seed .. first-seed + repeats - 1")
    p.add_argument("--phases", default="speed,learn",
                   help="comma-separated: speed (throughput, busy share, lag), learn (CartPole "
                        "to --threshold), mujoco (--mujoco-env's final return)")
    p.add_argument("--workers", type=int, default=2, help="workers of the embedded cluster")
    p.add_argument("--actors", default="1,2,4", help="actor counts of the speed phase")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated columns: {', '.join(SYSTEMS)} or a distribution "
                        "spec such as impala:in_flight=1")
    p.add_argument("--speed-steps", type=int, default=40_000,
                   help="env steps of each plain-CartPole speed run")
    p.add_argument("--costly-steps", type=int, default=8_192,
                   help="env steps of each speed run with --env-step-cost")
    p.add_argument("--env-step-cost", type=float, default=0.001,
                   help="extra CPU seconds each env step burns in the costly speed runs")
    p.add_argument("--learn-actors", type=int, default=2,
                   help="actors of the learn and mujoco phases")
    p.add_argument("--learn-steps", type=int, default=500_000,
                   help="env steps of each learn run (the learning rate anneals over them)")
    p.add_argument("--eval-steps", type=int, default=10_240,
                   help="env steps between evaluations of a learn run")
    p.add_argument("--threshold", type=float, default=475.0,
                   help="the evaluation return whose first crossing is timed")
    p.add_argument("--mujoco-env", default="Hopper-v5")
    p.add_argument("--mujoco-steps", type=int, default=200_000,
                   help="env steps of each mujoco run")
    p.add_argument("--graph-args", default="",
                   help="more flags for every run, e.g. '--learning-rate 5e-4'")
    p.add_argument("--quick", action="store_true", help="a smoke test; writes nothing here")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/impala.json",
                   help="where the raw runs and their settings are written")
    p.add_argument("--md", type=Path, default=ROOT / "benchmarks/impala.md",
                   help="the page whose --section gets the tables")
    p.add_argument("--section", default="impala",
                   help="the marked section of --md to write (phases run apart write apart)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.speed_steps, args.costly_steps = 1, 4096, 2048
        args.learn_steps, args.actors, args.mujoco_steps = 8192, "2", 4096
    actors = [int(a) for a in args.actors.split(",")]
    systems = args.systems.split(",")
    for system in systems:
        if system not in SYSTEMS and not system.startswith(("impala:", "actors-learner:")):
            p.error(f"--systems: {system!r} is neither one of {', '.join(SYSTEMS)} nor an "
                    "impala:... or actors-learner:... distribution spec")
    phases = args.phases.split(",")
    results: dict[str, Any] = {"machine": machine_info(), "settings": vars(args) | {
        "json": str(args.json), "md": str(args.md)}, "runs": []}
    tmp = Path(tempfile.mkdtemp(prefix="impala-bench-"))
    for seed in range(args.first_seed, args.first_seed + args.repeats):
        cells: list[tuple[str, str, int, int, float, int]] = []
        if "mujoco" in phases:  # first: the longest runs, while the seed's load is fresh
            cells.append(("mujoco", args.mujoco_env, args.learn_actors, args.mujoco_steps,
                          0.0, 0))
        if "speed" in phases:
            for env, steps, cost in (("CartPole-v1", args.speed_steps, 0.0),
                                     (f"CartPole-v1 + {args.env_step_cost} s/step",
                                      args.costly_steps, args.env_step_cost)):
                cells += [("speed", env, n, steps, cost, 0) for n in actors]
        if "learn" in phases:
            every = max(1, args.eval_steps // (args.learn_actors * 8 * 32))
            cells.append(("learn", "CartPole-v1", args.learn_actors, args.learn_steps, 0.0,
                          every))
        for phase, env, n, steps, cost, every in cells:
            for system in systems:
                out = tmp / f"{phase}-{system}-{n}-{cost}-{seed}"
                got = run_once(out, system, n, seed, steps, args.workers, cost, every,
                               env.split(" + ")[0], final_eval=phase == "mujoco",
                               extra=shlex.split(args.graph_args))
                row = {"phase": phase, "env": env, "system": system, "actors": n, "seed": seed,
                       **got}
                results["runs"].append(row)
                print(json.dumps({k: row.get(k) for k in (
                    "phase", "env", "system", "actors", "seed", "env_steps_per_s",
                    "learner_busy", "policy_lag", "to_threshold", "final_eval", "error")}),
                    flush=True)
                if not args.quick:  # after every run: an interrupted benchmark keeps its part
                    write_json(args.json, results)
                    update_section(args.md, args.section, report(results))
    return 0


def _cell(runs: list[dict[str, Any]], key: str) -> float | None:
    return median([r.get(key) for r in runs if not r.get("error")])


def report(results: dict[str, Any]) -> str:
    """The markdown tables: medians per cell, and the load the runs saw."""
    runs = results["runs"]
    s = results["settings"]
    loads = [r["load_before"]["load_1m"] for r in runs] + [r["load_after"]["load_1m"]
                                                          for r in runs]
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"Medians of {len(seeds)} repeat(s) (seeds {seeds[0]}..{seeds[-1]}), "
             f"{s['workers']} workers of "
             f"the embedded cluster, machine shared with other work: 1-minute load average "
             f"{min(loads):.1f}-{max(loads):.1f} during the runs (2 cores). Ratios between "
             "columns of one row are the comparable numbers."
             + (f" Graph flags of every run: `{s['graph_args']}`." if s.get("graph_args")
                else ""), ""]
    speed = [r for r in runs if r["phase"] == "speed"]
    if speed:
        rows = []
        for env in dict.fromkeys(r["env"] for r in speed):
            for n in sorted({r["actors"] for r in speed if r["env"] == env}):
                cell = {sy: [r for r in speed if (r["env"], r["actors"], r["system"]) ==
                             (env, n, sy)] for sy in SYSTEMS}
                rows.append([env, str(n)]
                            + [_cell(cell[sy], "env_steps_per_s") for sy in SYSTEMS]
                            + [_cell(cell[sy], "learner_busy") for sy in SYSTEMS]
                            + [_cell(cell[sy], "policy_lag") for sy in SYSTEMS])
        heads = ["env", "actors"] + [f"steps/s {sy}" for sy in SYSTEMS] + [
            f"learner busy {sy}" for sy in SYSTEMS] + [f"lag {sy}" for sy in SYSTEMS]
        lines += ["### Throughput, learner busy share, policy lag", "",
                  markdown_table(heads, rows), ""]
    learn = [r for r in runs if r["phase"] == "learn"]
    named = list(dict.fromkeys([*SYSTEMS, *(r["system"] for r in runs)]))
    if learn:
        rows = []
        for sy in named:
            mine = [r for r in learn if r["system"] == sy and not r.get("error")]
            if not mine:
                continue
            wall = [(r["to_threshold"] or {}).get("wall_s", math.inf) for r in mine]
            steps = [(r["to_threshold"] or {}).get("env_steps", math.inf) for r in mine]
            rows.append([sy, median(wall), median(steps), _cell(mine, "final_eval"),
                         _cell(mine, "late_eval"), _cell(mine, "process_s"),
                         f"{sum(r['to_threshold'] is not None for r in mine)}/{len(mine)}"])
        lines += [f"### Wall clock to eval {s['threshold']:g} on CartPole-v1 "
                  f"({s['learn_actors']} actors, at most {s['learn_steps']:,} env steps)", "",
                  markdown_table(["system", "wall s", "env steps", "final eval",
                                  "last-fifth eval", "process s", "reached"], rows), ""]
    mujoco = [r for r in runs if r["phase"] == "mujoco"]
    if mujoco:
        rows = []
        for sy in named:
            mine = sorted((r for r in mujoco if r["system"] == sy and not r.get("error")),
                          key=lambda r: r["seed"])
            if not mine:
                continue
            rows.append([sy, _cell(mine, "env_steps_per_s"), _cell(mine, "learner_busy"),
                         _cell(mine, "policy_lag"), _cell(mine, "process_s"),
                         _cell(mine, "final_eval"),
                         " / ".join("-" if r.get("final_eval") is None
                                    else f"{r['final_eval']:.0f}" for r in mine)])
        lines += [f"### {s['mujoco_env']}, {s['learn_actors']} actors, "
                  f"{s['mujoco_steps']:,} env steps", "",
                  markdown_table(["system", "steps/s", "learner busy", "lag", "process s",
                                  "final eval", "final evals by seed"], rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
