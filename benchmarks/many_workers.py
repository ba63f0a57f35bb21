"""Driver cost per iteration against the number of workers a run does not use.

PPO on CartPole with 2 rollout replicas trains on a ``LocalCluster`` of 2, 32 and 128
in-process workers (threads of this process, each given the process's memory budget). The
run uses three of them (two rollout replicas, one learner); the others only exist. Measured
per run: the driver thread's CPU seconds per iteration (``time.thread_time`` in the thread
that runs ``train``: placement, submission, waiting, recording; the scheduler and the workers
run on the cluster's own event loop and executor threads), env-steps/s, and the share of a
core the process used in 3 s with the cluster idle before the run (Dask's per-worker
upkeep). Each size runs with Dask's defaults (the profiler on, as in a cluster a user made
before daskrl set its own settings) and with the cluster made under
:data:`~daskrl.cluster.upkeep.QUIET_UPKEEP`; ``--ablation`` adds, at the largest size, one
run per setting of it alone. Runs are interleaved within each repeat, so load changes hit
all alike; medians over repeats.

    nice -n 10 python benchmarks/many_workers.py --repeats 3 --ablation 2
    # writes benchmarks/results/many_workers.json and benchmarks/many_workers.md
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dask
from distributed import Client, LocalCluster

from daskrl.cluster.upkeep import QUIET_UPKEEP
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

ROOT = Path(__file__).resolve().parents[1]


def one_run(workers: int, steps: int, num_envs: int, num_steps: int,
            settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """Train once on ``workers`` thread workers made under ``settings`` (Dask config); the
    driver's CPU per iteration, the speed and the idle upkeep."""
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=num_envs, num_steps=num_steps))
    load = os.getloadavg()[0]
    made = dask.config.set(settings) if settings else contextlib.nullcontext()
    with made, LocalCluster(n_workers=workers, processes=False, threads_per_worker=1,
                            memory_limit="16GiB", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers, timeout=120)
        time.sleep(1.0)  # the workers' start-up settles
        before = time.process_time()
        time.sleep(3.0)
        idle = (time.process_time() - before) / 3.0
        result: dict[str, Any] = {}

        def drive() -> None:
            start = time.thread_time()
            summary = train(client, algo, get_distribution("actors-learner"),
                            RunSettings(out=out, steps=steps, eval=False,
                                        tensorboard=False, progress=False))
            result.update(summary=summary, cpu=time.thread_time() - start)

        thread = threading.Thread(target=drive)
        thread.start()
        thread.join()
    summary = result["summary"]
    used = {w for names in summary["placement"].values() for w in names}
    return {"workers": workers, "used_workers": len(used), "iterations": summary["iterations"],
            "driver_cpu_ms_per_iteration": 1000 * result["cpu"] / summary["iterations"],
            "env_steps_per_s": summary["env_steps_per_s"], "idle_upkeep_cores": idle,
            "load_1min": load}


def run_apart(workers: int, variant: str, settings: dict[str, Any], args: argparse.Namespace
              ) -> dict[str, Any]:
    """:func:`one_run` in a process of its own, stopped after ``args.run_limit`` seconds: a
    run whose event loop cannot keep up may stall, and then counts with the env steps it
    recorded over the time it had."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, __file__, "--one", str(workers), "--settings",
               json.dumps(settings), "--run-out", str(out), "--steps", str(args.steps),
               "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_limit,
                                  env=env)
        except subprocess.TimeoutExpired:
            return {"workers": workers, "variant": variant, **stalled(out)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"workers": workers, "variant": variant, "failed": True}
    return {**json.loads(lines[-1]), "variant": variant}


def stalled(out: Path) -> dict[str, Any]:
    """A run stopped at the time limit: env steps recorded, over the seconds from its first
    iteration's start to the stop."""
    rows = []
    with contextlib.suppress(FileNotFoundError), (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    load = os.getloadavg()[0]
    if not rows:
        return {"stalled": True, "env_steps_done": 0, "env_steps_per_s": 0.0, "load_1min": load}
    last = rows[-1]
    since_last = time.time() - (out / "metrics.csv").stat().st_mtime
    seconds = float(last["wall_s"]) + since_last
    return {"stalled": True, "env_steps_done": int(float(last["env_steps"])),
            "seconds_since_last_row": since_last,
            "seconds": seconds, "env_steps_per_s": float(last["env_steps"]) / seconds,
            "load_1min": load}


DASK_DEFAULTS: dict[str, Any] = {"distributed.worker.profile.enabled": True}
"""Dask's own defaults, as a user's cluster has them (daskrl turns the profiler off only in
the clusters it starts: :func:`~daskrl.cluster.local.dask_settings`)."""


def variants(sizes: list[int], ablation: bool) -> list[tuple[int, str, dict[str, Any]]]:
    """(workers, variant, Dask settings) of one repeat."""
    out = [(n, v, cfg) for n in sizes for v, cfg in (("defaults", DASK_DEFAULTS),
                                                      ("quiet", QUIET_UPKEEP))]
    if ablation:
        out += [(max(sizes), f"only {key.removeprefix('distributed.')}",
                 DASK_DEFAULTS | {key: value}) for key, value in QUIET_UPKEEP.items()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,32,128")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ablation", type=int, default=0, metavar="REPEATS",
                        help="in the first REPEATS repeats, also each setting of QUIET_UPKEEP "
                             "alone at the largest size")
    parser.add_argument("--steps", type=int, default=40_960)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "many_workers.json")
    parser.add_argument("--table", type=Path, default=ROOT / "benchmarks" / "many_workers.md")
    parser.add_argument("--run-limit", type=float, default=150.0,
                        help="seconds a run may take (its process included)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one run, in this process
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--run-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.steps, args.num_envs, args.num_steps,
                                 json.loads(args.settings), args.run_out)), flush=True)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = []
    for repeat in range(args.repeats):
        for n, variant, settings in variants(sizes, repeat < args.ablation):
            row = run_apart(n, variant, settings, args)
            row["repeat"] = repeat
            print(json.dumps(row), flush=True)
            runs.append(row)
    keys = ("driver_cpu_ms_per_iteration", "env_steps_per_s", "idle_upkeep_cores", "load_1min")
    stalls = {}
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in runs:
        if not r.get("failed"):
            groups.setdefault((r["workers"], r["variant"]), []).append(r)
    medians = {}
    for (n, v), rows in groups.items():
        medians[f"{n} {v}"] = {k: statistics.median(r[k] for r in rows if k in r)
                               if any(k in r for r in rows) else float("nan") for k in keys}
        stalls[f"{n} {v}"] = sum(bool(r.get("stalled")) for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": vars(args) | {"out": str(args.out),
                                                            "table": str(args.table)},
                                    "cpus": os.cpu_count(), "command": " ".join(sys.argv),
                                    "quiet_upkeep": QUIET_UPKEEP, "runs": runs,
                                    "medians": medians, "stalled": stalls}, indent=1))
    lines = ["| thread workers | Dask settings | driver CPU ms / iteration | vs 2 | env-steps/s "
             "| vs 2 | idle upkeep (cores) | load (1 min) | stalled |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (n, v), _ in groups.items():
        m = medians[f"{n} {v}"]
        base = medians[f"{sizes[0]} {v if v in ('defaults', 'quiet') else 'defaults'}"]
        lines.append(f"| {n} | {v} | {m['driver_cpu_ms_per_iteration']:.1f} | "
                     f"{m['driver_cpu_ms_per_iteration'] / base['driver_cpu_ms_per_iteration']:.2f}"
                     f" | {m['env_steps_per_s']:.0f} | "
                     f"{m['env_steps_per_s'] / base['env_steps_per_s']:.2f} | "
                     f"{m['idle_upkeep_cores']:.3f} | {m['load_1min']:.1f} | "
                     f"{stalls[f'{n} {v}']}/{len(groups[(n, v)])} |")
    table = "\n".join(lines)
    args.table.write_text(
        "# Driver cost against unused workers\n\n"
        "PPO on CartPole, 2 rollout replicas + learner, on a `LocalCluster` of N thread "
        f"workers; {args.steps} env steps per run ({args.num_envs} envs x {args.num_steps} "
        f"steps per replica and iteration), no evaluation; medians of {args.repeats} "
        f"interleaved repeats ({args.ablation} for the \"only\" rows) on {os.cpu_count()} "
        f"cores, each run in a process of its own stopped after {args.run_limit:.0f} s: a "
        "stalled run counts the env steps it recorded over the time from its start to the "
        "stop (\"stalled\": how many runs). \"defaults\": Dask's (the "
        "statistical profiler on); \"quiet\": the cluster made under "
        "`daskrl.cluster.upkeep.QUIET_UPKEEP`; \"only X\": Dask's defaults but that one "
        "setting of it. \"vs 2\" compares with 2 workers under the same settings (the "
        "\"only\" rows with 2 under Dask's defaults).\n"
        f"`{' '.join(['python', *sys.argv])}` "
        "(JSON: `benchmarks/results/many_workers.json`).\n\n"
        f"{table}\n")
    print(table)


if __name__ == "__main__":
    main()
