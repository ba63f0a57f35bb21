"""MAPPO training-iteration time and agent-steps/s against the number of agents and workers.

One iteration is a rollout of ``--max-cycles`` steps of every env followed by one MAPPO
update (``--update-epochs`` passes, minibatches of about ``--minibatch-agents`` agent
samples). The env is simple tag in its small layout: environments of 4 agents (1 good,
3 adversaries, 2 obstacles, full observability), ``E = agents / 4``, central critic.

Modes (each a row of the table):

* ``inline``: actor and learner in this process, no Dask (the cost of the work itself), with
  ``--threads`` torch threads (default 1, as a Dask worker's);
* ``single`` (workers = 1): ``daskrl``'s driver with the ``single`` distribution on a
  one-worker local cluster;
* ``data-parallel`` (workers = 2): the envs sharded over 2 workers, gradients averaged every
  minibatch (``--allreduce dask``: Dask tasks; ``torch``: gloo between the replicas; both
  in one run with ``--allreduce dask torch``), each worker holding ``agents / 2`` agents.

``--rounds R`` runs the whole plan R times, interleaved (single, then each data-parallel
variant, then again), so a drifting load hits every mode alike; the speed-up table pools
every round's timed iterations. Data-parallel rows also report where each replica's update
went (``round_split``: gradients, waiting for the slower replica, the all-reduce itself).

Times are medians over the timed iterations (the first one, which builds envs and models,
is not timed). Run ``python benchmarks/mappo_scale.py -h``.

Examples
--------
``python benchmarks/mappo_scale.py --quick`` (a smoke test, writes nothing here)
``python benchmarks/mappo_scale.py --agents 1000 10000 100000 --workers 1 2``
``python benchmarks/mappo_scale.py --device cuda --agents 1000 100000 1000000 --modes inline``
``python benchmarks/mappo_scale.py --agents 100000 --workers 1 2 --modes single data-parallel
--allreduce dask torch --iterations 3 --rounds 3 --json benchmarks/results/mappo_dp_100k.json``
(the 2-worker speed-up, both all-reduces, medians of 3 rounds)

The runs and tables live in ``_mappo_scale_runs.py``, the CPU checks (``--flops``,
``--cpu-ab``, ``--two-at-once``) in ``_mappo_scale_checks.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import (  # noqa: E402
    load_average,
    machine_info,
    markdown_table,
    update_section,
    write_json,
)
from _mappo_scale_checks import (  # noqa: E402
    flop_check,
    gloo_round,
    two_at_once,
    worker_vs_inline,
)
from _mappo_scale_runs import (  # noqa: E402
    AGENTS_PER_ENV,
    minibatches,
    phase_table,
    speedup_table,
    table,
    time_dask,
    time_inline,
)

MODES = ("inline", "single", "data-parallel")
__all__ = ["AGENTS_PER_ENV", "MODES", "main", "minibatches", "time_dask", "time_inline"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write JSON and the markdown section."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, nargs="+", default=[1000, 10_000, 100_000],
                   help="total agents (multiples of 4)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="Dask workers: 1 runs `single`, more run `data-parallel`")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--device", default="cpu", help="device of the inline mode (cpu or cuda)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads of the inline mode (Dask workers run 1 each)")
    p.add_argument("--iterations", type=int, default=3, help="timed iterations per setting")
    p.add_argument("--max-cycles", type=int, default=25, help="steps per rollout and episode")
    p.add_argument("--update-epochs", type=int, default=4, help="passes over each batch")
    p.add_argument("--minibatch-agents", type=int, default=32768,
                   help="agent samples per minibatch (about)")
    p.add_argument("--allreduce", choices=["dask", "torch"], nargs="+", default=["dask"],
                   help="data-parallel's gradient averaging: Dask tasks per minibatch, or "
                        "torch.distributed (gloo) between the replicas (both: one row each)")
    p.add_argument("--upkeep", choices=["dask", "quiet"], nargs="+", default=["dask"],
                   help="the Dask rows' cluster: Dask's default upkeep, or QUIET_UPKEEP "
                        "(daskrl.cluster.upkeep); both: every Dask row twice")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the plan of rows this many times, interleaved")
    p.add_argument("--malloc-trim", type=int, default=None,
                   help="MALLOC_TRIM_THRESHOLD_ in Dask's nanny config (daskrl's worker "
                        "settings win; kept for comparison runs)")
    p.add_argument("--flops", action="store_true", help="only the update's FLOP rate on one "
                   "minibatch of --minibatch-agents against torch.matmul on its layer shapes")
    p.add_argument("--cpu-ab", action="store_true", help="only the update's and rollout's "
                   "CPU seconds and page faults inline vs in a Dask worker, at each --agents")
    p.add_argument("--two-at-once", action="store_true", help="only one update at --agents / 2 "
                   "alone vs two at once in separate processes: the machine's ceiling for "
                   "2 data-parallel workers")
    p.add_argument("--gloo-round", action="store_true", help="only the all-reduce itself: "
                   "two processes all-reduce a MAPPO step's 30k gradients by gloo, 500 times")
    p.add_argument("--repeat-flops", type=int, default=3,
                   help="--flops: rounds over the variants (medians over them)")
    p.add_argument("--quick", action="store_true", help="1000 agents, 1 timed iteration; "
                   "writes nothing unless --json is given")
    p.add_argument("--md-section", default=None,
                   help="also write this run's tables into the section of that name in "
                        "mappo_scale.md (e.g. results-dp-quiet)")
    p.add_argument("--json", type=Path, default=None,
                   help="output JSON (default: benchmarks/results/mappo_scale.json, which also "
                        "rewrites this device's table in benchmarks/mappo_scale.md)")
    args = p.parse_args(argv)
    if args.quick:
        args.agents, args.iterations = [1000], 1
    import torch

    torch.set_num_threads(args.threads)
    if args.flops:
        rows = []
        for _ in range(args.repeat_flops):  # variants interleaved: the load drifts
            for split, sig, comp in ((False, False, False), (True, False, False),
                                     (True, True, False), (True, False, True)):
                rows.append(flop_check(args.minibatch_agents, max(3, args.iterations),
                                       split=split, sigmoid_tanh=sig, compile=comp))
                print(rows[-1], flush=True)
        if args.json is not None:
            write_json(args.json, {"benchmark": "mappo_flops", "machine": machine_info(),
                                   "settings": vars(args) | {"json": str(args.json)},
                                   "results": rows})
        return 0
    if args.gloo_round:
        print(gloo_round(), flush=True)
        return 0
    if args.cpu_ab or args.two_at_once:
        ab = [worker_vs_inline(a, max(3, args.iterations)) if args.cpu_ab
              else two_at_once(a, args.iterations, max(2, args.rounds)) for a in args.agents]
        for row in ab:
            print({k: v for k, v in row.items() if k != "runs"}, flush=True)
        if args.json is not None:
            name = "mappo_cpu_ab" if args.cpu_ab else "mappo_two_at_once"
            write_json(args.json, {"benchmark": name, "machine": machine_info(),
                                   "settings": vars(args) | {"json": str(args.json)},
                                   "results": ab})
        if args.md_section and args.two_at_once:
            rows = [[r["agents_each"], r["alone_update_cpu_s"], r["pair_update_cpu_s"],
                     r["pair_over_alone_update"], r["alone_rollout_cpu_s"],
                     r["pair_rollout_cpu_s"], r["pair_over_alone_rollout"],
                     r["ceiling_2_workers"], f"{r['load_before']:.1f}-{r['load_after']:.1f}"]
                    for r in ab]
            command = " ".join(["python", "benchmarks/mappo_scale.py", *(argv or sys.argv[1:])])
            update_section(HERE / "mappo_scale.md", args.md_section, f"`{command}`\n\n" +
                           markdown_table(["agents per process", "update CPU s alone",
                                           "update CPU s in a pair", "pair / alone",
                                           "rollout CPU s alone", "rollout CPU s in a pair",
                                           "pair / alone (rollout)", "2 / (pair / alone)",
                                           "load"], rows, align="rrrrrrrrl"))
        return 0
    bad = [a for a in args.agents if a % AGENTS_PER_ENV]
    if bad:
        p.error(f"--agents {bad} must be multiples of {AGENTS_PER_ENV}")
    load_before = load_average()
    results: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for agents in args.agents:
            for mode, workers, allreduce, upkeep in _plan(args):
                kw = dict(max_cycles=args.max_cycles, iterations=args.iterations,
                          update_epochs=args.update_epochs,
                          minibatch_agents=args.minibatch_agents)
                print(f"round={rnd} agents={agents} mode={mode} workers={workers} "
                      f"allreduce={allreduce} upkeep={upkeep} ...", flush=True)
                try:
                    res = (time_inline(agents, args.device, **kw) if mode == "inline"
                           else time_dask(agents, workers, **kw, malloc_trim=args.malloc_trim,
                                          allreduce=allreduce, upkeep=upkeep))
                except Exception as exc:  # noqa: BLE001 - reported in the table, run goes on
                    res = {"agents": agents, "mode": mode, "workers": workers,
                           "device": args.device if mode == "inline" else "cpu",
                           "error": f"{type(exc).__name__}: {exc}"}
                res["round"] = rnd
                print({k: v for k, v in res.items() if k != "iteration_s_all"}, flush=True)
                results.append(res)
    data = {"benchmark": "mappo_scale", "settings": vars(args) | {"json": str(args.json)},
            "machine": machine_info(), "load_before": load_before, "load_after": load_average(),
            "results": results}
    tables = table(results)
    if any(r.get("phases") for r in results):
        tables += "\n\n" + speedup_table(results) + "\n\n" + phase_table(results)
    print(tables)
    if args.md_section:
        command = " ".join(["python", "benchmarks/mappo_scale.py", *(argv or sys.argv[1:])])
        update_section(HERE / "mappo_scale.md", args.md_section,
                       f"Measured {load_before['time']}, load average "
                       f"{load_before['load_1m']:.1f} before, "
                       f"{data['load_after']['load_1m']:.1f} after; `{command}`.\n\n" + tables)
    if args.quick and args.json is None:
        return 0
    write_json(args.json or HERE / "results" / "mappo_scale.json", data)
    if args.json is not None:
        return 0  # a side run: the markdown keeps the default JSON's numbers
    body = (f"## {'CPU' if args.device == 'cpu' else args.device.upper()}\n\n"
            f"Measured {load_before['time']} on {data['machine']['cpu_model']} "
            f"({data['machine']['usable_cpus']} usable CPUs, load average "
            f"{load_before['load_1m']:.1f} before, {data['load_after']['load_1m']:.1f} after); "
            f"`{' '.join(['python', 'benchmarks/mappo_scale.py', *(argv or sys.argv[1:])])}`.\n\n"
            + table(results))
    update_section(HERE / "mappo_scale.md", f"results-{args.device}", body)
    return 0


def _plan(args: argparse.Namespace) -> list[tuple[str, int, str, str]]:
    """The rows of one round: ``(mode, workers, allreduce, upkeep)``."""
    plan: list[tuple[str, int, str, str]] = []
    if "inline" in args.modes:
        plan.append(("inline", 1, "-", "-"))
    for upkeep in args.upkeep:
        for w in args.workers:
            if w == 1 and "single" in args.modes:
                plan.append(("single", 1, "-", upkeep))
            elif w > 1 and "data-parallel" in args.modes:
                plan += [("data-parallel", w, a, upkeep) for a in args.allreduce]
    return plan


if __name__ == "__main__":
    sys.exit(main())
