"""PPO on CartPole-v1: daskrl against Stable-Baselines3 (and a lean loop and the hand-written
reference kernel, ``hand_kernel.py``), same settings.

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
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    load_average,
    machine_info,
    update_section,
    write_json,
)
from _ppo_children import child_main
from _ppo_report import TARGET_COLUMNS, _command, ratios, render_markdown, summarise, targets
from _ppo_runs import run_child, run_daskrl, snapshot_sources
from _ppo_setup import (
    DEFAULT_JSON,
    DEFAULT_README,
    DISTRIBUTIONS,
    ENV_ID,
    FLAGS,
    GRAPH,
    LABELS,
    SYSTEMS,
    Hyper,
    solve_numbers,
    throughput_numbers,
)


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
    p.add_argument("--child", choices=("sb3", "lean", "hand"), help=argparse.SUPPRESS)
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
                                               DISTRIBUTIONS[system], FLAGS.get(system, ()))
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
    rat = {**ratios(medians, "sb3"), **ratios(medians, "lean"), **ratios(medians, "hand"),
           **ratios(medians, "sb3", "daskrl-stale"), **ratios(medians, "sb3", "daskrl-compile"),
           **ratios(medians, "sb3", "daskrl-stale-compile"),
           **ratios(medians, "hand", "daskrl-compile"),
           **ratios(medians, "hand", "daskrl-stale-compile")}
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
    result["targets"] = {x: targets(medians, rat, args.threshold, args.solve_steps, x)
                         for x in TARGET_COLUMNS if x in medians}
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
