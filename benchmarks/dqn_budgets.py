"""DQN on CartPole-v1 at several step budgets: does the final policy hold when a user gives
the run more steps than the benchmark's 50k?

Each run is ``daskrl train graphs/dqn.py --steps B --seed S`` with the graph's defaults, once
with the learning rate annealed linearly to 0 over the run (``--anneal-lr``, the default
since this page) and once at RL Zoo's constant rate (``--no-anneal-lr``, the default
before). Reported per (setting, budget): the final greedy evaluation of each seed (10
episodes, ``summary.json``'s ``eval_return_mean``), their median, the seeds >= 475, and the
training return of the last 10 % of the run. Runs live under ``--work`` as
``<setting>-<budget>k-s<seed>``; a run whose ``summary.json`` is there is not run again (the
sweep resumes), and two runs go at once (``--parallel``).

    python benchmarks/dqn_budgets.py --budgets 50000 100000 300000 500000 --seeds 1 2 3 \\
        --work runs/dqn-budgets --json benchmarks/results/dqn_budgets.json
    python benchmarks/dqn_budgets.py --quick        # 4k steps, one seed, both settings
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    late_return,
    load_average,
    machine_info,
    markdown_table,
    median,
    run_or_read,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
SETTINGS = {"ann": ["--anneal-lr"], "base": ["--no-anneal-lr"]}
"""The two settings compared: the name a run's folder starts with, and its flags."""
LABELS = {"ann": "learning rate annealed to 0 (default)", "base": "constant learning rate"}
SOLVED = 475.0


def run_name(setting: str, budget: int, seed: int) -> str:
    """The folder of one run under ``--work``.

    >>> run_name("ann", 300_000, 2)
    'ann-300k-s2'
    """
    return f"{setting}-{budget // 1000}k-s{seed}"


def command(setting: str, budget: int, seed: int, out: Path) -> list[str]:
    """The ``daskrl train`` command of one run."""
    return [sys.executable, "-m", "daskrl", "train", "graphs/dqn.py", "--steps", str(budget),
            "--seed", str(seed), "--no-progress", "--out", str(out), *SETTINGS[setting]]


def run_one(setting: str, budget: int, seed: int, work: Path) -> dict[str, Any]:
    """Run (unless already run) and read one run: its final evaluation and late returns."""
    out = work / run_name(setting, budget, seed)
    cmd = command(setting, budget, seed, out)
    got = run_or_read(cmd, out)
    if "summary" not in got:
        return {"setting": setting, "budget": budget, "seed": seed, "command": cmd,
                "error": got["error"]}
    return {"setting": setting, "budget": budget, "seed": seed, "command": cmd,
            "ran_now": got["ran_now"], "final_eval": got["summary"].get("eval_return_mean"),
            "train_return_last_10pct": late_return(out),
            "env_steps_per_s": got["summary"].get("env_steps_per_s"),
            "load_before": got["load_before"]}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, budget): the seeds' final evaluations and their median."""
    rows = []
    for setting in SETTINGS:
        for budget in sorted({r["budget"] for r in runs}):
            mine = sorted((r for r in runs if r["setting"] == setting and r["budget"] == budget
                           and r.get("final_eval") is not None), key=lambda r: r["seed"])
            if not mine:
                continue
            finals = [float(r["final_eval"]) for r in mine]
            rows.append({"setting": setting, "budget": budget,
                         "seeds": [r["seed"] for r in mine], "final_evals": finals,
                         "median_final_eval": median(finals),
                         "solved": sum(f >= SOLVED for f in finals),
                         "train_return_last_10pct": median(
                             [r["train_return_last_10pct"] for r in mine]),
                         "env_steps_per_s": median([r["env_steps_per_s"] for r in mine])})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    body = [[LABELS[r["setting"]], f"{r['budget']:,}",
             ", ".join(f"{f:.1f}" for f in r["final_evals"]), r["median_final_eval"],
             f"{r['solved']}/{len(r['final_evals'])}", r["train_return_last_10pct"],
             r["env_steps_per_s"]] for r in rows]
    return markdown_table(["setting", "steps", "final greedy eval per seed",
                           "median", "seeds >= 475", "training return, last 10 % (median)",
                           "env-steps/s (median)"], body, align="lrlrrrr")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run what is missing, write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+",
                        default=[50_000, 100_000, 300_000, 500_000], help="--steps of each run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS),
                        default=sorted(SETTINGS), help="which settings to run")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "dqn-budgets",
                        help="folder of the runs (a run already there is read, not re-run)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 4k steps, seed 1, both settings")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "dqn_budgets.json")
    parser.add_argument("--md", type=Path, default=HERE / "dqn_budgets.md")
    parser.add_argument("--section", default="dqn-budgets",
                        help="name of the section of --md to rewrite")
    args = parser.parse_args(argv)
    if args.quick:
        args.budgets, args.seeds = [4_000], [1]
        args.json = args.json.with_name("dqn_budgets_quick.json")
        args.md = args.md.with_name("_dqn_budgets_quick.md")
    jobs = [(s, b, seed) for b in args.budgets for seed in args.seeds for s in args.settings]
    loads = [load_average()]
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: run_one(*job, args.work), jobs))
    loads.append(load_average())
    for run in runs:
        shown = {k: run.get(k) for k in ("setting", "budget", "seed", "final_eval", "error")}
        print(json.dumps(shown), flush=True)
    rows = summarise(runs)
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "rows": rows, "runs": runs})
    update_section(args.md, args.section, table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
