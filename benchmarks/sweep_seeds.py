"""Eight seeds of PPO on CartPole-v1 one after another against ``daskrl sweep --seeds 8`` on
the same two workers: the wall clock of the whole set, and (under ``--deterministic``)
whether every seed's weights are the same bit for bit.

One cluster of daskrl's own (two worker processes, one CPU each) serves both arms. Per
repeat, in an order that alternates, ``sequential`` trains the seeds with
``daskrl.train(..., client=...)`` one after another and ``sweep`` trains them with
``daskrl.sweep(..., seeds=8)`` (at most ``--concurrency`` at once; the report included).
The determinism phase trains each seed both ways with ``deterministic=True`` and compares
``summary.json``'s ``weights_sha256``: the sweep at its deterministic default (one trial at
a time) and at twice the workers.

    python benchmarks/sweep_seeds.py --repeats 3
    python benchmarks/sweep_seeds.py --phases determinism --merge   # that phase alone
    python benchmarks/sweep_seeds.py --quick      # 20k steps, one repeat
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, load_average, machine_info, markdown_table, update_section, write_json

HERE = Path(__file__).resolve().parent
GRAPH = str(ROOT / "graphs" / "ppo.py")


def sequential(client: Any, out: Path, seeds: list[int], steps: int,
               deterministic: bool = False) -> tuple[float, dict[int, dict[str, Any]]]:
    import daskrl

    started = time.perf_counter()
    summaries = {seed: daskrl.train(GRAPH, client=client, steps=steps, seed=seed,
                                    out=out / f"seed{seed}", progress=False,
                                    deterministic=deterministic).summary for seed in seeds}
    return time.perf_counter() - started, summaries


def swept(client: Any, out: Path, seeds: list[int], steps: int, concurrency: int | None,
          deterministic: bool = False) -> tuple[float, float, dict[int, dict[str, Any]]]:
    import daskrl

    started = time.perf_counter()
    result = daskrl.sweep(GRAPH, out=out, client=client, seeds=len(seeds), seed=seeds[0],
                          steps=steps, concurrency=concurrency, progress=False,
                          deterministic=deterministic)
    wall = time.perf_counter() - started
    trials_s = json.loads((out / "sweep.json").read_text())["wall_s"]
    summaries = {rec["seed"]: json.loads((out / name / "summary.json").read_text())
                 for name, rec in result.trials.items()}
    return wall, trials_s, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000,
                        help="env steps per seed in the speed phase (default: %(default)s)")
    parser.add_argument("--det-steps", type=int, default=20_000,
                        help="env steps per seed in the determinism phase")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=None,
                        help="the sweep's trials at once (default: the sweep's own, 2 x workers)")
    parser.add_argument("--phases", default="speed,determinism",
                        help="comma-separated: speed, determinism (default: both)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other phase's results from the existing JSON")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "sweep_seeds.json")
    parser.add_argument("--md", type=Path, default=HERE / "sweeps.md")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.det_steps = 20_000, 1, 4_096
    from distributed import Client

    from daskrl.cluster.local import local_cluster

    seeds = list(range(1, args.seeds + 1))
    phases = set(args.phases.split(","))
    previous = json.loads(args.json.read_text()) if args.merge and args.json.exists() else {}
    cluster = local_cluster([{"CPU": 1}, {"CPU": 1}])
    client = Client(cluster)
    rows: list[dict[str, Any]] = previous.get("rows", [])
    load = [load_average()]
    identical: dict[str, Any] = previous.get("deterministic", {})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats if "speed" in phases else 0):
                if r == 0:
                    rows = []
                for arm in (("sequential", "sweep") if r % 2 == 0 else ("sweep", "sequential")):
                    out = Path(tmp) / f"{arm}-{r}"
                    if arm == "sequential":
                        wall, summaries = sequential(client, out, seeds, args.steps)
                        trials_s = wall
                    else:
                        wall, trials_s, summaries = swept(client, out, seeds, args.steps,
                                                          args.concurrency)
                    rows.append({"repeat": r, "arm": arm, "wall_s": wall, "trials_s": trials_s,
                                 "eval_return": [summaries[s]["eval_return_mean"]
                                                 for s in seeds]})
                    print(f"repeat {r} {arm}: {wall:.1f} s", flush=True)
                    load.append(load_average())
            if "determinism" in phases:
                alone = sequential(client, Path(tmp) / "det-seq", seeds, args.det_steps,
                                   True)[1]
                identical = {"steps": args.det_steps, "of": len(seeds), "by_concurrency": {}}
                for width in (1, 4):
                    swept_det = swept(client, Path(tmp) / f"det-sweep-{width}", seeds,
                                      args.det_steps, width, True)[2]
                    identical["by_concurrency"][str(width)] = [
                        s for s in seeds
                        if alone[s]["weights_sha256"] == swept_det[s]["weights_sha256"]]
                load.append(load_average())
    finally:
        client.close()
        cluster.close()
    med = {arm: statistics.median(r["wall_s"] for r in rows if r["arm"] == arm)
           for arm in ("sequential", "sweep")}
    trials_med = statistics.median(r["trials_s"] for r in rows if r["arm"] == "sweep")
    load = [*previous.get("load", []), *load] if args.merge else load
    result = {"machine": machine_info(), "load": load, "seeds": seeds, "steps": args.steps,
              "repeats": args.repeats, "concurrency": args.concurrency, "rows": rows,
              "median_wall_s": med, "sweep_trials_median_s": trials_med,
              "speedup": med["sequential"] / med["sweep"], "deterministic": identical}
    write_json(args.json, result)
    table = markdown_table(
        ["arm", "wall clock s (median)", "repeats", "per seed s"],
        [["8 runs one after another", med["sequential"], args.repeats,
          med["sequential"] / len(seeds)],
         [f"daskrl sweep --seeds {len(seeds)}", med["sweep"], args.repeats,
          med["sweep"] / len(seeds)]])
    loads = [x["load_1m"] for x in load]
    text = (f"PPO on CartPole-v1, default settings, {args.steps:,} env steps per seed, seeds "
            f"1-{len(seeds)}, one cluster of two worker processes (one CPU each), "
            f"{time.strftime('%Y-%m-%d')}; load (1 min) {min(loads):.1f}-{max(loads):.1f}.\n\n"
            f"{table}\n\nSweep / sequential speed-up: **{result['speedup']:.2f}x** (the "
            f"sweep's trials alone, without start-up and report: {trials_med:.1f} s). Under "
            f"`--deterministic` ({identical['steps']:,} steps), seeds whose weights "
            "(`weights_sha256`) are the same swept as trained alone: "
            + ", ".join(f"{len(v)} of {identical['of']} at --concurrency {k}"
                        for k, v in identical["by_concurrency"].items()) + ".\n\n"
            "`python benchmarks/sweep_seeds.py --repeats 3`")
    update_section(args.md, "sweep-seeds", text)
    print(text)


if __name__ == "__main__":
    main()
