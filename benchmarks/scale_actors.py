"""Where a distribution stops scaling: hundreds of sleeping actors on a 2-core machine.

Each actor's env step sleeps ``--env-step-sleep`` seconds (a simulator on another host: wall
time, no CPU here), so the ideal rate is ``actors x envs / sleep`` env steps a second, and
what falls short of it is daskrl's own cost: the scheduler's task rate, the driver, the
weights' fan-out, the learner, the actors' inference. Every point is a fresh cluster of
separate processes (``benchmarks/_scale_point.py``: the scheduler apart, the actors as
threads of ``--procs`` worker processes, the learner on a worker of its own) in a process of
its own, stopped after ``--point-timeout`` seconds; points run interleaved across repeats,
and each row is the median of the repeats.

    python benchmarks/scale_actors.py --actors 16 64 256 1024 --env-step-sleep 0.01 \\
        --json benchmarks/results/scale_actors.json

Distributions (``--systems``, each ``NAME[:OPTIONS]``): ``actors-learner`` (PPO, lockstep:
co-located actors fused), ``impala`` as it was (one task per rollout, an update per batch),
``impala:group=16,batch=auto`` and ``impala:group=64,batch=auto`` (16 or 64 actors fused into
one stream, updates on all that landed), ``apex`` (DQN with Ape-X's replay shards). Writes
the JSON, a markdown table under ``--md`` (section ``scale-actors``) and a plot of
env-steps/s against actors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    graph_setting,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
SYSTEMS = ("actors-learner", "impala", "impala:group=16,batch=auto",
           "impala:group=64,batch=auto", "apex")
CONFIG = {"num_envs": 1, "num_steps": 32}
"""Every graph's settings in the lab: one env per actor, 32-step rollouts."""
GRAPH_CONFIG = {"dqn": {"train_frequency": 8, "learning_starts": 256}}
"""DQN learns on 1 of every 8 env steps (a replay ratio of 8 transitions sampled per 8 env
steps at batch 64): the default 2 would make the lab's learner the limit from 16 actors."""
FIELDS = ("env_steps_per_s", "ideal_env_steps_per_s", "of_ideal", "learner_busy",
          "policy_lag_mean", "scheduler_tasks_per_s", "scheduler_cpu_share",
          "driver_cpu_s_per_iteration", "weight_bytes_per_s", "rollout_bytes_per_s",
          "actors_cpu_share", "learner_cpu_share", "iteration_s", "rollout_s", "actor_procs")


def point_spec(system: str, actors: int, args: argparse.Namespace) -> dict[str, Any]:
    """The spec ``_scale_point.py`` runs for one (system, actors)."""
    from _scale_point import GRAPHS

    graph = GRAPHS[system.split(":")[0]]
    return {"distribution": system, "actors": actors, "actor_procs": min(args.procs, actors),
            "sleep": args.env_step_sleep, "iterations": args.iterations, "seed": 1,
            "task_timeout": args.task_timeout, "learner_cpus": args.learner_cpus,
            "config": {**CONFIG, **GRAPH_CONFIG.get(graph, {}),
                       **({"hidden": args.hidden} if args.hidden else {}),
                       **dict(args.set)}}


def run_point(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one point in a process of its own; its result, or why it has none."""
    from _scale_point import run_isolated

    started = time.time()
    done = run_isolated([sys.executable, str(HERE / "_scale_point.py"), json.dumps(spec)],
                        timeout, cwd=ROOT)
    if done is None:
        return {**spec, "error": f"stalled: no result within {timeout:g} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**spec, "error": (done.stderr or done.stdout)[-1500:]}
    return {**json.loads(lines[-1]), "point_wall_s": time.time() - started}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, actors): the median of each field over the repeats."""
    rows = []
    keys = sorted({(r["distribution"], r["actors"]) for r in runs},
                  key=lambda k: (k[0], k[1]))
    for system, actors in keys:
        mine = [r for r in runs if (r["distribution"], r["actors"]) == (system, actors)]
        ok = [r for r in mine if "error" not in r]
        row: dict[str, Any] = {"distribution": system, "actors": actors, "repeats": len(ok),
                               "failed": len(mine) - len(ok)}
        for f in FIELDS:
            row[f] = median(r.get(f) for r in ok)
        row["load_1m"] = median(r.get("load_1m_before") for r in ok)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the summary rows."""
    headers = ["distribution", "actors", "env-steps/s", "ideal", "of ideal", "learner busy",
               "policy lag", "scheduler tasks/s", "scheduler CPU", "driver CPU s/it",
               "weights B/s", "rollouts B/s", "actor procs CPU", "runs", "load"]
    body = [[r["distribution"], r["actors"], r["env_steps_per_s"], r["ideal_env_steps_per_s"],
             r["of_ideal"], r["learner_busy"], r["policy_lag_mean"], r["scheduler_tasks_per_s"],
             r["scheduler_cpu_share"], r["driver_cpu_s_per_iteration"], r["weight_bytes_per_s"],
             r["rollout_bytes_per_s"], r["actors_cpu_share"],
             f"{r['repeats']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
             r["load_1m"]] for r in rows]
    return markdown_table(headers, body, align="lr" + "r" * (len(headers) - 2))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """env-steps/s (and the ideal) against actors, one line per distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    systems = sorted({r["distribution"] for r in rows})
    ideal = sorted({(r["actors"], r["ideal_env_steps_per_s"]) for r in rows
                    if r["ideal_env_steps_per_s"]})
    if ideal:
        ax.plot(*zip(*ideal, strict=True), "k--", label="ideal (actors x envs / sleep)")
    for system in systems:
        pts = sorted((r["actors"], r["env_steps_per_s"]) for r in rows
                     if r["distribution"] == system and r["env_steps_per_s"])
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=system)
    ax.set(xscale="log", yscale="log", xlabel="actors", ylabel="env steps / s",
           title="Sleeping actors on 2 cores: throughput against the ideal")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run the sweep, write the JSON, the table and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[16, 64, 256, 1024],
                        help="actor counts to measure")
    parser.add_argument("--env-step-sleep", type=float, default=0.01,
                        help="seconds each env step sleeps (the stand-in simulator)")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS),
                        help="distributions NAME[:OPTIONS] to measure")
    parser.add_argument("--procs", type=int, default=2,
                        help="worker processes the actors share as threads")
    parser.add_argument("--iterations", type=int, default=48,
                        help="iterations per run (warm-up: the first quarter, and the "
                             "drain of the rollouts that piled up while the learner started)")
    parser.add_argument("--hidden", type=int, default=0,
                        help="hidden units of every network (0: each graph's default)")
    parser.add_argument("--set", type=graph_setting, action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="a graph Config field for every point (repeatable), e.g. "
                             "--set update_epochs=4")
    parser.add_argument("--learner-cpus", type=int, nargs="+", default=None,
                        help="CPUs the learner's worker runs on alone; the scheduler, the "
                             "actors and the driver get the others (default: all share all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each point")
    parser.add_argument("--task-timeout", type=float, default=600,
                        help="each run's --task-timeout: the default bound (60 s for a first "
                             "task) stops one-task-per-rollout impala from 256 actors")
    parser.add_argument("--point-timeout", type=float, default=600,
                        help="seconds a point may take before it counts as stalled")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "scale_actors.json")
    parser.add_argument("--md", type=Path, default=HERE / "scale_actors.md",
                        help="markdown file whose 'scale-actors' section gets the table")
    parser.add_argument("--section", default="scale-actors",
                        help="name of the section of --md to rewrite")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG of env-steps/s against actors (default: beside --json)")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    loads = [load_average()]
    for repeat in range(args.repeats):
        for actors in args.actors:
            for system in args.systems:
                spec = point_spec(system, actors, args)
                result = run_point(spec, args.point_timeout)
                result["repeat"] = repeat
                runs.append(result)
                shown = {k: result.get(k) for k in ("distribution", "actors", "env_steps_per_s",
                                                    "of_ideal", "learner_busy", "error")}
                print(json.dumps(shown), flush=True)
        loads.append(load_average())
    rows = summarise(runs)
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "config": CONFIG, "graph_config": GRAPH_CONFIG,
                           "rows": rows, "runs": runs})
    png = args.plot or args.json.with_suffix(".png")
    plot(rows, png)
    update_section(args.md, args.section, table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
