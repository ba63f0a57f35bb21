"""Driver cost per iteration against the number of workers a run does not use.

PPO on CartPole with 2 rollout replicas trains on a ``LocalCluster`` of 2, 32 and 128
in-process workers (threads of this process, each given the process's memory budget). The
run uses three of them (two rollout replicas, one learner); the others only exist. Measured
per run: the driver thread's CPU seconds per iteration (``time.thread_time`` in the thread
that runs ``train``: placement, submission, waiting, recording; the scheduler and the workers
run on the cluster's own event loop and executor threads) and env-steps/s. Sizes are
interleaved within each repeat, so load changes hit all alike; medians over repeats.

    python benchmarks/many_workers.py --repeats 3
    # writes benchmarks/results/many_workers.json and benchmarks/many_workers.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster

from daskrl.cluster.local import configure_dask
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

ROOT = Path(__file__).resolve().parents[1]


def one_run(workers: int, steps: int, num_envs: int, num_steps: int) -> dict[str, Any]:
    """Train once on ``workers`` thread workers; the driver's CPU per iteration and speed."""
    configure_dask()
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=num_envs, num_steps=num_steps))
    load = os.getloadavg()[0]
    with LocalCluster(n_workers=workers, processes=False, threads_per_worker=1,
                      memory_limit="16GiB", dashboard_address=None) as cluster, \
            Client(cluster) as client, tempfile.TemporaryDirectory() as tmp:
        client.wait_for_workers(workers, timeout=120)
        result: dict[str, Any] = {}

        def drive() -> None:
            start = time.thread_time()
            summary = train(client, algo, get_distribution("actors-learner"),
                            RunSettings(out=Path(tmp) / "run", steps=steps, eval=False,
                                        tensorboard=False, progress=False))
            result.update(summary=summary, cpu=time.thread_time() - start)

        thread = threading.Thread(target=drive)
        thread.start()
        thread.join()
    summary = result["summary"]
    used = {w for names in summary["placement"].values() for w in names}
    return {"workers": workers, "used_workers": len(used), "iterations": summary["iterations"],
            "driver_cpu_ms_per_iteration": 1000 * result["cpu"] / summary["iterations"],
            "env_steps_per_s": summary["env_steps_per_s"], "load_1min": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,32,128")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40_960)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "many_workers.json")
    parser.add_argument("--table", type=Path, default=ROOT / "benchmarks" / "many_workers.md")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = []
    for repeat in range(args.repeats):
        for n in sizes:
            row = one_run(n, args.steps, args.num_envs, args.num_steps)
            row["repeat"] = repeat
            print(json.dumps(row), flush=True)
            runs.append(row)
    medians = {}
    for n in sizes:
        mine = [r for r in runs if r["workers"] == n]
        medians[n] = {k: statistics.median(r[k] for r in mine)
                      for k in ("driver_cpu_ms_per_iteration", "env_steps_per_s", "load_1min")}
    base = medians[sizes[0]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": vars(args) | {"out": str(args.out),
                                                            "table": str(args.table)},
                                    "cpus": os.cpu_count(), "runs": runs,
                                    "medians": medians}, indent=1))
    lines = ["| thread workers | driver CPU ms / iteration | vs 2 | env-steps/s | vs 2 | "
             "load (1 min) |", "|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        m = medians[n]
        lines.append(f"| {n} | {m['driver_cpu_ms_per_iteration']:.1f} | "
                     f"{m['driver_cpu_ms_per_iteration'] / base['driver_cpu_ms_per_iteration']:.2f}"
                     f" | {m['env_steps_per_s']:.0f} | "
                     f"{m['env_steps_per_s'] / base['env_steps_per_s']:.2f} | "
                     f"{m['load_1min']:.1f} |")
    table = "\n".join(lines)
    args.table.write_text(
        "# Driver cost against unused workers\n\n"
        "PPO on CartPole, 2 rollout replicas + learner, on a `LocalCluster` of N thread "
        f"workers; {args.steps} env steps per run ({args.num_envs} envs x {args.num_steps} "
        f"steps per replica and iteration), no evaluation; medians of {args.repeats} "
        f"interleaved repeats on {os.cpu_count()} cores.\n"
        "`python benchmarks/many_workers.py` (JSON: `benchmarks/results/many_workers.json`).\n\n"
        f"{table}\n")
    print(table)


if __name__ == "__main__":
    main()
