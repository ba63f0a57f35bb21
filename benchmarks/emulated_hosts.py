"""Distributions across emulated hosts: how each degrades as the network between its hosts
gets slower, and MSRL's findings (Zhu et al. 2023, Fig. 7) redone with daskrl's own.

Every point makes fresh hosts (:class:`daskrl.cluster.netns.EmulatedHosts`): host 0 runs the
scheduler and the driver, host 1 the learner's worker, hosts 2.. one worker each for the
actors (or, under ``data-parallel``, the replicas, each a learner); every link is capped at
``--rate-mbit`` and the relay adds ``--rtt-ms`` of round trip. The round trip and the rate a
TCP probe really gets between an actor host and the learner's are measured first and kept
in the row. The run itself is ``benchmarks/_scale_point.py`` under ``ip netns exec`` on host
0; each row is the median of ``--repeats`` runs, interleaved.

Sweeps (``--sweep``):

- ``latency`` (MSRL 7d): ``--rtt-ms`` values at ``--actors`` and ``--envs``;
- ``bandwidth``: ``--rate-mbit`` values;
- ``actors`` (MSRL 7a): ``--actors`` values, one host each;
- ``envs`` (MSRL 7c): ``--envs`` values per actor.

    python benchmarks/emulated_hosts.py --rtt-ms 0.1 1 10 \\
        --json benchmarks/results/emulated_latency.json

Without namespaces (not root, no ``ip``/``tc``/``nft``) it says why and exits 0, writing
nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
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
from _scale_point import run_isolated

from daskrl.cluster.netns import EmulatedHosts, LinkShape, unavailable

HERE = Path(__file__).resolve().parent
SWEEPS = ("latency", "bandwidth", "actors", "envs")
FIELDS = ("iteration_s", "env_steps_per_s", "of_ideal", "learner_busy", "rtt_ms_measured",
          "rate_mbit_measured", "time_to_return_s", "steps_to_return",
          "scheduler_tasks_per_s", "driver_cpu_s_per_iteration")


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The points of the sweep: one dict of settings each (system excluded)."""
    one = {"actors": args.actors[0], "envs": args.envs[0], "rtt_ms": args.rtt_ms[0],
           "rate_mbit": args.rate_mbit[0]}
    varied = {"latency": ("rtt_ms", args.rtt_ms), "bandwidth": ("rate_mbit", args.rate_mbit),
              "actors": ("actors", args.actors), "envs": ("envs", args.envs)}[args.sweep]
    return [{**one, varied[0]: v} for v in varied[1]]


def run_point(system: str, point: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Make the hosts, measure their link, run one point on host 0; the row."""
    actors = int(point["actors"])
    shape = LinkShape(rate_mbit=point["rate_mbit"] or None, rtt_ms=point["rtt_ms"])
    row: dict[str, Any] = {"distribution": system, **point}
    with EmulatedHosts(2 + actors, shape) as hosts:
        row["rtt_ms_measured"] = hosts.measure_rtt(2, 1)
        row["rate_mbit_measured"] = hosts.measure_rate(2, 1, megabytes=args.probe_mb)
        spec = {"distribution": system, "actors": actors, "actor_procs": actors,
                "sleep": args.env_step_sleep, "iterations": args.iterations, "seed": 1,
                "config": {"num_envs": int(point["envs"]), "num_steps": args.num_steps},
                "hosts": [(hosts.namespace(i), hosts.address(i))
                          for i in [*range(2, 2 + actors), 1]],
                "scheduler_host": (None, hosts.address(0))}
        if args.target_return:
            spec["target_return"] = args.target_return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        started = time.time()
        done = run_isolated(["ip", "netns", "exec", hosts.namespace(0), sys.executable,
                             str(HERE / "_scale_point.py"), json.dumps(spec)],
                            args.point_timeout, cwd=ROOT, env=env)
        if done is None:
            return {**row, "error": f"stalled: no result within {args.point_timeout:g} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**row, "error": (done.stderr or done.stdout)[-1500:]}
    return {**row, **json.loads(lines[-1]), "point_wall_s": time.time() - started}


def summarise(runs: list[dict[str, Any]], sweep: str) -> list[dict[str, Any]]:
    """One row per (system, point): medians over the repeats."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["distribution"], r["actors"], r["envs"], r["rtt_ms"], r["rate_mbit"])

    rows = []
    for k, group in itertools.groupby(sorted(runs, key=key), key=key):
        mine = list(group)
        ok = [r for r in mine if "error" not in r]
        row: dict[str, Any] = dict(zip(("distribution", "actors", "envs", "rtt_ms",
                                        "rate_mbit"), k, strict=True))
        row.update(repeats=len(ok), failed=len(mine) - len(ok), sweep=sweep)
        for f in FIELDS:
            row[f] = median(r.get(f) for r in ok)
        row["load_1m"] = median(r.get("load_1m_before") for r in ok)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the summary rows."""
    headers = ["distribution", "actors", "envs/actor", "RTT set (ms)", "RTT measured (ms)",
               "Mbit/s set", "Mbit/s measured", "s/iteration", "env-steps/s", "of ideal",
               "time to return (s)", "runs", "load"]
    body = [[r["distribution"], r["actors"], r["envs"], r["rtt_ms"], r["rtt_ms_measured"],
             r["rate_mbit"], r["rate_mbit_measured"], r["iteration_s"], r["env_steps_per_s"],
             r["of_ideal"], r["time_to_return_s"],
             f"{r['repeats']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
             r["load_1m"]] for r in rows]
    return markdown_table(headers, body, align="l" + "r" * (len(headers) - 1))


def plot(rows: list[dict[str, Any]], sweep: str, path: Path) -> None:
    """Seconds per iteration against the swept setting, a line per distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = {"latency": "rtt_ms_measured", "bandwidth": "rate_mbit", "actors": "actors",
         "envs": "envs"}[sweep]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for system in sorted({r["distribution"] for r in rows}):
        pts = sorted((r[x], r["iteration_s"]) for r in rows
                     if r["distribution"] == system and r["iteration_s"] and r[x])
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=system)
    ax.set(xscale="log", xlabel={"rtt_ms_measured": "round trip between hosts (ms, measured)",
                                 "rate_mbit": "link cap (Mbit/s)", "actors": "actors (hosts)",
                                 "envs": "envs per actor"}[x],
           ylabel="seconds per iteration", title=f"Emulated hosts: the {sweep} sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run the sweep, write the JSON, the table and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", choices=SWEEPS, default="latency")
    parser.add_argument("--systems", nargs="+", default=["actors-learner", "data-parallel"])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.1, 1.0, 10.0],
                        help="round trips the relay adds (the latency sweep's values)")
    parser.add_argument("--rate-mbit", type=float, nargs="+", default=[1000.0],
                        help="link caps in Mbit/s (0: uncapped)")
    parser.add_argument("--actors", type=int, nargs="+", default=[2],
                        help="actors (one host each), or the replicas of data-parallel")
    parser.add_argument("--envs", type=int, nargs="+", default=[8], help="envs per actor")
    parser.add_argument("--num-steps", type=int, default=32, help="steps per rollout")
    parser.add_argument("--env-step-sleep", type=float, default=0.01,
                        help="seconds each env step sleeps (the stand-in simulator)")
    parser.add_argument("--iterations", type=int, default=12, help="iterations per run")
    parser.add_argument("--target-return", type=float, default=0.0,
                        help="also record the time to this episode return (0: not)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-mb", type=int, default=16,
                        help="megabytes of the rate probe between two hosts")
    parser.add_argument("--point-timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "emulated_hosts.json")
    parser.add_argument("--md", type=Path, default=HERE / "emulated_hosts.md")
    parser.add_argument("--section", default=None,
                        help="section of --md to rewrite (default: emulated-<sweep>)")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"emulated_hosts: skipped: {reason}")
        return
    runs: list[dict[str, Any]] = []
    loads = [load_average()]
    for repeat in range(args.repeats):
        for point in grid(args):
            for system in args.systems:
                result = run_point(system, point, args)
                result["repeat"] = repeat
                runs.append(result)
                print(json.dumps({k: result.get(k) for k in (
                    "distribution", *point, "rtt_ms_measured", "iteration_s",
                    "time_to_return_s", "error")}), flush=True)
        loads.append(load_average())
    rows = summarise(runs, args.sweep)
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "rows": rows, "runs": runs})
    plot(rows, args.sweep, args.json.with_suffix(".png"))
    update_section(args.md, args.section or f"emulated-{args.sweep}", table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
