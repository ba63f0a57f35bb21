"""``--distribution auto`` against every fixed distribution, per workload; and what its probe
costs a 500k-step CartPole run.

Phase ``rates``: per workload, a cluster of daskrl's own with the workers ``daskrl train``
would start for it; per repeat, in an order that rotates, each distribution the graph can
use is trained for ``--measure-s`` seconds after its first iteration
(:func:`daskrl.runtime.auto.probe`, the steady rate on the learner's clock), then ``auto``
chooses (its probe, timed) and the distribution it chose is measured again the same way: the
row compares that rate with the best fixed one's. Phase ``cost``: ``daskrl train
graphs/ppo.py --steps 500000`` with ``--distribution auto`` and with the graph's own, each
a fresh process and cluster, wall clock from launch to exit.

    python benchmarks/auto_distribution.py --repeats 3
    python benchmarks/auto_distribution.py --phases cost --repeats 3 --merge
    python benchmarks/auto_distribution.py --quick     # CartPole only, one repeat, 1 s each
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent

WORKLOADS: dict[str, dict[str, Any]] = {
    "cartpole": {"label": "CartPole, 1 actor x 8 envs, 1 worker", "graph": "graphs/ppo.py",
                 "config": {}, "workers": 1},
    "cartpole-2ms": {"label": "CartPole + 2 ms CPU a step, 2 actors x 8 envs, 2 workers",
                     "graph": "graphs/ppo.py", "workers": 2,
                     "config": {"num_actors": 2, "env_step_cost": 0.002}},
    "hopper": {"label": "Hopper-v5, 2 actors x 8 envs, 2 workers", "graph": "graphs/ppo.py",
               "workers": 2, "config": {"env": "Hopper-v5", "num_actors": 2}},
    "simple-tag-10k": {"label": "MAPPO simple tag, 10k agents (2 actors x 1,250 envs x 4), "
                                "2 workers", "graph": "graphs/mappo.py", "workers": 2,
                       "config": {"num_actors": 2, "num_envs": 1250, "num_minibatches": 4}},
}
"""The workloads of the issue: a cheap env, a costly one, MuJoCo, many agents."""


def measure_workload(name: str, repeats: int, measure_s: float, probe_s: float
                     ) -> list[dict[str, Any]]:
    """The runs of one workload: each fixed distribution and ``auto``, ``repeats`` times."""
    from distributed import Client

    from daskrl.cluster.local import close_cluster, default_worker_resources, local_cluster
    from daskrl.core.script import load_graph
    from daskrl.runtime import auto
    from daskrl.runtime.dask_backend import DaskBackend
    from daskrl.runtime.settings import RunSettings

    spec = WORKLOADS[name]
    module = load_graph(str(ROOT / spec["graph"]))
    algo = module.build(module.Config(**spec["config"]))
    usable, _ = auto.candidates(algo)
    cluster = local_cluster(default_worker_resources(spec["workers"]))
    client = Client(cluster)
    backend = DaskBackend(client, scheduler=cluster.scheduler)
    settings = RunSettings(Path("unused"), steps=10**8, progress=False)
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(repeats):
            k = rep % len(usable)
            order = usable[k:] + usable[:k]  # who goes first (a warmer cluster) rotates
            for dist in order:
                load = load_average()
                p = auto.probe(backend, algo, dist, settings, measure_s)
                runs.append({"workload": name, "repeat": rep, "kind": "fixed",
                             "distribution": dist, "env_steps_per_s": p.env_steps_per_s,
                             "wall_s": p.probe_s, "iterations": p.iterations,
                             "skipped": p.skipped, "load": load})
                print(json.dumps({k: runs[-1][k] for k in ("workload", "distribution",
                                                          "env_steps_per_s", "skipped")}),
                      flush=True)
            load = load_average()
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:  # where the winner's probe goes on
                chosen, with_probe = auto.resolve(
                    backend, algo, dataclasses.replace(settings, out=Path(tmp) / "run"),
                    probe_s=probe_s)
            probe_wall = time.perf_counter() - started
            winner = with_probe.meta["distribution_probe"]["chosen"]
            again = auto.probe(backend, algo, winner, settings, measure_s)
            runs.append({"workload": name, "repeat": rep, "kind": "auto",
                         "distribution": winner, "env_steps_per_s": again.env_steps_per_s,
                         "probe_wall_s": probe_wall,
                         "probe": with_probe.meta["distribution_probe"], "load": load})
            print(json.dumps({"workload": name, "auto": winner,
                              "env_steps_per_s": again.env_steps_per_s,
                              "probe_wall_s": probe_wall}), flush=True)
    finally:
        client.close()
        close_cluster(cluster)
    return runs


def rate_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload: each fixed distribution's median rate, ``auto``'s, and their ratio."""
    rows = []
    for name in WORKLOADS:
        mine = [r for r in runs if r["workload"] == name]
        if not mine:
            continue
        fixed: dict[str, float | None] = {}
        for dist in dict.fromkeys(r["distribution"] for r in mine if r["kind"] == "fixed"):
            fixed[dist] = median([r["env_steps_per_s"] for r in mine
                                  if r["kind"] == "fixed" and r["distribution"] == dist])
        autos = [r for r in mine if r["kind"] == "auto"]
        measured = {d: v for d, v in fixed.items() if v is not None}
        best = max(measured, key=measured.__getitem__) if measured else None
        auto_rate = median([r["env_steps_per_s"] for r in autos])
        rows.append({
            "workload": name, "label": WORKLOADS[name]["label"], "fixed": fixed,
            "best_fixed": best, "best_fixed_env_steps_per_s": measured.get(best or ""),
            "auto_chose": dict(Counter(r["distribution"] for r in autos)),
            "auto_env_steps_per_s": auto_rate,
            "auto_of_best": ratio(auto_rate, measured.get(best or "")),
            "probe_wall_s": median([r["probe_wall_s"] for r in autos]),
            "repeats": len(autos),
            "load": [r["load"]["load_1m"] for r in mine if r.get("load")]})
    return rows


def cost_runs(repeats: int, steps: int) -> list[dict[str, Any]]:
    """``daskrl train graphs/ppo.py --steps STEPS``, auto and the graph's own, interleaved."""
    runs = []
    for rep in range(repeats):
        for dist in ("auto", "actors-learner") if rep % 2 == 0 else ("actors-learner", "auto"):
            out = ROOT / "runs" / f"auto-cost-{dist}-{rep}"
            cmd = [sys.executable, "-m", "daskrl", "train", "graphs/ppo.py", "--steps",
                   str(steps), "--distribution", dist, "--no-progress", "--out", str(out)]
            if out.exists():
                import shutil

                shutil.rmtree(out)
            load = load_average()
            started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - started
            summary = (json.loads((out / "summary.json").read_text())
                       if done.returncode == 0 else {})
            runs.append({"phase": "cost", "repeat": rep, "distribution": dist, "steps": steps,
                         "wall_s": wall, "returncode": done.returncode,
                         "chosen": summary.get("distribution"),
                         "probe_s": (summary.get("distribution_probe") or {}).get("probe_s"),
                         "eval_return_mean": summary.get("eval_return_mean"), "load": load,
                         "stderr": done.stderr[-1500:] if done.returncode else ""})
            print(json.dumps({k: runs[-1][k] for k in ("distribution", "wall_s", "chosen",
                                                      "probe_s")}), flush=True)
    return runs


def cost_row(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The median wall clock of each, and auto's extra share."""
    mine = [r for r in runs if r.get("phase") == "cost" and r["returncode"] == 0]
    if not mine:
        return None
    auto_wall = median([r["wall_s"] for r in mine if r["distribution"] == "auto"])
    own = median([r["wall_s"] for r in mine if r["distribution"] == "actors-learner"])
    return {"steps": mine[0]["steps"], "auto_wall_s": auto_wall, "fixed_wall_s": own,
            "extra_share": ratio(auto_wall, own) - 1 if auto_wall and own else None,
            "probe_s": median([r["probe_s"] for r in mine if r["distribution"] == "auto"]),
            "chosen": dict(Counter(r["chosen"] for r in mine if r["distribution"] == "auto")),
            "repeats": min(Counter(r["distribution"] for r in mine).values())}


def tables(rows: list[dict[str, Any]], cost: dict[str, Any] | None) -> str:
    """The markdown of both phases."""
    names = list(dict.fromkeys(d for r in rows for d in r["fixed"]))
    body = []
    for r in rows:
        cells = [r["label"]]
        for d in names:
            v = r["fixed"].get(d)
            cells.append("-" if d not in r["fixed"] else ("skipped" if v is None
                                                         else f"{v:,.0f}"))
        chose = ", ".join(f"{d} x{n}" for d, n in r["auto_chose"].items())
        cells += [chose, r["auto_env_steps_per_s"], r["auto_of_best"], r["probe_wall_s"],
                  r["repeats"]]
        body.append(cells)
    out = markdown_table(["workload", *names, "auto chose", "auto env-steps/s",
                          "auto / best fixed", "probe s", "repeats"], body,
                         align="l" + "r" * (len(names) + 5))
    if cost is not None:
        out += "\n\n" + markdown_table(
            ["run", "auto wall s", "actors-learner wall s", "auto's extra", "probe s",
             "auto chose", "repeats"],
            [[f"graphs/ppo.py --steps {cost['steps']:,}", cost["auto_wall_s"],
              cost["fixed_wall_s"], f"{cost['extra_share']:+.1%}", cost["probe_s"],
              ", ".join(f"{d} x{n}" for d, n in cost["chosen"].items()), cost["repeats"]]],
            align="lrrrrlr")
    return out


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, measure, write the JSON and the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", nargs="+", choices=("rates", "cost"),
                        default=["rates", "cost"])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure-s", type=float, default=5.0,
                        help="seconds each fixed distribution trains after its first "
                             "iteration")
    parser.add_argument("--probe-s", type=float, default=None,
                        help="auto's probe per candidate (default: daskrl's own)")
    parser.add_argument("--cost-steps", type=int, default=500_000)
    parser.add_argument("--tables-only", action="store_true",
                        help="redraw the tables from --json, measuring nothing")
    parser.add_argument("--merge", action="store_true",
                        help="keep the runs of --json from the phases not run now")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: CartPole, one repeat, 1 s measurements, no cost")
    parser.add_argument("--json", type=Path,
                        default=HERE / "results" / "auto_distribution.json")
    parser.add_argument("--md", type=Path, default=HERE / "auto_distribution.md")
    parser.add_argument("--section", default="auto-distribution")
    args = parser.parse_args(argv)
    from daskrl.runtime.auto import PROBE_S

    probe_s = args.probe_s if args.probe_s is not None else PROBE_S
    if args.quick:
        args.workloads, args.repeats, args.measure_s, args.phases = (
            ["cartpole"], 1, 1.0, ["rates"])
        args.json = args.json.with_name("auto_distribution_quick.json")
        args.md = args.md.with_name("_auto_distribution_quick.md")
    if args.tables_only:
        args.merge, args.phases = True, []
    old = json.loads(args.json.read_text()) if args.merge and args.json.is_file() else {}
    runs = [r for r in old.get("runs", [])
            if ("phase" in r and "cost" not in args.phases)
            or ("phase" not in r and ("rates" not in args.phases
                                      or r["workload"] not in args.workloads))]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if "rates" in args.phases:
        for name in args.workloads:
            runs += measure_workload(name, args.repeats, args.measure_s, probe_s)
    if "cost" in args.phases:
        runs += cost_runs(args.repeats, args.cost_steps)
    rows = rate_rows([r for r in runs if "phase" not in r])
    cost = cost_row(runs)
    write_json(args.json, {"machine": machine_info(), "started": started,
                           "args": {k: str(v) for k, v in vars(args).items()},
                           "probe_s": probe_s, "rows": rows, "cost": cost, "runs": runs})
    text = tables(rows, cost)
    for label, mine in (("rate", [r for r in runs if "phase" not in r]),
                        ("cost", [r for r in runs if r.get("phase") == "cost"])):
        loads = [r["load"]["load_1m"] for r in mine if r.get("load")]
        times = sorted(r["load"]["time"] for r in mine if r.get("load"))
        if loads:
            text += (f"\n\nThe {label} runs: {times[0]} to {times[-1]}, 1-minute load "
                     f"{min(loads):.1f}-{max(loads):.1f} (median "
                     f"{statistics.median(loads):.1f}).")
    update_section(args.md, args.section, text)
    print(text)
    print(f"wrote {args.json} and {args.md}")


if __name__ == "__main__":
    main()
