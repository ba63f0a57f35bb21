"""One point of the scale lab: a run of one distribution with N sleeping actors on a cluster of
separate processes, and what it cost (imported by ``scale_actors.py`` and
``emulated_hosts.py``; run as ``python _scale_point.py SPEC_JSON`` it prints one JSON line).

The cluster (:func:`daskrl.cluster.hosts.host_cluster`): the scheduler in a process of its
own, ``actor_procs`` worker processes sharing the actors as threads (each advertises one CPU
slot per actor it hosts), and a learner worker that offers only the resource ``learner_host``,
which the learner (and Ape-X's replay shards) ask for: no rollout runs beside the learner.
The driver is this process. With ``learner_cpus`` in the spec the learner's worker runs on
those CPUs only and the scheduler, the actors and the driver on the others: the learner a
host of its own, as it would be on a cluster. While the run trains, a thread samples the
cluster's counters every ``SAMPLE_S`` (:mod:`daskrl.observe.cluster_load`); every rate is
taken over the steady state (:func:`steady_rows`: after the first quarter and after the
drain of the rollouts that piled up while the learner started).
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distributed import Client

from daskrl.cluster.hosts import WorkerSpec, host_cluster
from daskrl.cluster.local import connect
from daskrl.core.resources import Resources
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.observe.cluster_load import Sample, rates, sample, start_counting
from daskrl.runtime.driver import RunSettings, train

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.5
"""Seconds between two samples of the cluster's counters."""
GRAPHS = {"actors-learner": "ppo", "impala": "impala", "apex": "dqn",
          "data-parallel": "ppo", "central-inference": "ppo", "single": "ppo"}
"""The graph each distribution runs in the lab."""


def run_isolated(cmd: Sequence[str], timeout: float, **kwargs: Any
                 ) -> subprocess.CompletedProcess[str] | None:
    """Run ``cmd`` in a process group of its own; on timeout kill the whole group (a point's
    scheduler and workers with it) and return None."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cpu_split(spec: Mapping[str, Any]) -> tuple[tuple[int, ...] | None,
                                                 tuple[int, ...] | None]:
    """The CPUs of the learner's worker and of everything else: ``(None, None)`` without
    ``learner_cpus`` in the spec (every process may run anywhere).

    Examples
    --------
    >>> cpu_split({})
    (None, None)
    >>> learner, rest = cpu_split({"learner_cpus": [0]})
    >>> learner, 0 in rest
    ((0,), False)
    """
    wanted = spec.get("learner_cpus")
    if not wanted:
        return None, None
    usable = sorted(os.sched_getaffinity(0))
    learner = tuple(int(c) for c in wanted)
    rest = tuple(c for c in usable if c not in learner)
    if not rest or not set(learner) <= set(usable):
        raise ValueError(f"learner_cpus {list(learner)}: this process may use CPUs {usable}; "
                         "give the learner a strict subset of them")
    return learner, rest


def worker_specs(spec: Mapping[str, Any],
                 cpus: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
                 ) -> list[WorkerSpec]:
    """The actor workers (``a0``...) and the learner's worker of a point.

    ``spec["hosts"]`` (emulated hosts) names, per worker in that order, its namespace and
    address; otherwise every worker listens on 127.0.0.1. ``cpus`` (:func:`cpu_split`'s
    learner and rest) pins the learner's worker and the actors' workers.
    """
    actors, procs = int(spec["actors"]), int(spec["actor_procs"])
    per = [actors // procs + (i < actors % procs) for i in range(procs)]
    hosts = list(spec.get("hosts") or [])
    learner_cpus, rest = cpus
    out = []
    for i, n in enumerate(per):
        ns, addr = hosts[i] if hosts else (None, "127.0.0.1")
        out.append(WorkerSpec(f"a{i}", nthreads=n, resources={"CPU": n}, netns=ns, host=addr,
                              cpus=rest))
    ns, addr = hosts[procs] if hosts else (None, "127.0.0.1")
    out.append(WorkerSpec("learner", nthreads=4, resources={"learner_host": 4}, netns=ns,
                          host=addr, cpus=learner_cpus))
    return out


APART = ("actors-learner", "impala", "apex", "central-inference")
"""Distributions with a learner apart from the actors: it (and Ape-X's replay shards) runs
on the learner's worker. ``data-parallel``'s replicas are learners each, on the actors'
workers, and ``single`` runs everything on one."""


def build(spec: Mapping[str, Any]) -> Any:
    """The point's algorithm, its learner (and replay) held to the learner's worker where
    the distribution keeps it apart (:data:`APART`)."""
    name = str(spec["distribution"]).split(":")[0]
    graph = load_graph(str(ROOT / "graphs" / f"{spec.get('graph') or GRAPHS[name]}.py"))
    config = graph.Config(num_actors=int(spec["actors"]), env_step_sleep=float(spec["sleep"]),
                          **dict(spec.get("config") or {}))
    algo = graph.build(config)
    if name not in APART:
        return algo.with_resources({"learner": Resources(cpu=1)})
    held = Resources(custom={"learner_host": 1})
    return algo.with_resources({role: held for role in ("learner", "replay")
                                if role in algo.resources})


class Sampler:
    """Samples the cluster's counters in a thread until :meth:`stop`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.samples: list[Sample] = []
        self.driver_cpu: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="lab-sampler")
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            try:
                s = sample(self.client)
            except Exception:  # noqa: BLE001 - a busy cluster may not answer in time
                s = None
            if s is not None:
                self.samples.append(s)
                self.driver_cpu.append((time.time(), time.process_time()))
            self.done.wait(SAMPLE_S)

    def stop(self) -> None:
        """Take a last sample and stop."""
        self.done.set()
        self.thread.join()
        self.samples.append(sample(self.client))
        self.driver_cpu.append((time.time(), time.process_time()))

    def at(self, t: float) -> tuple[Sample, float]:
        """The last sample taken at or before ``t`` (the first one if none), with the
        driver's CPU seconds then."""
        times = [s.time for s in self.samples]
        i = max(0, bisect.bisect_right(times, t) - 1)
        return self.samples[i], self.driver_cpu[i][1]


def steady_rows(rows: Sequence[Mapping[str, str]], skip: float = 0.25,
                ideal: float | None = None) -> tuple[int, int]:
    """The ``[first, last]`` row indices of the steady state: after the first ``skip`` of
    the iterations (at least one), up to the last, and, with ``ideal`` (env steps a
    second), after the backlog is drained.

    Free-running actors keep rolling out while the learner starts, so the first updates
    drain a backlog of finished rollouts, at up to several times the rate the actors can
    sustain; an iteration faster than ``ideal`` can only be that, and the one after it is
    partly that. The window starts two iterations after the last one above ``ideal`` in
    the first half of the run (later, a fast iteration is a catch-up after a stall, which
    the window keeps with its stall).

    Examples
    --------
    >>> steady_rows([{}] * 8), steady_rows([{}] * 2)
    ((2, 7), (1, 1))
    >>> rates = [0.1, 4.0, 3.5, 1.2, 0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
    >>> rows = [{"iteration_env_steps": "100", "iteration_s": str(100 / r)} for r in rates]
    >>> steady_rows(rows), steady_rows(rows, ideal=1.0)
    ((3, 11), (5, 11))
    >>> rows[-1]["iteration_s"] = "50"  # a catch-up at the end: kept in the window
    >>> steady_rows(rows, ideal=1.0)
    (5, 11)
    """
    first = min(len(rows) - 1, max(1, math.floor(skip * len(rows))))
    if ideal:
        fast = [i for i, r in enumerate(rows[:len(rows) // 2])
                if float(r["iteration_env_steps"]) > ideal * float(r["iteration_s"])]
        if fast:
            first = min(len(rows) - 1, max(first, fast[-1] + 2))
    return first, len(rows) - 1


def mean_of(rows: Sequence[Mapping[str, str]], key: str) -> float | None:
    """The mean of a metrics.csv column over ``rows`` (None where it is absent)."""
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]
    return sum(values) / len(values) if values else None


def learner_busy(rows: Sequence[Mapping[str, str]]) -> float | None:
    """The learner's busy share: the distribution's own ``learner_busy`` where it records
    one, else the learner's part of the iteration time."""
    own = mean_of(rows, "learner_busy")
    if own is not None:
        return own
    learn = sum(float(r.get("time/learn_s") or 0) for r in rows)
    wall = sum(float(r.get("time/iteration_s") or 0) for r in rows)
    return learn / wall if wall > 0 else None


def run_point(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run one point; its measurements (see the module docstring)."""
    algo = build(spec)
    name, _, opts = str(spec["distribution"]).partition(":")
    options = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
    distribution = get_distribution(name, **options)
    learner_cpus, rest = cpus = cpu_split(spec)
    specs = worker_specs(spec, cpus)
    scheduler_ns, scheduler_host = spec.get("scheduler_host") or (None, "127.0.0.1")
    out = Path(tempfile.mkdtemp(prefix="daskrl-scale-")) / "run"
    steps = int(spec["iterations"]) * algo.steps_per_iteration
    load_before = os.getloadavg()[0]
    if rest is not None:  # the driver beside the scheduler and the actors
        os.sched_setaffinity(0, rest)
    with host_cluster(specs, host=scheduler_host, netns=scheduler_ns,
                      scheduler_cpus=rest) as cluster:
        client = connect(cluster.scheduler_address, timeout=60)
        try:
            client.wait_for_workers(len(specs), timeout=120)
            start_counting(client)
            sampler = Sampler(client)
            t0 = time.time()
            summary = train(client, algo, distribution,
                            RunSettings(out=out, steps=steps, seed=int(spec.get("seed", 1)),
                                        eval=False, tensorboard=False, progress=False,
                                        task_timeout=spec.get("task_timeout")))
            sampler.stop()
        finally:
            client.close()
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    sleep = float(spec["sleep"])
    ideal = int(spec["actors"]) * algo.num_envs / sleep if sleep > 0 else None
    first, last = steady_rows(rows, ideal=ideal)
    steady = rows[first:last + 1]
    # each iteration's time on the learner's clock (from one learner's end to the next:
    # a task of several iterations records them all at once, so wall_s would not do)
    wall = sum(float(r["iteration_s"]) for r in steady)
    t_b = t0 + float(rows[last]["wall_s"])
    t_a = t_b - wall
    (a, cpu_a), (b, cpu_b) = sampler.at(t_a), sampler.at(t_b)
    env_steps = sum(int(float(r["iteration_env_steps"])) for r in steady)
    groups = {"actors": {w.name for w in specs if w.name != "learner"}, "learner": {"learner"}}
    load = rates(a, b, groups)
    result = {
        "distribution": spec["distribution"], "actors": int(spec["actors"]),
        "envs_per_actor": algo.num_envs, "steps_per_rollout": algo.num_steps,
        "actor_procs": int(spec["actor_procs"]), "env_step_sleep": sleep,
        "learner_cpus": list(learner_cpus) if learner_cpus else None,
        "env_steps_per_s": env_steps / wall, "ideal_env_steps_per_s": ideal,
        "of_ideal": env_steps / wall / ideal if ideal else None,
        "learner_busy": learner_busy(steady), "policy_lag_mean": mean_of(steady, "policy_lag"),
        "scheduler_tasks_per_s": load["scheduler_tasks_per_s"],
        "scheduler_cpu_share": load["scheduler_cpu_share"],
        "driver_cpu_s_per_iteration": (cpu_b - cpu_a) / len(steady),
        "weight_bytes_per_s": load["learner_bytes_per_s"],
        "rollout_bytes_per_s": load["actors_bytes_per_s"],
        "actors_cpu_share": load["actors_cpu_share"],
        "learner_cpu_share": load["learner_cpu_share"],
        "iteration_s": wall / len(steady), "rollout_s": mean_of(steady, "rollout_s"),
        "iterations": len(rows),
        "steady_first": first, "steady_iterations": len(steady), "steady_window_s": wall,
        "run_wall_s": summary["wall_s"], "final_return": summary["final_episode_return_mean"],
        "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0],
    }
    target = spec.get("target_return")
    if target is not None:
        reached = [r for r in rows if float(r.get("episode_return_mean") or "nan") >= target]
        result.update(target_return=target,
                      time_to_return_s=float(reached[0]["wall_s"]) if reached else None,
                      steps_to_return=int(float(reached[0]["env_steps"])) if reached else None)
    return result


if __name__ == "__main__":
    print(json.dumps(run_point(json.loads(sys.argv[1]))), flush=True)
