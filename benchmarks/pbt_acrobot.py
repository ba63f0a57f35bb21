"""Population-based training against the same population with its learning rates fixed:
PPO on Acrobot-v1, eight members started from a deliberately poor spread of learning
rates (four far too small, four far too large).

Both arms are ``daskrl.sweep`` runs on one cluster of daskrl's own: ``pbt`` with
``pbt=True`` (the members' rates drawn nowhere: ``start`` gives them; every ``--interval``
iterations the bottom quarter copies a top-quarter member's checkpoint and moves its rate by
x0.8 or x1.2 inside 1e-6..1e-1), ``fixed`` with ``grid={"learning_rate": [the same eight]}``.
Reported per arm: the best member's final greedy return, the IQM with its 95 % bootstrap
interval (rliable), and the wall clock; the PBT lineage is in the JSON.

    python benchmarks/pbt_acrobot.py
    python benchmarks/pbt_acrobot.py --quick     # 60k steps: a smoke of the pipeline
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, load_average, machine_info, markdown_table, update_section, write_json

HERE = Path(__file__).resolve().parent
GRAPH = str(ROOT / "graphs" / "ppo.py")
POOR = [1e-6, 3e-6, 1e-5, 3e-5, 3e-2, 6e-2, 1e-1, 2e-1]
"""The members' first learning rates: PPO's default on this task is 2.5e-4."""


def arm(name: str, client: Any, out: Path, steps: int, interval: int, seed: int
        ) -> dict[str, Any]:
    import daskrl

    common = {"out": out, "client": client, "steps": steps, "progress": True, "seed": seed,
              "env": "Acrobot-v1"}
    started = time.perf_counter()
    if name == "pbt":
        result = daskrl.sweep(GRAPH, pbt=True, population=len(POOR), interval=interval,
                              space=["learning_rate=1e-6:1e-1:log"],
                              start=[{"learning_rate": lr} for lr in POOR], **common)
    else:
        result = daskrl.sweep(GRAPH, grid={"learning_rate": POOR}, **common)
    wall = time.perf_counter() - started
    finals = {n: r.get("eval_return_mean") for n, r in result.trials.items()}
    rows = result.report["configurations"]
    if name == "pbt":
        summary = rows[0]
    else:  # one configuration per rate: the arm's IQM is over all eight
        from daskrl.sweeps.report import iqm_interval

        values = [v for v in finals.values() if isinstance(v, (int, float))]
        iqm, low, high = iqm_interval(values)
        summary = {"iqm": iqm, "iqm_low": low, "iqm_high": high, "best": max(values)}
    sweep = json.loads((out / "sweep.json").read_text())
    return {"arm": name, "wall_s": wall, "finals": finals, "best": summary["best"],
            "iqm": summary["iqm"], "iqm_low": summary["iqm_low"],
            "iqm_high": summary["iqm_high"],
            "final_rates": {n: r["config"]["learning_rate"] for n, r in result.trials.items()},
            "lineage": sweep.get("lineage", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--interval", type=int, default=15,
                        help="iterations (1,024 env steps each) per PBT round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "pbt_acrobot.json")
    parser.add_argument("--md", type=Path, default=HERE / "sweeps.md")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.interval = 60_000, 10
    from distributed import Client

    from daskrl.cluster.local import local_cluster

    cluster = local_cluster([{"CPU": 1}] * args.workers)
    client = Client(cluster)
    load = [load_average()]
    arms = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("pbt", "fixed"):
                arms.append(arm(name, client, Path(tmp) / name, args.steps, args.interval,
                                args.seed))
                load.append(load_average())
                print(f"{name}: best {arms[-1]['best']:.1f}, IQM {arms[-1]['iqm']:.1f}, "
                      f"{arms[-1]['wall_s']:.0f} s", flush=True)
    finally:
        client.close()
        cluster.close()
    write_json(args.json, {"machine": machine_info(), "load": load, "steps": args.steps,
                           "interval": args.interval, "start_rates": POOR, "arms": arms})
    table = markdown_table(
        ["arm", "best final return", "IQM [95 % CI]", "wall clock s"],
        [[a["arm"], a["best"], f"{a['iqm']:.1f} [{a['iqm_low']:.1f}, {a['iqm_high']:.1f}]",
          a["wall_s"]] for a in arms])
    pbt, fixed = arms
    loads = [x["load_1m"] for x in load]
    verdict = ("beats" if pbt["best"] > fixed["best"] else "does not beat")
    text = (f"PPO on Acrobot-v1, {args.steps:,} env steps per member, eight members started "
            f"from the learning rates {', '.join(f'{lr:g}' for lr in POOR)} (PPO's default "
            f"here: 2.5e-4); PBT every {args.interval} iterations (1,024 env steps each), "
            f"bottom quarter copies the top quarter, rates x0.8/x1.2 within 1e-6..1e-1. "
            f"{args.workers} workers, {time.strftime('%Y-%m-%d')}, load (1 min) "
            f"{min(loads):.1f}-{max(loads):.1f}. Greedy return at the end (10 episodes).\n\n"
            f"{table}\n\nPBT's best member {verdict} the best fixed member "
            f"({pbt['best']:.1f} against {fixed['best']:.1f}); {len(pbt['lineage'])} copies. "
            f"PBT's final rates: {', '.join(f'{v:.2g}' for v in pbt['final_rates'].values())}"
            ".\n\n`python benchmarks/pbt_acrobot.py`")
    update_section(args.md, "pbt-acrobot", text)
    print(text)


if __name__ == "__main__":
    main()
