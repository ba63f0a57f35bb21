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
  minibatch (``data-parallel:allreduce=dask``), each worker holding ``agents / 2`` agents.

Times are medians over the timed iterations (the first one, which builds envs and models,
is not timed). Run ``python benchmarks/mappo_scale.py -h``.

Examples
--------
``python benchmarks/mappo_scale.py --quick`` (a smoke test, writes nothing here)
``python benchmarks/mappo_scale.py --agents 1000 10000 100000 --workers 1 2``
``python benchmarks/mappo_scale.py --device cuda --agents 1000 100000 1000000 --modes inline``
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import tempfile
import time
from itertools import pairwise
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

AGENTS_PER_ENV = 4
MODES = ("inline", "single", "data-parallel")


def minibatches(slots: int, agents_per_slot: int, minibatch_agents: int) -> int:
    """Minibatches of about ``minibatch_agents`` agent samples from ``slots`` (step, env) slots.

    Examples
    --------
    >>> minibatches(25 * 250, 4, 32768), minibatches(10, 4, 32768)
    (1, 1)
    >>> minibatches(25 * 25_000, 4, 32768)
    77
    """
    return max(1, min(slots, math.ceil(slots * agents_per_slot / minibatch_agents)))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_inline(agents: int, device: str, max_cycles: int = 25, iterations: int = 3,
                update_epochs: int = 4, minibatch_agents: int = 32768, seed: int = 0
                ) -> dict[str, Any]:
    """Time rollout + update in this process (no Dask) for ``agents`` agents on ``device``.

    Returns medians of ``rollout_s``, ``update_s``, ``iteration_s`` and
    ``agent_steps_per_s`` over ``iterations`` timed iterations (after one untimed one).
    """
    import torch

    from marl.mappo import (
        EnvSpec,
        MAPPOActor,
        MAPPOHyper,
        MAPPOLearner,
        ModelSpec,
        RolloutSpec,
        layout_of,
    )

    envs = agents // AGENTS_PER_ENV
    spec = EnvSpec("simple_tag", max_cycles=max_cycles)
    mb = minibatches(max_cycles * envs, AGENTS_PER_ENV, minibatch_agents)
    hp = MAPPOHyper(update_epochs=update_epochs, num_minibatches=mb)
    learner = MAPPOLearner(layout_of(spec), ModelSpec(), hp, seed, device)
    actor = MAPPOActor(spec, ModelSpec(), RolloutSpec(), envs, seed + 1, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    rows = []
    for k in range(iterations + 1):
        actor.set_weights(learner.weights(), k)
        _sync(device)
        t0 = time.perf_counter()
        batch = actor.collect(max_cycles)
        _sync(device)
        t1 = time.perf_counter()
        learner.update([batch], 0.0)
        _sync(device)
        t2 = time.perf_counter()
        if k > 0:
            rows.append((t1 - t0, t2 - t1, t2 - t0))
        del batch
    out = _medians(rows, agents, max_cycles)
    out.update(mode="inline", workers=1, envs=envs, num_minibatches=mb, device=device,
               update_epochs=update_epochs)
    if device.startswith("cuda"):
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def _medians(rows: list[tuple[float, float, float]], agents: int, steps: int
             ) -> dict[str, Any]:
    rollout, update, total = (statistics.median(c) for c in zip(*rows, strict=True))
    return {"agents": agents, "rollout_s": rollout, "update_s": update, "iteration_s": total,
            "agent_steps_per_s": agents * steps / total, "repeats": len(rows),
            "iteration_s_all": [r[2] for r in rows]}


def _malloc_env() -> dict[str, str | None]:
    """The glibc allocator settings a process was started with (what its workers got; a
    process that sets them after it started runs with glibc's defaults)."""
    import os

    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")}


def time_dask(agents: int, workers: int, max_cycles: int = 25, iterations: int = 3,
              update_epochs: int = 4, minibatch_agents: int = 32768,
              malloc_trim: int | None = None, allreduce: str = "dask") -> dict[str, Any]:
    """Time iterations of ``graphs/mappo.py`` through daskrl's driver on a local cluster.

    ``workers == 1``: the ``single`` distribution; otherwise ``data-parallel`` with one
    replica (``agents / workers`` agents) per worker. ``malloc_trim`` replaces the
    ``MALLOC_TRIM_THRESHOLD_`` of Dask's nanny config; daskrl's own worker settings
    (``daskrl.cluster.forkserver.WORKER_MALLOC``) are applied after it and win, so the
    result records what the workers actually got (``worker_malloc``).
    """
    import csv

    import dask
    from distributed import Client

    from daskrl import Resources
    from daskrl.cluster.local import local_cluster
    from daskrl.core.script import load_graph
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train

    graph = load_graph(str(HERE.parent / "graphs" / "mappo.py"))
    envs = agents // AGENTS_PER_ENV // workers
    mb = minibatches(max_cycles * envs, AGENTS_PER_ENV, minibatch_agents)
    config = graph.Config(num_envs=envs, num_actors=workers, num_steps=max_cycles,
                          max_cycles=max_cycles, update_epochs=update_epochs,
                          num_minibatches=mb, device="cpu")
    algo = graph.build(config).with_resources({"learner": Resources(cpu=1)})
    name = "single" if workers == 1 else "data-parallel"
    dist = get_distribution(name if workers == 1 else f"{name}:allreduce={allreduce}")
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if malloc_trim is not None:
        environ["MALLOC_TRIM_THRESHOLD_"] = malloc_trim
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = local_cluster([{"CPU": 1}] * workers)
    try:
        with Client(cluster) as client, tempfile.TemporaryDirectory() as tmp:
            worker_malloc = next(iter(client.run(_malloc_env).values()))
            settings = RunSettings(out=Path(tmp), steps=(iterations + 1) * algo.steps_per_iteration,
                                   eval=False, progress=False, tensorboard=False,
                                   checkpoint_every=10**6)
            train(client, algo, dist, settings)
            with open(Path(tmp) / "metrics.csv", newline="") as fh:
                rows = list(csv.DictReader(fh))[1:]
    finally:
        cluster.close()
    timed = [(float(r["rollout_s"]), float(r["update_s"]), float(r["iteration_s"]))
             for r in rows]
    out = _medians(timed, agents, max_cycles)
    out.update(mode=name if workers == 1 or allreduce == "dask" else f"{name}:{allreduce}",
               workers=workers, envs=envs * workers, num_minibatches=mb, device="cpu",
               update_epochs=update_epochs, worker_malloc=worker_malloc,
               overhead_s=statistics.median(float(r["overhead_s"]) for r in rows))
    if rows and rows[0].get("update_cpu_s"):  # replica 0's own CPU time in the update
        cpu = [float(r["update_cpu_s"]) for r in rows]
        out["update_cpu_s"] = statistics.median(cpu)
        out["update_wait_s"] = statistics.median(
            float(r["update_s"]) - c for r, c in zip(rows, cpu, strict=True))
        out["sync_rounds"] = update_epochs * mb + 1 if workers > 1 else 0
    return out


def _layer_shapes(layout: Any, spec: Any, slots: int, teams: list[int], split: bool
                  ) -> list[tuple[int, int, int, bool]]:
    """``(rows, in, out, first)`` of every linear layer a MAPPO minibatch of ``slots``
    (step, env) slots runs through, per trained team (actor, then critic). ``split``: the
    central critic's first layer takes the global state once per slot and the own
    observation once per agent (else the concatenation once per agent)."""
    shapes = []
    for t in teams:
        rows, d = slots * len(layout.agents[t]), layout.team_obs_dim(t)
        widths = [d, *spec.hidden, layout.team_num_actions(t)]
        shapes += [(rows, i, o, k == 0) for k, (i, o) in enumerate(pairwise(widths))]
        state = layout.state_dim
        widths = [d if split else d + state, *spec.hidden, 1]
        for k, (i, o) in enumerate(pairwise(widths)):
            if k == 0 and split:
                shapes.append((slots, state, o, True))
            shapes.append((rows, i, o, k == 0))
    return shapes


def _median_time(fn: Any, repeats: int) -> float:
    """Median CPU seconds of ``fn()`` (process time: with one torch thread, the work alone,
    far less sensitive than wall time to other jobs sharing the cores)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def flop_check(minibatch_agents: int = 32768, repeats: int = 5, seed: int = 0,
               split: bool = True, sigmoid_tanh: bool = True, compile: bool = False
               ) -> dict[str, Any]:
    """The MAPPO update's FLOP rate on one minibatch against ``torch.matmul`` on the same
    layer shapes (one thread: call ``torch.set_num_threads`` first).

    FLOPs count the matrix products of every linear layer: forward ``2 r i o``, weight
    gradient ``2 r i o``, input gradient ``2 r i o`` except for the first layer (its input
    needs none). The micro-benchmark times those same three products per layer with
    ``torch.matmul`` (contiguous operands); ``gemm_fraction`` is its time over the update's
    (1.0: the update runs at GEMM speed, all else free). Times are CPU seconds.
    ``split``/``sigmoid_tanh`` switch the two speed-ups of :class:`marl.mappo.MAPPOModel`
    (the critic's first layer split, tanh as a sigmoid) off for comparison; ``compile``
    differentiates the ``torch.compile``-d loss (``MAPPOHyper.compile``, inductor's own tanh;
    the compile itself happens in the untimed first call).
    """
    import torch

    from marl.activations import swap_tanh
    from marl.mappo import (
        EnvSpec,
        MAPPOActor,
        MAPPOHyper,
        MAPPOLearner,
        ModelSpec,
        RolloutSpec,
        layout_of,
    )

    spec, model = EnvSpec("simple_tag"), ModelSpec()
    layout = layout_of(spec)
    envs = max(1, minibatch_agents // AGENTS_PER_ENV // spec.max_cycles)
    learner = MAPPOLearner(layout, model, MAPPOHyper(update_epochs=1, compile=compile), seed)
    learner.model.split_state_layer = split
    if not sigmoid_tanh and not compile:
        for net in [*learner.model.actors, *learner.model.critics]:
            swap_tanh(net, torch.nn.Tanh)
    actor = MAPPOActor(spec, model, RolloutSpec(), envs, seed + 1, "cpu")
    actor.set_weights(learner.weights(), 0)
    batch = actor.collect(spec.max_cycles)
    mb = learner.minibatches([batch], 0.0)[0]
    slots = len(mb["obs"])

    def step() -> None:
        grads, _ = learner.compute_gradients(mb)
        learner.apply_gradients(grads)

    update_s = _median_time(step, repeats)
    shapes = _layer_shapes(layout, model, slots, learner.teams, split)
    flops = sum(2 * r * i * o * (2 if first else 3) for r, i, o, first in shapes)
    gemm_s = 0.0
    for r, i, o, first in shapes:
        x, w, dy = torch.randn(r, i), torch.randn(i, o), torch.randn(r, o)
        wt, xt = w.t().contiguous(), x.t().contiguous()
        gemm_s += _median_time(lambda x=x, w=w: torch.matmul(x, w), repeats)
        gemm_s += _median_time(lambda xt=xt, dy=dy: torch.matmul(xt, dy), repeats)
        if not first:
            gemm_s += _median_time(lambda dy=dy, wt=wt: torch.matmul(dy, wt), repeats)
    return {"mode": "flops", "split_state_layer": split,
            "sigmoid_tanh": sigmoid_tanh and not compile, "compile": compile,
            "slots": slots,
            "agent_samples": slots * layout.num_agents,
            "flops_per_sample": flops / (slots * layout.num_agents), "update_step_s": update_s,
            "update_gflops": flops / update_s / 1e9, "gemm_s": gemm_s,
            "gemm_gflops": flops / gemm_s / 1e9, "gemm_fraction": gemm_s / update_s,
            "threads": torch.get_num_threads(), "load": load_average()["load_1m"]}


def update_cpu(envs: int, rounds: int = 5, update_epochs: int = 4,
               minibatch_agents: int = 32768) -> dict[str, Any]:
    """CPU seconds and minor page faults of this thread for one MAPPO rollout and one update
    at ``envs`` simple-tag envs (medians over ``rounds``, after one untimed round).

    Thread CPU time and page faults do not grow with other jobs' load the way wall time
    does, so this compares the same work inline and inside a Dask worker task on a shared
    machine (:func:`worker_vs_inline`).
    """
    import os
    import threading

    import torch

    from marl.mappo import (
        EnvSpec,
        MAPPOActor,
        MAPPOHyper,
        MAPPOLearner,
        ModelSpec,
        RolloutSpec,
        layout_of,
    )

    torch.set_num_threads(1)
    spec, model = EnvSpec("simple_tag"), ModelSpec()
    mb = minibatches(25 * envs, AGENTS_PER_ENV, minibatch_agents)
    learner = MAPPOLearner(layout_of(spec), model,
                           MAPPOHyper(update_epochs=update_epochs, num_minibatches=mb), 0)
    actor = MAPPOActor(spec, model, RolloutSpec(), envs, 1, "cpu")
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(25)
    learner.update([batch], 0.0)
    upd, roll, faults = [], [], []
    for _ in range(rounds):
        r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
        learner.update([batch], 0.0)
        r1, t1 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
        batch = actor.rollout(25)
        upd.append(t1 - t0)
        roll.append(time.thread_time() - t1)
        faults.append(r1.ru_minflt - r0.ru_minflt)
    return {"update_cpu_s": statistics.median(upd), "rollout_cpu_s": statistics.median(roll),
            "update_minor_faults": statistics.median(faults), "minibatches": mb,
            "main_thread": threading.current_thread() is threading.main_thread(),
            "malloc": {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_",
                                                      "MALLOC_MMAP_THRESHOLD_")}}


def worker_vs_inline(agents: int, rounds: int = 5, repeats: int = 2) -> dict[str, Any]:
    """:func:`update_cpu` in this process's main thread and in a task on a one-worker
    daskrl cluster (its worker settings: allocator, one thread), interleaved ``repeats``
    times; medians."""
    from distributed import Client

    from daskrl.cluster.local import local_cluster

    envs = agents // AGENTS_PER_ENV
    cluster = local_cluster([{"CPU": 1}])
    runs: dict[str, list[dict[str, Any]]] = {"inline": [], "worker": []}
    load0 = load_average()["load_1m"]
    try:
        with Client(cluster) as client:
            client.run(sys.path.insert, 0, str(HERE.parent))  # marl, for the task
            for _ in range(repeats):
                runs["inline"].append(update_cpu(envs, rounds))
                runs["worker"].append(client.submit(update_cpu, envs, rounds,
                                                    pure=False).result())
    finally:
        cluster.close()
    out: dict[str, Any] = {"mode": "cpu-ab", "agents": agents, "load_before": load0,
                           "load_after": load_average()["load_1m"], "runs": runs}
    for where, rows in runs.items():
        for key in ("update_cpu_s", "rollout_cpu_s", "update_minor_faults"):
            out[f"{where}_{key}"] = statistics.median(r[key] for r in rows)
    out["worker_over_inline_update"] = out["worker_update_cpu_s"] / out["inline_update_cpu_s"]
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of the results."""
    headers = ["agents", "mode", "workers", "device", "envs", "minibatches", "rollout s",
               "update s", "iteration s", "agent-steps/s"]
    rows = [[r["agents"], r["mode"], r["workers"], r["device"], r["envs"], r["num_minibatches"],
             r.get("rollout_s"), r.get("update_s"), r.get("iteration_s"),
             r.get("agent_steps_per_s")] if "error" not in r else
            [r["agents"], r["mode"], r["workers"], r["device"], "-", "-", "-", "-", "-",
             f"failed: {r['error'][:60]}"] for r in results]
    return markdown_table(headers, rows, align="rllllrrrrr")


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
    p.add_argument("--allreduce", choices=["dask", "torch"], default="dask",
                   help="data-parallel's gradient averaging: Dask tasks per minibatch, or "
                        "torch.distributed (gloo) between the replicas")
    p.add_argument("--malloc-trim", type=int, default=None,
                   help="MALLOC_TRIM_THRESHOLD_ in Dask's nanny config (daskrl's worker "
                        "settings win; kept for comparison runs)")
    p.add_argument("--flops", action="store_true", help="only the update's FLOP rate on one "
                   "minibatch of --minibatch-agents against torch.matmul on its layer shapes")
    p.add_argument("--cpu-ab", action="store_true", help="only the update's and rollout's "
                   "CPU seconds and page faults inline vs in a Dask worker, at each --agents")
    p.add_argument("--repeat-flops", type=int, default=3,
                   help="--flops: rounds over the variants (medians over them)")
    p.add_argument("--quick", action="store_true", help="1000 agents, 1 timed iteration; "
                   "writes nothing unless --json is given")
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
    if args.cpu_ab:
        ab = [worker_vs_inline(a, max(3, args.iterations)) for a in args.agents]
        for row in ab:
            print({k: v for k, v in row.items() if k != "runs"}, flush=True)
        if args.json is not None:
            write_json(args.json, {"benchmark": "mappo_cpu_ab", "machine": machine_info(),
                                   "settings": vars(args) | {"json": str(args.json)},
                                   "results": ab})
        return 0
    bad = [a for a in args.agents if a % AGENTS_PER_ENV]
    if bad:
        p.error(f"--agents {bad} must be multiples of {AGENTS_PER_ENV}")
    load_before = load_average()
    results: list[dict[str, Any]] = []
    for agents in args.agents:
        plan: list[tuple[str, int]] = []
        if "inline" in args.modes:
            plan.append(("inline", 1))
        for w in args.workers:
            mode = "single" if w == 1 else "data-parallel"
            if mode in args.modes:
                plan.append((mode, w))
        for mode, workers in plan:
            kw = dict(max_cycles=args.max_cycles, iterations=args.iterations,
                      update_epochs=args.update_epochs, minibatch_agents=args.minibatch_agents)
            print(f"agents={agents} mode={mode} workers={workers} ...", flush=True)
            try:
                res = (time_inline(agents, args.device, **kw) if mode == "inline"
                       else time_dask(agents, workers, **kw, malloc_trim=args.malloc_trim,
                                      allreduce=args.allreduce))
            except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
                res = {"agents": agents, "mode": mode, "workers": workers,
                       "device": args.device if mode == "inline" else "cpu",
                       "error": f"{type(exc).__name__}: {exc}"}
            print({k: v for k, v in res.items() if k != "iteration_s_all"}, flush=True)
            results.append(res)
    data = {"benchmark": "mappo_scale", "settings": vars(args) | {"json": str(args.json)},
            "machine": machine_info(), "load_before": load_before, "load_after": load_average(),
            "results": results}
    print(table(results))
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


if __name__ == "__main__":
    sys.exit(main())
