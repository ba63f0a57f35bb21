"""The timed runs of ``mappo_scale.py``: MAPPO iterations inline and through daskrl's driver
(``single`` on one worker, ``data-parallel`` on several), and their markdown tables."""

from __future__ import annotations

import math
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import load_average, markdown_table, ratio

HERE = Path(__file__).resolve().parent
AGENTS_PER_ENV = 4


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
    rows, cpu = [], []
    for k in range(iterations + 1):
        actor.set_weights(learner.weights(), k)
        _sync(device)
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = actor.collect(max_cycles)
        _sync(device)
        t1, c1 = time.perf_counter(), time.thread_time()
        learner.update([batch], 0.0)
        _sync(device)
        t2, c2 = time.perf_counter(), time.thread_time()
        if k > 0:
            rows.append((t1 - t0, t2 - t1, t2 - t0))
            cpu.append((c1 - c0, c2 - c1))
        del batch
    out = _medians(rows, agents, max_cycles)
    out["rollout_cpu_s"] = statistics.median(c[0] for c in cpu)
    out["update_cpu_s"] = statistics.median(c[1] for c in cpu)
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


def _worker_threads() -> dict[str, int]:
    """torch's intra-op and inter-op thread counts in this process (run on each worker: a
    replica with more than one thread would fight the other for the two cores)."""
    import torch

    return {"intra": torch.get_num_threads(), "interop": torch.get_num_interop_threads()}


def _malloc_env() -> dict[str, str | None]:
    """The glibc allocator settings a process was started with (what its workers got; a
    process that sets them after it started runs with glibc's defaults)."""
    import os

    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")}


def time_dask(agents: int, workers: int, max_cycles: int = 25, iterations: int = 3,
              update_epochs: int = 4, minibatch_agents: int = 32768,
              malloc_trim: int | None = None, allreduce: str = "dask", upkeep: str = "dask"
              ) -> dict[str, Any]:
    """Time iterations of ``graphs/mappo.py`` through daskrl's driver on a local cluster.

    ``workers == 1``: the ``single`` distribution; otherwise ``data-parallel`` with one
    replica (``agents / workers`` agents) per worker. ``malloc_trim`` replaces the
    ``MALLOC_TRIM_THRESHOLD_`` of Dask's nanny config; daskrl's own worker settings
    (``daskrl.cluster.forkserver.WORKER_MALLOC``) are applied after it and win, so the
    result records what the workers actually got (``worker_malloc``). ``upkeep="quiet"``
    starts the cluster (scheduler, nannies, workers) under
    :data:`daskrl.cluster.upkeep.QUIET_UPKEEP` (event-loop tick 1 s, memory monitor 1 s,
    system monitor 10 s): on two cores shared by two replicas in lock-step, every wake-up of
    a periodic callback takes a core from one replica and stalls both at the next round.
    ``tree_cpu_s`` is the CPU seconds of this process and all its children (scheduler,
    client, nannies, workers) over the run, ``train_wall_s`` its wall time, and
    ``foreign_share`` the share of the machine's CPUs that other processes used meanwhile
    (0 on an idle machine: a 2-worker row needs both cores, so any other job costs it).
    """
    import csv

    import dask
    import psutil
    from distributed import Client

    from daskrl import Resources
    from daskrl.cluster.local import local_cluster
    from daskrl.cluster.upkeep import QUIET_UPKEEP
    from daskrl.core.script import load_graph
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train

    load0 = load_average()["load_1m"]
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
    quiet = QUIET_UPKEEP if upkeep == "quiet" else {}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ, **quiet}):
        cluster = local_cluster([{"CPU": 1}] * workers)
    try:
        with Client(cluster) as client, tempfile.TemporaryDirectory() as tmp:
            worker_malloc = next(iter(client.run(_malloc_env).values()))
            threads = sorted(client.run(_worker_threads).items())
            settings = RunSettings(out=Path(tmp), steps=(iterations + 1) * algo.steps_per_iteration,
                                   eval=False, progress=False, tensorboard=False,
                                   checkpoint_every=10**6)
            tree = [psutil.Process(), *psutil.Process().children(recursive=True)]
            cpu0, busy0, wall0 = _tree_cpu(tree), _busy_cpu(), time.perf_counter()
            train(client, algo, dist, settings)
            tree_cpu, train_wall = _tree_cpu(tree) - cpu0, time.perf_counter() - wall0
            foreign = _busy_cpu() - busy0 - tree_cpu
            with open(Path(tmp) / "metrics.csv", newline="") as fh:
                rows = list(csv.DictReader(fh))[1:]
    finally:
        cluster.close()
    timed = [(float(r["rollout_s"]), float(r["update_s"]), float(r["iteration_s"]))
             for r in rows]
    load = load_average()["load_1m"]
    out = _medians(timed, agents, max_cycles)
    mode = name if workers == 1 or allreduce == "dask" else f"{name}:{allreduce}"
    out.update(mode=mode + ("+quiet" if upkeep == "quiet" else ""), upkeep=upkeep,
               tree_cpu_s=tree_cpu, train_wall_s=train_wall, foreign_cpu_s=foreign,
               foreign_share=foreign / (train_wall * (psutil.cpu_count() or 1)),
               workers=workers, envs=envs * workers, num_minibatches=mb, device="cpu",
               update_epochs=update_epochs, worker_malloc=worker_malloc,
               overhead_s=statistics.median(float(r["overhead_s"]) for r in rows),
               worker_threads=[t for _, t in threads], load_before=load0, load_after=load)
    phases = [k for k in rows[0] if k.startswith("dp/")] if rows else []
    if phases:  # where a replica's update went (daskrl.distributions.replica.round_split)
        out["phases"] = {k: statistics.median(float(r[k]) for r in rows if r.get(k))
                         for k in phases}
    if rows and rows[0].get("rollout_cpu_s"):  # (replica 0's) rollout, its thread's CPU
        out["rollout_cpu_s"] = statistics.median(float(r["rollout_cpu_s"]) for r in rows)
    if rows and rows[0].get("update_cpu_s"):  # replica 0's own CPU time in the update
        cpu = [float(r["update_cpu_s"]) for r in rows]
        out["update_cpu_s"] = statistics.median(cpu)
        out["update_wait_s"] = statistics.median(
            float(r["update_s"]) - c for r, c in zip(rows, cpu, strict=True))
        out["sync_rounds"] = update_epochs * mb + 1 if workers > 1 else 0
    return out


def _busy_cpu() -> float:
    """CPU seconds the whole machine was busy (all CPUs, since boot)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _tree_cpu(procs: list[Any]) -> float:
    """User + system CPU seconds of ``procs`` (psutil processes; gone ones count 0)."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except Exception:  # noqa: BLE001 - a process that ended: psutil.NoSuchProcess
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


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


def speedup_table(results: list[dict[str, Any]]) -> str:
    """``single`` against each data-parallel variant at each agent count: medians over every
    timed iteration of every round (the ``rounds`` of a row ran interleaved with the others),
    and the CPU seconds of ``single``'s rollout and update over those of one replica (2.0:
    the work split in halves; less: the replicas slow each other down, e.g. in the shared
    caches and memory)."""
    rows = []
    for agents in sorted({r["agents"] for r in results}):
        mine = [r for r in results if r["agents"] == agents and "error" not in r]
        for mode in sorted({r["mode"] for r in mine if r["mode"].startswith("data-parallel")}):
            one = "single+quiet" if mode.endswith("+quiet") else "single"
            single, dp = _pooled(mine, one), _pooled(mine, mode)
            rows.append([agents, mode, single, dp, ratio(single, dp),
                         ", ".join(f"{ratio(s, d):.2f}" for s, d in _per_round(mine, one, mode)
                                   if s and d),
                         ratio(_cpu(mine, one, "rollout_cpu_s"),
                               _cpu(mine, mode, "rollout_cpu_s")),
                         ratio(_cpu(mine, one, "update_cpu_s"),
                               _cpu(mine, mode, "update_cpu_s")),
                         _cpu(mine, one, "foreign_share"), _cpu(mine, mode, "foreign_share")])
    return markdown_table(["agents", "mode", "single s", "data-parallel s", "single / dp",
                           "per round", "rollout CPU single / replica 0",
                           "update CPU single / replica 0", "others' CPU share (single)",
                           "others' CPU share (dp)"], rows, align="rlrrrlrrrr")


def phase_table(results: list[dict[str, Any]]) -> str:
    """Where each data-parallel replica's update went, per replica (medians per iteration):
    wall and thread-CPU seconds of computing and applying gradients, waiting for the slower
    replica (at round 0: for the slower rollout, the rollout/update boundary), the
    all-reduce itself (from the last replica ready to the first average back), and the
    driver's gap between iterations (``overhead_s``)."""
    rows = []
    for r in results:
        ph = r.get("phases")
        if not ph:
            continue
        for k in range(r["workers"]):
            rows.append([r["agents"], r["mode"], r.get("round", 0), k,
                         ph.get(f"dp/rollout_s/r{k}"), ph.get(f"dp/rollout_cpu_s/r{k}"),
                         ph.get(f"dp/compute_s/r{k}"), ph.get(f"dp/compute_cpu_s/r{k}"),
                         ph.get(f"dp/apply_s/r{k}"), ph.get(f"dp/prepare_s/r{k}"),
                         ph.get(f"dp/wait_s/r{k}"), ph.get(f"dp/first_wait_s/r{k}"),
                         ph.get("dp/sync_s"), ph.get("dp/stats_round_s"),
                         ph.get(f"dp/finish_s/r{k}"), r.get("update_s"), r.get("overhead_s"),
                         r.get("foreign_share"), r.get("load_after")])
    return markdown_table(
        ["agents", "mode", "round", "replica", "rollout s", "rollout CPU s", "gradients s",
         "gradients CPU s", "apply s", "prepare s", "wait s", "of which at round 0 s",
         "all-reduce s", "of which statistics s", "finish s", "update s",
         "between iterations s", "other processes' CPU share", "load"], rows,
        align="rlrrrrrrrrrrrrrrrrr")


def _pooled(rows: list[dict[str, Any]], mode: str) -> float | None:
    times = [t for r in rows if r["mode"] == mode for t in r["iteration_s_all"]]
    return statistics.median(times) if times else None


def _cpu(rows: list[dict[str, Any]], mode: str, key: str) -> float | None:
    values = [r[key] for r in rows if r["mode"] == mode and r.get(key) is not None]
    return statistics.median(values) if values else None


def _per_round(rows: list[dict[str, Any]], one: str, mode: str
               ) -> list[tuple[float, float]]:
    single = {r.get("round", 0): r["iteration_s"] for r in rows if r["mode"] == one}
    return [(single[r.get("round", 0)], r["iteration_s"]) for r in rows
            if r["mode"] == mode and r.get("round", 0) in single]
