"""A worker joins mid-run: a run under ``single`` re-deciding (``--distribution auto``'s
trials) against one that keeps ``single`` and one under ``actors-learner``.

PPO (``graphs/ppo.py``) with two actors whose env steps cost ``--env-step-cost`` seconds of
CPU, on an embedded cluster of one worker, where ``single`` (every role in one task) is as
fast as any other; once ``--join-after`` iterations are recorded a second worker joins (as
``--adapt`` or a user scaling the cluster would). ``single`` has no use for it;
``actors-learner`` re-places an actor there (its re-plan on a join); ``single+redecide``
starts under ``single`` with the plan ``auto`` makes from a probe that measured
``actors-learner`` and ``single`` (:class:`daskrl.runtime.redecide.RedecidePlan`), so the
join starts a trial. ``auto`` is the whole path (probe, then the run, whatever it picks).
Each system trains ``--iterations`` iterations on a fresh cluster; per system the medians
over ``--repeats`` (order rotating) of the wall clock of the whole run (``auto``'s probe
included) and the env-steps/s on the learner's clock over the iterations from ``--settle``
after the join (every system's switch behind it).

    python benchmarks/redecide.py --repeats 3
    python benchmarks/redecide.py --quick      # one repeat, fewer iterations, no output
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
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
GRAPH = str(ROOT / "graphs" / "ppo.py")
SYSTEMS = ("single+redecide", "single", "actors-learner", "auto")
CONFIG = {"num_actors": 2, "num_envs": 4, "num_steps": 32}


def one_run(system: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train under ``system`` on a fresh one-worker cluster, a second joining mid-run."""
    import threading

    from distributed import Client

    import daskrl
    from daskrl.cluster.local import add_workers, close_cluster, local_cluster
    from daskrl.core.script import load_graph
    from daskrl.distributions import get_distribution
    from daskrl.observe.metrics import iteration_rows
    from daskrl.runtime.driver import train
    from daskrl.runtime.redecide import RedecidePlan
    from daskrl.runtime.settings import RunSettings

    config = {**CONFIG, "env_step_cost": args.env_step_cost}
    ppo = load_graph(GRAPH)
    algo = ppo.build(ppo.Config(**config))
    steps = args.iterations * algo.steps_per_iteration
    cluster = local_cluster([{"CPU": 1}], dashboard_address=None)
    client = Client(cluster)
    load = load_average()
    done: dict[str, Any] = {}

    def go() -> None:
        try:
            if system == "auto":
                done["summary"] = daskrl.train(GRAPH, client=client, distribution="auto",
                                               out=out, steps=steps, progress=False,
                                               evaluate=False, **config).summary
                return
            plan = (RedecidePlan(("actors-learner", "single"), "single")
                    if system == "single+redecide" else None)
            name = "single" if system.startswith("single") else system
            done["summary"] = train(client, algo, get_distribution(name), RunSettings(
                out, steps=steps, redecide=plan, eval=False, progress=False,
                tensorboard=False))
        except BaseException as exc:  # noqa: BLE001 - reported below
            done["error"] = exc

    worker = threading.Thread(target=go)
    try:
        started = time.perf_counter()
        worker.start()
        deadline = time.monotonic() + 600
        while len(iteration_rows(out)) < args.join_after:
            if not worker.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{system}: the run ended before the join: "
                                   f"{done.get('error')}")
            time.sleep(0.05)
        add_workers(cluster, [{"CPU": 1}])
        joined = len(iteration_rows(out))
        worker.join(timeout=1200)
        wall = time.perf_counter() - started
    finally:
        client.close()
        close_cluster(cluster)
    if "error" in done:
        raise done["error"]
    summary = done["summary"]
    rows = iteration_rows(out)
    after = rows[joined + args.settle:]
    seconds = sum(float(r["iteration_s"]) for r in after)
    rate = sum(float(r["iteration_env_steps"]) for r in after) / seconds if seconds else None
    trials = (summary.get("distribution_redecided") or {}).get("trials", [])
    return {"system": system, "wall_s": wall, "joined_at": joined,
            "env_steps_per_s_after": rate, "env_steps": summary["env_steps"],
            "distribution": summary["distribution"],
            "probe_chose": (summary.get("distribution_probe") or {}).get("chosen"),
            "trials": trials,
            "switches": [r for r in summary.get("replans", [])
                         if any("--distribution" in m for m in r["moves"])],
            "replans": len(summary.get("replans", [])), "load": load}


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per system: median wall clock and rate after the join, and what auto chose."""
    out = []
    base = median([r["wall_s"] for r in runs if r["system"] == "single"])
    for system in SYSTEMS:
        mine = [r for r in runs if r["system"] == system]
        if not mine:
            continue
        wall = median([r["wall_s"] for r in mine])
        out.append({"system": system, "repeats": len(mine), "wall_s": wall,
                    "wall_of_single": ratio(wall, base),
                    "env_steps_per_s_after": median([r["env_steps_per_s_after"] for r in mine]),
                    "chose": sorted({f"{r['probe_chose'] or r['system'].split('+')[0]} -> "
                                     f"{r['distribution']}" for r in mine}),
                    "trials": [len(r["trials"]) for r in mine],
                    "wall_each": [round(r["wall_s"], 1) for r in mine]})
    return out


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    rows = [[r["system"], r["repeats"], f"{r['wall_s']:.1f}", f"{r['wall_of_single']:.2f}",
             f"{r['env_steps_per_s_after']:,.0f}", "; ".join(r["chose"]),
             ", ".join(map(str, r["wall_each"]))] for r in result["table"]]
    loads = [r["load"]["load_1m"] for r in result["runs"]]
    return (f"PPO CartPole, 2 actors x 4 envs x 32 steps, {a['env_step_cost'] * 1e3:g} ms of CPU "
            f"per env step, {a['iterations']} iterations; one worker, a second joining after "
            f"{a['join_after']} recorded iterations; medians of {a['repeats']} "
            f"({result['date']}, load (1 min) before each run "
            f"{min(loads):.1f}-{max(loads):.1f}).\n\n"
            + markdown_table(["system", "runs", "wall s", "of single's", "env-steps/s after "
                              "the join", "started -> ended under", "wall s each"], rows)
            + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--join-after", type=int, default=12)
    parser.add_argument("--settle", type=int, default=12,
                        help="iterations after the join left out of the rate")
    parser.add_argument("--env-step-cost", type=float, default=0.004)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "redecide.json")
    parser.add_argument("--md", type=Path, default=HERE / "auto_distribution.md")
    parser.add_argument("--section", default="redecide")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.iterations, args.join_after, args.settle = 1, 30, 6, 8
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            k = rep % len(args.systems)
            for system in args.systems[k:] + args.systems[:k]:
                r = one_run(system, args, Path(tmp) / f"{system.replace(':', '-')}-{rep}")
                runs.append({**r, "repeat": rep})
                print(json.dumps({key: r[key] for key in ("system", "wall_s",
                                                         "env_steps_per_s_after",
                                                         "distribution")}), flush=True)
    result = {"args": {k: v for k, v in vars(args).items() if k not in ("json", "md")},
              "date": time.strftime("%Y-%m-%d"), "runs": runs, "table": table(runs),
              "machine": machine_info()}
    text = markdown(result)
    print(text)
    if args.quick:
        return
    write_json(args.json, result)
    update_section(args.md, args.section, text)


if __name__ == "__main__":
    main()
