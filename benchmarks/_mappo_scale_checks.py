"""The CPU checks of ``mappo_scale.py``: the update's FLOP rate against ``torch.matmul``, the
same work inline vs in a Dask worker, and two updates at once vs one (the machine's own
ceiling for two replicas)."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from _common import load_average
from _mappo_scale_runs import AGENTS_PER_ENV, minibatches

HERE = Path(__file__).resolve().parent


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
    runs the compiled halves of a gradient step, gradients then clip and Adam
    (``MAPPOHyper.compile``, inductor's own tanh; the compile itself happens in the untimed
    first call).
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


def _update_cpu_child(envs: int, rounds: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(Path(__file__)), str(envs), str(rounds)],
                         capture_output=True, text=True, check=True, cwd=HERE.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def two_at_once(agents: int, rounds: int = 3, repeats: int = 2) -> dict[str, Any]:
    """:func:`update_cpu` at ``agents / 2`` agents in one process alone, then in two processes
    at once (no Dask, no gradient exchange), interleaved ``repeats`` times.

    The CPU seconds of an update in the pair over those alone is what two replicas cost each
    other through the shared caches and memory: ``2 / that`` bounds what two data-parallel
    workers can gain over one on this machine, whatever the all-reduce.
    """
    from concurrent.futures import ThreadPoolExecutor

    envs = agents // 2 // AGENTS_PER_ENV
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], "pair": []}
    load0 = load_average()["load_1m"]
    with ThreadPoolExecutor(2) as pool:
        for _ in range(repeats):
            runs["alone"].append(_update_cpu_child(envs, rounds))
            runs["pair"] += list(pool.map(lambda _: _update_cpu_child(envs, rounds), range(2)))
    out: dict[str, Any] = {"mode": "two-at-once", "agents": agents, "agents_each": envs * 4,
                           "load_before": load0, "load_after": load_average()["load_1m"],
                           "runs": runs}
    for where, rows in runs.items():
        for key in ("update_cpu_s", "rollout_cpu_s"):
            out[f"{where}_{key}"] = statistics.median(r[key] for r in rows)
    out["pair_over_alone_update"] = out["pair_update_cpu_s"] / out["alone_update_cpu_s"]
    out["pair_over_alone_rollout"] = out["pair_rollout_cpu_s"] / out["alone_rollout_cpu_s"]
    out["ceiling_2_workers"] = 2 / out["pair_over_alone_update"]
    return out


def _gloo_child(rank: int, store: str, numel: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    flat = torch.randn(numel)
    times = []
    for k in range(rounds + 10):  # 10 untimed: connections, buffers
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        flat.div_(2)
        if k >= 10:
            times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"median_s": statistics.median(times), "p90_s": sorted(times)[int(0.9 * rounds)]}


def gloo_round(numel: int = 30_000, rounds: int = 500) -> dict[str, Any]:
    """The all-reduce itself: two processes on this host all-reduce ``numel`` float32 (a
    MAPPO step's gradients are about 30k) back to back, both always ready, gloo as in
    ``data-parallel:allreduce=torch``; median and 90th percentile seconds per call on rank 0.
    What overlapping the all-reduce with the backward pass could hide is at most this per
    round (and nothing while both cores are busy computing)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        procs = [subprocess.Popen([sys.executable, str(Path(__file__)), "gloo", str(r), store,
                                   str(numel), str(rounds)], stdout=subprocess.PIPE, text=True,
                                  cwd=HERE.parent) for r in range(2)]
        outs = [p.communicate()[0] for p in procs]
    res = json.loads(outs[0].strip().splitlines()[-1])
    return {"mode": "gloo-round", "numel": numel, "rounds": rounds,
            "load": load_average()["load_1m"], **res}


if __name__ == "__main__":  # a child of two_at_once or gloo_round
    sys.path.insert(0, str(HERE.parent))
    if sys.argv[1] == "gloo":
        print(json.dumps(_gloo_child(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                     int(sys.argv[5]))), flush=True)
    else:
        print(json.dumps(update_cpu(int(sys.argv[1]), int(sys.argv[2]))), flush=True)
