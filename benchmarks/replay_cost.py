"""Does an off-policy run's cost per env step grow as its replay fills?

Runs ``daskrl train graphs/dqn.py --steps STEPS`` alone (or reads a run already in
``--out``) and splits its iterations by env steps into phases: the replay filling, then
full (the default capacity is 100k transitions). Per phase: env steps a second on the
learner's clock (``iteration_env_steps`` over ``iteration_s``, the phase's first two
iterations left out), and the median learner and rollout seconds of an iteration.

    python benchmarks/replay_cost.py --steps 300000
    python benchmarks/replay_cost.py --out runs/dqn-flat --read-only   # an earlier run
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, load_average, machine_info, markdown_table, update_section, write_json

HERE = Path(__file__).resolve().parent
EDGES = (0, 10_000, 50_000, 100_000, 200_000, 300_000, 500_000)


def phases(run: Path, edges: tuple[int, ...] = EDGES) -> list[dict[str, Any]]:
    """The per-phase rates of the run in ``run``."""
    with (run / "metrics.csv").open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("iteration") and r.get("iteration_s")]
    out = []
    for low, high in zip(edges, edges[1:], strict=False):
        part = [r for r in rows if low <= float(r["env_steps"]) < high][2:]
        seconds = sum(float(r["iteration_s"]) for r in part)
        if not part or seconds <= 0:
            continue
        out.append({"from": low, "to": high, "iterations": len(part),
                    "env_steps_per_s": sum(float(r["iteration_env_steps"]) for r in part)
                    / seconds,
                    "learn_s": statistics.median(float(r["learn_s"]) for r in part),
                    "rollout_s": statistics.median(float(r["rollout_s"]) for r in part),
                    "replay_size": float(part[-1].get("replay_size") or "nan")})
    return out


def main(argv: list[str] | None = None) -> None:
    """Run (or read) the run, write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "dqn-replay-cost")
    parser.add_argument("--read-only", action="store_true",
                        help="read the run in --out, running nothing")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "replay_cost.json")
    parser.add_argument("--md", type=Path, default=HERE / "dqn_budgets.md")
    parser.add_argument("--section", default="replay-cost")
    args = parser.parse_args(argv)
    load = None if args.read_only else load_average()
    if not args.read_only:
        cmd = [sys.executable, "-m", "daskrl", "train", "graphs/dqn.py", "--steps",
               str(args.steps), "--no-eval", "--no-progress", "--out", str(args.out)]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
        print(f"ran in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    summary = json.loads((args.out / "summary.json").read_text())
    rows = phases(args.out)
    write_json(args.json, {"machine": machine_info(), "load_before": load,
                           "run": str(args.out), "summary_env_steps_per_s":
                           summary["env_steps_per_s"], "wall_s": summary["wall_s"],
                           "phases": rows})
    text = markdown_table(
        ["env steps", "replay at the end", "env-steps/s", "learner s / iteration",
         "rollout s / iteration", "iterations"],
        [[f"{r['from'] // 1000}k-{r['to'] // 1000}k", f"{r['replay_size']:,.0f}",
          r["env_steps_per_s"], r["learn_s"], r["rollout_s"], r["iterations"]]
         for r in rows], align="lrrrrr")
    text += (f"\n\nWhole run: {summary['env_steps_per_s']:,.0f} env-steps/s over "
             f"{summary['wall_s']:.0f} s" + (
                 f"; 1-minute load {load['load_1m']:.1f} before it ({load['time']})."
                 if load else " (read from the run's folder)."))
    update_section(args.md, args.section, text)
    print(text)


if __name__ == "__main__":
    main()
