"""What the learner's idle-core threads buy a whole run: each graph with its defaults (the
learner takes the cores its waiting rollouts leave idle when timing shows that faster,
``daskrl.core.learner_threads``) against the same run with the update held to its one-thread
grant (the distribution's ``threads=1``), alternating, the same seeds, one run at a time.

Per run: wall seconds from launch to exit, ``summary.json``'s env-steps/s, the thread count
the learner kept (``learner_threads``) and the final greedy evaluation. A graph whose update
is too small to split (PPO's 64-unit MLP) should keep one thread and run as fast either way;
one whose update is large (SAC's 256-unit critics) should keep two on a 2-core machine.

    python benchmarks/learner_threads.py                      # sac, dqn, ppo; 3 seeds
    python benchmarks/learner_threads.py --graphs sac --repeats 1 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
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
    ratio,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
GRAPHS: dict[str, tuple[str, int, str]] = {
    "sac": ("graphs/sac.py", 20_000, "single"),
    "dqn": ("graphs/dqn.py", 50_000, "single"),
    "ppo": ("graphs/ppo.py", 200_000, "actors-learner"),
}
"""Name -> (graph, steps, its default distribution, whose ``threads=1`` holds the update to
one thread): the budgets the README quotes (PPO: SB3's 200k-step benchmark length)."""


def run_one(graph: str, seed: int, fixed: bool, work: Path, steps: int) -> dict[str, Any]:
    """One ``daskrl train`` run, timed from launch to exit (its folder replaced)."""
    script, _, distribution = GRAPHS[graph]
    out = work / f"{graph}-{'one-thread' if fixed else 'default'}-s{seed}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "daskrl", "train", script, "--steps", str(steps), "--seed",
           str(seed), "--no-progress", "--out", str(out),
           *(["--distribution", f"{distribution}:threads=1"] if fixed else [])]
    load = load_average()["load_1m"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"graph": graph, "seed": seed, "one_thread": fixed, "steps": steps, "wall_s": wall,
            "env_steps_per_s": summary["env_steps_per_s"],
            "learner_threads": summary.get("learner_threads"),
            "final_eval": summary.get("eval_return_mean"), "load_1m_before": load}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per graph: medians of each mode and default / one-thread."""
    rows = []
    for graph in dict.fromkeys(r["graph"] for r in runs):
        mine = [r for r in runs if r["graph"] == graph]
        med = {mode: {k: median([r[k] for r in mine if r["one_thread"] == mode])
                      for k in ("wall_s", "env_steps_per_s", "final_eval")}
               for mode in (False, True)}
        kept = sorted({r["learner_threads"] for r in mine if not r["one_thread"]})
        rows.append({"graph": graph, "steps": mine[0]["steps"], "default": med[False],
                     "one_thread": med[True], "threads_kept": kept,
                     "speedup": ratio(med[True]["wall_s"], med[False]["wall_s"]),
                     "seeds": sorted({r["seed"] for r in mine})})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    return markdown_table(
        ["graph", "steps", "threads kept", "wall s, default", "wall s, one thread",
         "one thread / default wall", "env-steps/s, default", "env-steps/s, one thread",
         "final eval, default", "final eval, one thread"],
        [[r["graph"], f"{r['steps']:,}", ", ".join(map(str, r["threads_kept"])),
          fmt(r["default"]["wall_s"]), fmt(r["one_thread"]["wall_s"]), fmt(r["speedup"]),
          fmt(r["default"]["env_steps_per_s"]), fmt(r["one_thread"]["env_steps_per_s"]),
          fmt(r["default"]["final_eval"]), fmt(r["one_thread"]["final_eval"])] for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=list(GRAPHS))
    parser.add_argument("--repeats", type=int, default=3, help="seeds 1..R, both modes each")
    parser.add_argument("--quick", action="store_true",
                        help="a tenth of each graph's steps, writes nothing")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "learner_threads")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learner_threads.json")
    args = parser.parse_args()
    machine, runs = machine_info(), []
    for graph in args.graphs:
        steps = GRAPHS[graph][1] // (10 if args.quick else 1)
        for seed in range(1, args.repeats + 1):
            for fixed in ((False, True) if seed % 2 else (True, False)):
                run = run_one(graph, seed, fixed, args.work, steps)
                runs.append(run)
                print(f"{graph} s{seed} {'one thread' if fixed else 'default'}: "
                      f"{run['wall_s']:.1f} s, {run['env_steps_per_s']:.0f} steps/s, "
                      f"threads {run['learner_threads']}, eval {run['final_eval']}", flush=True)
    rows = summarise(runs)
    print(table(rows))
    if args.quick:
        return
    write_json(args.json, {"runs": runs, "rows": rows, "machine": machine,
                           "settings": vars(args) | {"json": str(args.json),
                                                     "work": str(args.work)}})
    loads = [r["load_1m_before"] for r in runs]
    update_section(HERE / "learner_threads.md", "table", "\n".join([
        table(rows), "",
        f"`python benchmarks/learner_threads.py --graphs {' '.join(args.graphs)} --repeats "
        f"{args.repeats}`: 1-minute load {min(loads):.1f}-{max(loads):.1f} at the runs' "
        f"starts ({os.cpu_count()} CPUs), daskrl at {machine['git_commit'][:7]}"
        f"{' + local changes' if machine['git_dirty'] else ''}."]))


if __name__ == "__main__":
    main()
