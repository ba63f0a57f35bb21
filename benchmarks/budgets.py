"""Do a graph's defaults hold at any budget? Each graph trained with its defaults at 1x, 2x
and 6x its quoted step budget, for 3 seeds; the final greedy evaluation at 2x and 6x must be
at least as good as at 1x (a default tuned to one budget is a bug a user meets by giving the
run more steps).

Each run is ``daskrl train GRAPH --steps B --seed S`` (plus the graph's env flags below);
reported per (graph, budget): the final greedy evaluation of each seed (``summary.json``'s
``eval_return_mean``), their median, and the training return over the last 10 % of the run.
Runs live under ``--work`` as ``GRAPH/<budget>k-s<seed>``; a run already there is read, not
run again, and a run already recorded in ``--json`` is kept (its folder may be gone: the
table grows graph by graph over several sessions; ``--fresh`` forgets the jobs asked);
``--parallel`` runs go at once (returns do not depend on the load). The JSON is read again
just before it is written, so two calls at once keep each other's runs.

    python benchmarks/budgets.py --graphs ppo impala a3c --seeds 1 2 3
    python benchmarks/budgets.py --quick            # ppo, 2k/4k steps, one seed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    finished_runs,
    late_return,
    load_average,
    machine_info,
    markdown_table,
    median,
    run_all,
    run_or_read,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
GRAPHS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "ppo": ("graphs/ppo.py", 500_000, ()),
    "impala": ("graphs/impala.py", 500_000, ()),
    "a3c": ("graphs/a3c.py", 500_000, ()),
    "dqn": ("graphs/dqn.py", 50_000, ()),
    "sac": ("graphs/sac.py", 20_000, ("--env", "Pendulum-v1")),
    "td3": ("graphs/td3.py", 20_000, ("--env", "Pendulum-v1")),
    "mappo": ("graphs/mappo.py", 320_000, ("--env", "simple_spread")),
}
"""Name -> (graph, the 1x budget the README and benchmarks quote, env flags): CartPole-v1 for
the discrete graphs, Pendulum-v1 for the continuous ones, MAPPO's simple spread."""


def run_one(name: str, budget: int, seed: int, work: Path) -> dict[str, Any]:
    """Run (unless already run) and read one run: its final evaluation and late returns."""
    graph, _, flags = GRAPHS[name]
    out = work / name / f"{budget // 1000}k-s{seed}"
    cmd = [sys.executable, "-m", "daskrl", "train", graph, *flags, "--steps", str(budget),
           "--seed", str(seed), "--no-progress", "--out", str(out)]
    record = {"graph": name, "budget": budget, "seed": seed}
    got = run_or_read(cmd, out)
    if "summary" not in got:
        return record | got
    return record | {"final_eval": got["summary"].get("eval_return_mean"),
                     "train_return_last_10pct": late_return(out),
                     "env_steps_per_s": got["summary"].get("env_steps_per_s"),
                     "load_before": got["load_before"], "ran_now": got["ran_now"]}


def summarise(runs: list[dict[str, Any]], bases: dict[str, int]) -> list[dict[str, Any]]:
    """One row per (graph, budget): the seeds' final evaluations, their median, and whether
    it holds against the median at ``bases[graph]`` (the 1x budget; no verdict without it)."""
    rows = []
    for name in dict.fromkeys(r["graph"] for r in runs):
        finals: dict[int, list[dict[str, Any]]] = {}
        for r in sorted(runs, key=lambda r: (r["budget"], r["seed"])):
            if r["graph"] == name and r.get("final_eval") is not None:
                finals.setdefault(r["budget"], []).append(r)
        base = median([float(r["final_eval"]) for r in finals.get(bases[name], [])])
        for budget, mine in finals.items():
            evals = [float(r["final_eval"]) for r in mine]
            med = median(evals)
            rows.append({"graph": name, "budget": budget, "multiple": budget / bases[name],
                         "seeds": [r["seed"] for r in mine], "final_evals": evals,
                         "median_final_eval": med,
                         "holds": None if base is None or budget == bases[name] else med >= base,
                         "train_return_last_10pct": median(
                             [r["train_return_last_10pct"] for r in mine]),
                         "env_steps_per_s": median([r["env_steps_per_s"] for r in mine])})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    body = [[r["graph"], f"{r['budget']:,} ({r['multiple']:g}x)",
             ", ".join(f"{f:.1f}" for f in r["final_evals"]), r["median_final_eval"],
             {None: "-", True: "holds", False: "**worse**"}[r["holds"]],
             r["train_return_last_10pct"], r["env_steps_per_s"]] for r in rows]
    return markdown_table(["graph", "steps", "final greedy eval per seed", "median",
                           "vs 1x", "training return, last 10 % (median)",
                           "env-steps/s (median)"], body, align="lllrlrr")


def recorded(path: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The finished runs an earlier call recorded in ``path`` (none if it is not there), by
    (graph, budget, seed)."""
    return {(r["graph"], r["budget"], r["seed"]): r for r in finished_runs(path)}


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run what is missing, write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=list(GRAPHS))
    parser.add_argument("--multiples", type=float, nargs="+", default=[1, 2, 6],
                        help="budgets as multiples of each graph's quoted one")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "budgets",
                        help="folder of the runs (a run already there is read, not re-run)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: ppo at 2k and 4k steps, seed 1; writes nothing here")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "budgets.json")
    parser.add_argument("--md", type=Path, default=HERE / "budgets.md")
    parser.add_argument("--section", default="budgets", help="section of --md to rewrite")
    parser.add_argument("--fresh", action="store_true",
                        help="forget what --json records of the graphs, budgets and seeds "
                             "asked: their jobs run again unless a folder in --work holds "
                             "them; other runs it records are kept")
    args = parser.parse_args(argv)
    if args.quick:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="daskrl-budgets-"))
        args.graphs, args.seeds, args.work = ["ppo"], [1], tmp / "runs"
        args.json, args.md = tmp / "budgets.json", tmp / "budgets.md"
        budgets, bases = {"ppo": [2048, 4096]}, {"ppo": 2048}
    else:
        budgets = {g: [int(GRAPHS[g][1] * m) for m in args.multiples] for g in args.graphs}
        bases = {g: GRAPHS[g][1] for g in args.graphs}
    asked = [(g, b, s) for g in args.graphs for b in budgets[g] for s in args.seeds]

    def remembered() -> dict[tuple[str, int, int], dict[str, Any]]:
        return {k: r for k, r in recorded(args.json).items()
                if not (args.fresh and k in asked)}

    kept = remembered()
    jobs = [job for job in asked if job not in kept]
    loads = [load_average()]
    runs = run_all(jobs, lambda job: run_one(*job, args.work), args.parallel,
                   lambda job, result: f"{job[0]} {job[1]:,} s{job[2]}: {result.get('final_eval')}")
    loads.append(load_average())
    # read the JSON again: another call may have recorded runs while this one ran
    merged = kept | remembered() | {(r["graph"], r["budget"], r["seed"]): r for r in runs
                                    if r.get("final_eval") is not None}
    order = list(GRAPHS)
    runs = sorted([*merged.values(), *(r for r in runs if r.get("final_eval") is None)],
                  key=lambda r: (order.index(r["graph"]), r["budget"], r["seed"]))
    bases = {g: GRAPHS[g][1] for g in dict.fromkeys(r["graph"] for r in runs)} | bases
    errors = [r for r in runs if r.get("error")]
    for r in errors:
        print(json.dumps({k: r.get(k) for k in ("graph", "budget", "seed")}),
              r["error"][-500:], file=sys.stderr)
    rows = summarise(runs, bases)
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "rows": rows, "runs": runs})
    update_section(args.md, args.section, table(rows))
    print(table(rows))
    if errors:
        raise SystemExit(f"{len(errors)} run(s) failed")


if __name__ == "__main__":
    main()
