"""One algorithm, five placements: env-steps/s and time to eval 475 per distribution (MSRL Fig. 7).

Phases (``--phases``, all by default):

throughput
    CartPole PPO (A3C for ``async``) with ``--envs`` envs in total on ``--workers`` workers;
    one warm-up iteration, then ``--iterations`` measured ones. Env-steps/s is the steady
    state: measured iterations' env steps over their wall time (``metrics.csv``).
costly
    The same with an env whose step burns ``--env-step-cost`` CPU seconds per env (a
    gymnasium-free stand-in for a heavy simulator), at ``--costly-envs`` envs.
single
    ``single`` with ``--single-envs`` numpy-vectorised CartPole envs on one worker, with
    each of ``--single-threads`` torch threads for the update.
scaling
    Env-bound PPO (``actors-learner``, ``data-parallel``) with the costly env and
    ``--scaling-envs`` envs on 1 then 2 workers, alternating, for the speed-up.
learn
    500k env steps per distribution, 8 envs x 128 steps (batch 1024, 4 minibatches of 256,
    CleanRL's CartPole settings; central-inference 32 x 32, see ``LEARN_LAYOUT``),
    checkpoints every 4 iterations; afterwards each checkpoint
    is evaluated greedily (10 episodes) in order until one reaches ``--threshold``: its env
    steps and the run's wall clock at that iteration are the time to 475.

Medians over ``--repeats`` repeats (seeds 1, 2, ...); repeats are the outer loop, so load
from other work on the machine spreads over all cells. Results: ``--json`` and the tables
between markers in ``--md``. Run ``python benchmarks/distributions.py --help``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import shlex
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import (
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    update_section,
    write_json,
)
from distributed import Client

from daskrl.algos.a2c import A2CActor
from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.env_runner import StepCost
from daskrl.cluster.local import local_cluster
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.driver import RunSettings, train

DISTS = ("actors-learner", "central-inference", "data-parallel", "single", "async")
PPO = load_graph(str(ROOT / "graphs" / "ppo.py"))
A3C = load_graph(str(ROOT / "graphs" / "a3c.py"))
LEARN_LAYOUT: dict[str, dict[str, int]] = {
    "actors-learner": {"num_actors": 2, "num_envs": 4},
    # a step costs central-inference ~3 chained tasks whatever the env count, so it learns
    # with 32 envs x 32 steps (same batch of 1024): 8 envs x 128 steps took ~1 h per run here
    "central-inference": {"num_actors": 2, "num_envs": 16, "num_steps": 32},
    "data-parallel": {"num_actors": 2, "num_envs": 4},
    "single": {"num_actors": 1, "num_envs": 8},
    "async": {},  # graphs/a3c.py's defaults: 2 actors x 8 envs, 8-step gradients
}
"""Learning runs: one iteration = 1024 env steps, 4 minibatches of 256, everywhere."""


def costly_ppo_actor(config: Any, cost: float, seed: int) -> VecEnvActor:
    """graphs/ppo.py's actor with a CPU cost per env step (pickled by value to the workers)."""
    return VecEnvActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                       config.gae_lambda, step_cost=StepCost(cpu_s=cost))


def costly_a3c_actor(config: Any, cost: float, seed: int) -> A2CActor:
    """graphs/a3c.py's actor with a CPU cost per env step."""
    return A2CActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                         config.gae_lambda, StepCost(cpu_s=cost), config.rollout_steps,
                    config.hyper())


def layout(dist: str, envs: int, workers: int) -> dict[str, int]:
    """Actors and envs per actor for ``envs`` envs in total on ``workers`` workers.

    One replica per worker (``single``: one fused replica; ``async``: at least 2 actors).
    """
    if dist == "single":
        return {"num_actors": 1, "num_envs": envs}
    actors = max(2, workers) if dist == "async" else workers
    return {"num_actors": actors, "num_envs": max(1, envs // actors)}


def build(dist: str, fields: dict[str, Any], cost: float = 0.0) -> Any:
    """The algorithm (PPO, or A3C for ``async``) with ``fields`` set and an env step cost."""
    module = A3C if dist == "async" else PPO
    config = module.Config(**fields)
    algo = module.build(config)
    if cost:
        maker = costly_a3c_actor if dist == "async" else costly_ppo_actor
        algo = dataclasses.replace(algo, make_actor=partial(maker, config, cost))
    return algo


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def throughput(client: Client, dist: str, algo: Any, iterations: int, seed: int) -> dict:
    """Warm-up and ``iterations`` measured iterations; steady env-steps/s and overhead.

    ``async`` gets two warm-up iterations: its learner task holds no resource, and the
    driver's one-time annotation check waits up to 10 s for such a final task.
    """
    d = get_distribution(dist)
    warmup = 2 if d.name == "async" else 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        settings = RunSettings(out=out, steps=(warmup + iterations) * algo.steps_per_iteration,
                               seed=seed, eval=False, progress=False, tensorboard=False,
                               checkpoint_every=10**9)
        summary = train(client, algo, d, settings)
        rows = read_rows(out / "metrics.csv")[warmup:]
    steps = sum(float(r["iteration_env_steps"]) for r in rows)
    wall = sum(float(r["iteration_s"]) for r in rows)
    shares = [float(r["overhead_s"]) / float(r["iteration_s"]) for r in rows
              if float(r["iteration_s"]) > 0]
    return {"env_steps_per_s": steps / wall if wall > 0 else None,
            "iteration_s": median(float(r["iteration_s"]) for r in rows),
            "overhead_share": median(shares), "run_env_steps_per_s": summary["env_steps_per_s"],
            "placement": summary["placement"]}


def learn(client: Client, dist: str, algo: Any, steps: int, seed: int, threshold: float,
          keep: Path | None) -> dict:
    """Train ``steps`` env steps; find the first checkpoint whose greedy eval >= threshold."""
    d = get_distribution(dist)
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or Path(tmp)
        settings = RunSettings(out=out, steps=steps, seed=seed, progress=False,
                               tensorboard=False, checkpoint_every=4, keep_checkpoints=10**6)
        summary = train(client, algo, d, settings)
        rows = {int(r["iteration"]): r for r in read_rows(out / "metrics.csv")}
        hit: dict[str, Any] = {"steps_to_threshold": None, "wall_to_threshold_s": None}
        for path in list_checkpoints(out / "checkpoints"):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
            score = algo.evaluate(ckpt["learner"]["model"], 10_000 + seed)["eval_return_mean"]
            if score >= threshold:
                row = rows[int(ckpt["iteration"])]
                hit = {"steps_to_threshold": int(row["env_steps"]),
                       "wall_to_threshold_s": float(row["wall_s"]), "eval_at_hit": score}
                break
    return {**hit, "final_eval": summary.get("eval_return_mean"),
            "env_steps": summary["env_steps"], "wall_s": summary["wall_s"],
            "env_steps_per_s": summary["env_steps_per_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phases", default="throughput,costly,single,learn")
    p.add_argument("--dists", nargs="+", default=list(DISTS), choices=DISTS)
    p.add_argument("--envs", nargs="+", type=int, default=[8, 64, 256])
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    p.add_argument("--iterations", type=int, default=3, help="measured iterations per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--env-step-cost", type=float, default=1e-3,
                   help="CPU seconds burnt per env per step in the costly phase")
    p.add_argument("--costly-envs", nargs="+", type=int, default=[8, 64])
    p.add_argument("--single-envs", type=int, default=1024)
    p.add_argument("--single-threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--scaling-envs", type=int, default=64)
    p.add_argument("--scaling-costs", nargs="+", type=float, default=[5e-4, 1e-3],
                   help="env step costs (CPU s per env) of the scaling phase")
    p.add_argument("--learn-steps", type=int, default=500_000)
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--keep-runs", type=Path, default=None, help="keep learning runs here")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/distributions.json")
    p.add_argument("--md", type=Path, default=ROOT / "benchmarks/distributions.md")
    p.add_argument("--merge", action="store_true",
                   help="keep the other phases' runs already in --json")
    p.add_argument("--tables-only", action="store_true",
                   help="rewrite --md's tables from --json without running anything")
    args = p.parse_args(argv)
    if args.tables_only:
        update_section(args.md, "distributions-results",
                       tables(json.loads(args.json.read_text())))
        return 0
    phases = set(args.phases.split(","))
    torch.set_num_threads(1)  # offline evaluation only; the cores are the workers'
    t_start, load_before = time.time(), load_average()
    clusters = {w: local_cluster([{"CPU": 1}] * w) for w in sorted(set(args.workers) | {1, 2})}
    clients = {w: Client(c) for w, c in clusters.items()}
    runs: list[dict[str, Any]] = []

    def record(phase: str, **entry: Any) -> None:
        runs.append({"phase": phase, **entry})
        shown = {k: v for k, v in entry.items() if k != "placement"}
        print(phase, shown, file=sys.stderr, flush=True)

    try:
        for r in range(args.repeats):
            seed = 1 + r
            for w in args.workers:
                for dist in args.dists:
                    grid = [("throughput", n, 0.0) for n in args.envs if "throughput" in phases]
                    grid += [("costly", n, args.env_step_cost) for n in args.costly_envs
                             if "costly" in phases]
                    for phase, n, cost in grid:
                        algo = build(dist, layout(dist, n, w), cost)
                        res = throughput(clients[w], dist, algo, args.iterations, seed)
                        record(phase, dist=dist, envs=n, workers=w, cost=cost, repeat=r, **res)
            if "single" in phases:
                algo = build("single", layout("single", args.single_envs, 1))
                for threads in args.single_threads:
                    res = throughput(clients[1], f"single:threads={threads}", algo,
                                     args.iterations, seed)
                    record("single", dist="single", envs=args.single_envs, workers=1,
                           threads=threads, repeat=r, **res)
            if "scaling" in phases:
                for cost in args.scaling_costs:
                    for dist in ("actors-learner", "data-parallel"):
                        for w in (1, 2):
                            algo = build(dist, layout(dist, args.scaling_envs, w), cost)
                            res = throughput(clients[w], dist, algo, args.iterations, seed)
                            record("scaling", dist=dist, envs=args.scaling_envs, workers=w,
                                   cost=cost, repeat=r, **res)
            if "learn" in phases:
                for dist in args.dists:
                    algo = build(dist, LEARN_LAYOUT[dist])
                    keep = args.keep_runs / f"{dist}-{seed}" if args.keep_runs else None
                    res = learn(clients[2], dist, algo, args.learn_steps, seed, args.threshold,
                                keep)
                    record("learn", dist=dist, workers=2, repeat=r, layout=LEARN_LAYOUT[dist],
                           **res)
    finally:
        for c in clients.values():
            c.close()
        for c in clusters.values():
            c.close()
    command = "python benchmarks/distributions.py " + shlex.join(sys.argv[1:] if argv is None
                                                                 else argv)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    machine = {**machine_info(), "load_before": load_before, "load_after": load_average()}
    result = {"benchmark": "distributions", "command": command,
              "duration_s": time.time() - t_start, "machine": machine, "settings": settings,
              "runs": runs, "sessions": [{"command": command, "phases": sorted(phases),
                                          "machine": machine}]}
    if args.merge and args.json.exists():
        old = json.loads(args.json.read_text())
        result["runs"] = [r for r in old["runs"] if r["phase"] not in phases] + runs
        kept = [{**x, "phases": [q for q in x["phases"] if q not in phases]}
                for x in old.get("sessions", [])]  # phases re-run now leave older sessions
        result["sessions"] = [x for x in kept if x["phases"]] + result["sessions"]
        result["settings"] = {**old["settings"], **{k: v for k, v in settings.items()
                                                    if k not in ("phases", "merge")}}
        result["duration_s"] += old.get("duration_s", 0.0)
    write_json(args.json, result)
    update_section(args.md, "distributions-results", tables(result))
    print(f"wrote {args.json} and {args.md}", file=sys.stderr)
    return 0


def cell(runs: list[dict], key: str = "env_steps_per_s", missing_as: float | None = None,
         **match: Any) -> float | None:
    """Median of ``key`` over the runs matching ``match`` (missing values as ``missing_as``)."""
    return median((r.get(key) for r in runs if all(r.get(k) == v for k, v in match.items())),
                  missing_as=missing_as)


def tables(result: dict[str, Any]) -> str:
    """The markdown tables of one benchmark result."""
    runs, s = result["runs"], result["settings"]
    out = []
    for sess in result.get("sessions", [{"command": result["command"],
                                         "machine": result["machine"], "phases": []}]):
        m = sess["machine"]
        out.append(f"- `{sess['command']}` ({', '.join(sess['phases'])}): {m['usable_cpus']} "
                   f"CPUs ({m['cpu_model']}), load average {m['load_before']['load_1m']:.1f} "
                   f"before, {m['load_after']['load_1m']:.1f} after.")
    out.append(f"\nMedians of {s['repeats']} repeats; env-steps/s in steady state (warm-up "
               "iterations left out).")
    costly = sorted({r["cost"] for r in runs if r["phase"] == "costly"})
    for phase, title, envs in (("throughput", "CartPole env-steps/s", s["envs"]),
                               ("costly", "env-steps/s, env step costing "
                                f"{', '.join(f'{c:g}' for c in costly)} CPU s per env",
                                s["costly_envs"])):
        if not any(r["phase"] == phase for r in runs):
            continue
        heads = ["distribution"] + [f"{n} envs, {w}w" for n in envs for w in s["workers"]]
        heads += [f"{n} envs 2w/1w" for n in envs] if {1, 2} <= set(s["workers"]) else []
        rows = []
        for dist in s["dists"]:
            row: list[Any] = [dist] + [cell(runs, phase=phase, dist=dist, envs=n, workers=w)
                                       for n in envs for w in s["workers"]]
            if {1, 2} <= set(s["workers"]):
                row += [ratio(cell(runs, phase=phase, dist=dist, envs=n, workers=2),
                              cell(runs, phase=phase, dist=dist, envs=n, workers=1))
                        for n in envs]
            rows.append(row)
        out += [f"\n**{title}**\n", markdown_table(heads, rows)]
        share = [[dist] + [cell(runs, "overhead_share", phase=phase, dist=dist, envs=n,
                                workers=w) for n in envs for w in s["workers"]]
                 for dist in s["dists"]]
        out += [f"\nDask overhead share of an iteration ({phase}):\n",
                markdown_table(heads[: 1 + len(envs) * len(s["workers"])], share)]
    if any(r["phase"] == "single" for r in runs):
        n = next(r["envs"] for r in runs if r["phase"] == "single")
        rows = [[str(t), cell(runs, phase="single", threads=t),
                 max(r["env_steps_per_s"] for r in runs
                     if r["phase"] == "single" and r.get("threads") == t),
                 cell(runs, "run_env_steps_per_s", phase="single", threads=t),
                 cell(runs, "iteration_s", phase="single", threads=t)]
                for t in sorted({r.get("threads") for r in runs if r["phase"] == "single"})]
        out += [f"\n**single, {n} numpy-vectorised CartPole envs, 1 worker**\n",
                markdown_table(["torch threads", "env-steps/s (median)", "best repeat",
                                "whole run incl. first iteration", "iteration s"], rows)]
    if any(r["phase"] == "scaling" for r in runs):
        rows = []
        costs = sorted({r["cost"] for r in runs if r["phase"] == "scaling"})
        for cost in costs:
            for dist in ("actors-learner", "data-parallel"):
                mine = [r for r in runs if r["phase"] == "scaling" and r["dist"] == dist
                        and r["cost"] == cost]
                one = [r for r in mine if r["workers"] == 1]
                two = {r["repeat"]: r for r in mine if r["workers"] == 2}
                pairs = [ratio(two[o["repeat"]]["env_steps_per_s"], o["env_steps_per_s"])
                         for o in one if o["repeat"] in two]
                rows.append([f"{cost:g}", dist,
                             cell(mine, workers=1), cell(mine, workers=2), median(pairs),
                             min((p for p in pairs if p is not None), default=None)])
        out += [f"\n**Env-bound scaling: {s['scaling_envs']} envs, 1 -> 2 workers "
                "(repeats paired, 1 worker then 2)**\n",
                markdown_table(["env step CPU s", "distribution", "1 worker", "2 workers",
                                "speed-up (median)", "worst pair"], rows)]
    if any(r["phase"] == "learn" for r in runs):
        rows = []
        for dist in s["dists"]:
            mine = [r for r in runs if r["phase"] == "learn" and r["dist"] == dist]
            hits = sum(r["steps_to_threshold"] is not None for r in mine)
            rows.append([dist, ", ".join(f"{k}={v}" for k, v in LEARN_LAYOUT[dist].items())
                         or "a3c defaults",
                         cell(runs, "steps_to_threshold", math.inf, phase="learn", dist=dist),
                         cell(runs, "wall_to_threshold_s", math.inf, phase="learn", dist=dist),
                         f"{hits}/{len(mine)}", cell(runs, "final_eval", phase="learn", dist=dist),
                         cell(runs, "env_steps_per_s", phase="learn", dist=dist)])
        out += [f"\n**Learning: first checkpoint with greedy eval >= {s['threshold']:g}, "
                f"{s['learn_steps']:,} env steps, 2 workers**\n",
                markdown_table(["distribution", "layout", "env steps to 475", "wall s to 475",
                                "runs reaching 475", "final eval", "env-steps/s"], rows)]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
