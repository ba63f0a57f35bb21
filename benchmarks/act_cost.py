"""What an actor's step costs, for one or more source trees: the PPO actor's rollout split
into the policy (forward pass and sampling: ``inference_s``), the envs (``env_s``) and the
rest (buffers, reward scaling, GAE), per env step.

Each tree runs in its own process with ``PYTHONPATH=SRC`` and one torch thread, trees
interleaved (the order alternating between repeats) so that a change in the machine's load
hits every tree alike. Each process builds ``VecEnvActor``s, the object daskrl's rollout tasks
call, on CartPole-v1 (8 envs x 128 steps, ``graphs/ppo.py``'s defaults) and HalfCheetah-v5
(1 env x 2048 steps, running normalisation: the learning suite's MuJoCo rows), warms them up
and times several rollouts, keeping the fastest (the least disturbed by other processes).

    git worktree add /tmp/before <commit>
    python benchmarks/act_cost.py --repeats 5 before=/tmp/before after=.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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

HERE = Path(__file__).resolve().parent

CASES = (("CartPole-v1", 8, 128, False, 15), ("HalfCheetah-v5", 1, 2048, True, 5))
"""(env, envs, steps per rollout, running normalisation, timed rollouts)."""

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.normalize import Normalization
out = {}
for env, n, steps, norm, reps in json.loads(sys.argv[1]):
    actor = VecEnvActor(env, n, 0, normalization=Normalization(obs=norm, reward=norm))
    for _ in range(3):
        actor.rollout(steps)
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        batch = actor.rollout(steps)
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, batch["stats"]["inference_s"], batch["stats"]["env_s"],
                    batch["stats"]["rollout_steps"] * n)
    wall, inference, env_s, steps_taken = best
    per = 1e6 / steps_taken
    out[env] = {"rollout_us": wall * per, "inference_us": inference * per, "env_us": env_s * per,
                "other_us": (wall - inference - env_s) * per}
print(json.dumps(out))
"""


def run_tree(src: Path) -> dict[str, dict[str, float]]:
    """One process on ``src``: microseconds per env step of each case, by part."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=env,
                          capture_output=True, text=True, cwd=src, timeout=600)
    if done.returncode:
        raise RuntimeError(f"act_cost child on {src} failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tree_commit(src: Path) -> dict[str, Any]:
    """The commit ``src`` is checked out at and whether its daskrl/ differs from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True)
        return done.stdout.strip()

    return {"path": str(src), "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--", "daskrl"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC",
                        help="source trees to compare (a daskrl checkout or worktree)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "act_cost.json")
    parser.add_argument("--md", type=Path, default=HERE / "act_cost.md")
    parser.add_argument("--section", default="act-cost")
    parser.add_argument("--no-md", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    trees: dict[str, Path] = {}
    for spec in args.trees:
        name, sep, src = spec.partition("=")
        if not sep or not (Path(src) / "daskrl").is_dir():
            parser.error(f"tree {spec!r}: give NAME=SRC, SRC a folder holding daskrl/")
        if name in trees:
            parser.error(f"tree name {name!r} given twice: give each tree its own name")
        trees[name] = Path(src).resolve()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    loads = [load_average()]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for rep in range(args.repeats):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(run_tree(trees[name]))
            print(name, json.dumps(runs[name][-1]), flush=True)
    loads.append(load_average())
    parts = ("rollout_us", "inference_us", "env_us", "other_us")
    medians = {name: {env: {p: median(r[env][p] for r in rs) for p in parts} for env, *_ in CASES}
               for name, rs in runs.items()}
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "trees": {k: tree_commit(v) for k, v in trees.items()}, "runs": runs,
                           "medians": medians})
    rows = [[env, name, *(medians[name][env][p] for p in parts)]
            for env, *_ in CASES for name in trees]
    table = markdown_table(["env", "tree", "rollout us/step", "policy us/step", "env us/step",
                            "rest us/step"], rows)
    cmd = "python benchmarks/act_cost.py --repeats " + f"{args.repeats} " + " ".join(args.trees)
    start, end = loads[0]["load_1m"], loads[-1]["load_1m"]
    body = (f"`{cmd}` (medians over {args.repeats} processes per tree of each one's fastest "
            f"rollout; 1-minute load {start:.1f} at the start, {end:.1f} at the end, "
            f"{os.cpu_count()} CPUs; raw runs: `results/{args.json.name}`).\n\n{table}\n")
    print(body)
    if not args.no_md:
        update_section(args.md, args.section, body)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
