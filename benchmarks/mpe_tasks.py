"""MAPPO/IPPO on every mpe2 task: short training runs, then returns against random teams.

Each (task, seed) trains in this process with :func:`marl.mappo.train_inline` (no Dask: the
numbers are the algorithm's, not the scheduler's), then evaluates ``--episodes`` fresh
episodes in three match-ups (:func:`marl.mappo.evaluate_teams`): the teams as trained, each
trained team against uniformly random other teams, and every team random. Random teams
sample uniformly whatever the evaluation mode.

Run::

    python benchmarks/mpe_tasks.py --json benchmarks/results/mpe_tasks.json \\
        --md benchmarks/mpe_tasks.md
    python benchmarks/mpe_tasks.py --tasks simple_tag_vs_random_prey --seeds 0 1 2 \\
        --iterations 100 --num-envs 128

``simple_tag`` runs the batched :class:`marl.simple_tag.SimpleTag`; every other task runs
mpe2's own env through :class:`marl.pettingzoo.PettingZooBatchEnv` (a Python loop over
envs, ~100x slower per step: hence the short runs).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl.mappo import EnvSpec, MAPPOHyper, ModelSpec, RolloutSpec, evaluate_teams, train_inline
from marl.mappo_env import MPE_TASKS

TASKS: dict[str, dict[str, Any]] = {
    name: {"env": name if name != "simple_tag" else "mpe2.simple_tag_v3", "random": ()}
    for name in MPE_TASKS
}
TASKS["simple_tag_batched"] = {"env": "simple_tag", "random": ()}
TASKS["simple_tag_vs_random_prey"] = {"env": "simple_tag", "random": ("good",)}


def run_task(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one task with one seed and evaluate it; returns the row for the JSON."""
    task = TASKS[name]
    env = EnvSpec(task["env"], max_cycles=args.max_cycles)
    model = ModelSpec(critic=args.critic)
    hp = MAPPOHyper(update_epochs=args.update_epochs, learning_rate=args.learning_rate)
    load0, t0 = os.getloadavg()[0], time.time()
    run = train_inline(env, args.iterations, args.num_envs, seed=seed, model=model, hp=hp,
                       rollout=RolloutSpec(random_teams=task["random"]))
    train_s = time.time() - t0
    ev = evaluate_teams(env, model, run.learner.weights(), seed=1000 + seed,
                        episodes=args.episodes, deterministic=not args.sampled,
                        random_teams=task["random"])
    return {"task": name, "env": task["env"], "random_teams": list(task["random"]),
            "seed": seed, "critic": args.critic, "iterations": args.iterations,
            "num_envs": args.num_envs, "env_steps": run.history[-1]["env_steps"],
            "train_s": train_s, "eval_s": time.time() - t0 - train_s,
            "load_start": load0, "load_end": os.getloadavg()[0],
            "eval_mode": "sampled" if args.sampled else "greedy", "eval": ev}


def _cell(rows: list[dict[str, Any]], key: str, team: str) -> str:
    """Mean over seeds of a team's eval mean, ± the standard error of that mean from the
    episodes (seeds' s.e. combined), and the seeds' range when more than one."""
    means = [r["eval"].get(f"{key}_mean/{team}") for r in rows]
    if any(m is None for m in means):
        return "-"
    ses = [r["eval"][f"{key}_se/{team}"] for r in rows]
    cell = f"{np.mean(means):.1f} ± {np.sqrt(np.sum(np.square(ses))) / len(ses):.1f}"
    if len(means) > 1:
        cell += f" ({min(means):.1f}..{max(means):.1f})"
    return cell


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table: one line per (task, team)."""
    lines = ["| task | team | critic | env steps x seeds | as trained | trained vs random "
             "| all random | train s | load |", "|---|---|---|---|---:|---:|---:|---:|---|"]
    tasks = list(dict.fromkeys((r["task"], r["critic"]) for r in rows))
    for task, critic in tasks:
        mine = [r for r in rows if r["task"] == task and r["critic"] == critic]
        teams = [k.split("/", 1)[1] for k in mine[0]["eval"] if k.startswith("eval_return_mean/")]
        load = (f"{min(r['load_start'] for r in mine):.1f}-"
                f"{max(r['load_end'] for r in mine):.1f}")
        for team in teams:
            random = team in mine[0]["random_teams"]
            lines.append(
                f"| {task} | {team}{' (random)' if random else ''} | {critic} | "
                f"{mine[0]['env_steps']:,} x {len(mine)} | {_cell(mine, 'eval_return', team)} | "
                f"{_cell(mine, 'eval_vs_random_return', team)} | "
                f"{_cell(mine, 'eval_random_return', team)} | "
                f"{np.median([r['train_s'] for r in mine]):.0f} | {load} |")
    return "\n".join(lines)


def spread_as_published(per_agent: float, agents: int = 3, steps: int = 25) -> float:
    """Our simple spread return (mpe2, ``local_ratio=0.5``: per agent per episode, the mean
    over agents) in the units of the MAPPO paper's code (``marlbenchmark/on-policy``:
    every agent gets the sum over agents of the original MPE rewards, each of which holds
    the whole landmark term and a -1 per step for the agent colliding with itself; logged
    as the mean step reward times the episode length).

    With ``L`` the landmark term and ``C`` the colliding pairs, summed over an episode, ours
    is ``0.5 L - 0.5 (2 C / N)`` per agent and theirs ``N L - 2 C - N T``; for ``N = 3`` both
    collision terms match and theirs = ``2 N`` ours - ``N T`` (the self-collisions).

    Examples
    --------
    >>> spread_as_published(-7.5)
    -120.0
    """
    if agents != 3:
        raise ValueError("the conversion is exact for N = 3 only (C's weights differ otherwise)")
    return 2 * agents * per_agent - agents * steps


def published_table(rows: list[dict[str, Any]]) -> str:
    """simple_spread rows (``--critic central``: MAPPO, ``local``: IPPO) against random
    teams, in our units and in the MAPPO code's units (:func:`spread_as_published`)."""
    lines = ["| algorithm | env steps x seeds | ours (per agent) | ours, in the paper's units "
             "| all random (per agent) | all random, paper's units | eval episodes |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for critic, algo in (("central", "MAPPO"), ("local", "IPPO")):
        mine = [r for r in rows if r["task"] == "simple_spread" and r["critic"] == critic]
        if not mine:
            continue
        ours = [r["eval"]["eval_return_mean/agent"] for r in mine]
        ses = [r["eval"]["eval_return_se/agent"] for r in mine]
        rand = [r["eval"]["eval_random_return_mean/agent"] for r in mine]
        rse = [r["eval"]["eval_random_return_se/agent"] for r in mine]
        se, rs = (float(np.sqrt(np.sum(np.square(x))) / len(x)) for x in (ses, rse))
        spread = f" ({min(ours):.1f}..{max(ours):.1f})" if len(ours) > 1 else ""
        lines.append(
            f"| {algo} (`--critic {critic}`) | {mine[0]['env_steps']:,} x {len(mine)} | "
            f"{np.mean(ours):.1f} ± {se:.1f}{spread} | "
            f"{spread_as_published(float(np.mean(ours))):.0f} ± {6 * se:.0f} | "
            f"{np.mean(rand):.1f} ± {rs:.1f} | "
            f"{spread_as_published(float(np.mean(rand))):.0f} ± {6 * rs:.0f} | "
            f"{mine[0]['eval']['eval_episodes']} x {len(mine)} |")
    return "\n".join(lines)


def main() -> None:
    """Parse flags, run every (task, seed), write JSON and the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(MPE_TASKS), choices=list(TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--max-cycles", type=int, default=25)
    p.add_argument("--update-epochs", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=7e-4)
    p.add_argument("--critic", choices=["central", "local"], default="central")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--sampled", action="store_true", help="evaluate sampled actions (default "
                   "greedy; random teams are uniform either way)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--md", type=Path)
    p.add_argument("--merge", action="store_true", help="add to the rows already in --json")
    p.add_argument("--published", action="store_true", help="only print the simple_spread "
                   "rows of --json against the MAPPO paper's units (runs nothing)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    if (args.merge or args.published) and args.json and args.json.exists():
        rows = json.loads(args.json.read_text())["rows"]
    if args.published:
        print(published_table(rows))
        return
    for name in args.tasks:
        for seed in args.seeds:
            row = run_task(name, seed, args)
            rows = [r for r in rows if (r["task"], r["seed"], r["critic"]) != (
                name, seed, args.critic)] + [row]
            print(json.dumps({k: v for k, v in row.items() if k != "eval"}), flush=True)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"rows": rows}, indent=1))
    print(table(rows))
    if args.md:
        args.md.write_text(table(rows) + "\n")


if __name__ == "__main__":
    main()
