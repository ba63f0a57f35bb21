"""Splitting each iteration's wall time, from the previous learner task's end to this one's,
into its parts (:data:`~daskrl.observe.parts.PARTS`) from Dask's task stream: the
scheduler's record of when each task computed and when the worker fetched its inputs.

Overlapping tasks of different roles share the time between them equally; rollouts fused
into a learner task (``single``, ``data-parallel``) are carved out of it by their own
clocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from daskrl.core.keys import in_iteration, of_runs, role_of, task_key
from daskrl.observe.parts import finite

_TRANSFER_ACTIONS = ("transfer", "deserialize", "disk-read", "disk-write")


def sweep(records: list[Mapping[str, Any]], start: float, stop: float
          ) -> tuple[dict[str, float], float, float]:
    """Split ``[start, stop]`` into compute time by role, transfer time and idle time.

    ``records`` are task-stream records (``key``, ``startstops``); a task's role is its
    key's first word. Where tasks of several roles compute at once the time is shared
    equally among the roles; transfer counts only while no task computes.

    Examples
    --------
    >>> recs = [{"key": "rollout-0-it1-r", "startstops": [
    ...             {"action": "transfer", "start": 0.0, "stop": 1.0},
    ...             {"action": "compute", "start": 1.0, "stop": 5.0}]},
    ...         {"key": "learner-0-it1-r", "startstops": [
    ...             {"action": "compute", "start": 4.0, "stop": 8.0}]}]
    >>> sweep(recs, 0.0, 10.0)
    ({'rollout': 3.5, 'learner': 3.5}, 1.0, 2.0)
    """
    events: list[tuple[float, int, str]] = []
    for rec in records:
        role = role_of(rec["key"])
        for ss in rec.get("startstops", ()):
            a, b = max(ss["start"], start), min(ss["stop"], stop)
            if b > a:
                label = "transfer" if ss["action"] in _TRANSFER_ACTIONS else role
                events += [(a, 1, label), (b, -1, label)]
    events.sort(key=lambda e: e[0])
    roles: dict[str, float] = {}
    active: Counter[str] = Counter()
    transfer = idle = 0.0
    prev = start
    for t, delta, label in [*events, (stop, 0, "")]:
        if t > prev:
            busy = [r for r, n in active.items() if n > 0 and r != "transfer"]
            for r in busy:
                roles[r] = roles.get(r, 0.0) + (t - prev) / len(busy)
            if not busy:
                if active["transfer"] > 0:
                    transfer += t - prev
                else:
                    idle += t - prev
            prev = t
        if label:
            active[label] += delta
    return roles, transfer, idle


def split(roles: dict[str, float], transfer: float, idle: float, metrics: Mapping[str, Any]
          ) -> dict[str, float]:
    """The parts of :data:`~daskrl.observe.parts.PARTS` from a :func:`sweep` and the
    iteration's own metrics.

    Rollout time is split into env, inference and the rest by the rollout's own
    ``env_s``/``inference_s`` shares of ``rollout_s``. When no rollout, env or inference
    task ran (the rollouts ran inside learner-side tasks), ``rollout_s`` is carved out of
    those tasks' time.

    Examples
    --------
    >>> parts = split({"rollout": 3.0, "learner": 2.0}, 0.5, 0.5,
    ...               {"rollout_s": 3.0, "env_s": 2.0, "inference_s": 0.5})
    >>> parts["time/env_s"], parts["time/inference_s"], parts["time/learn_s"]
    (2.0, 0.5, 2.0)
    """
    roles = dict(roles)
    env, inference = roles.pop("env", 0.0), roles.pop("inference", 0.0)
    rollout = roles.pop("rollout", 0.0)
    learn = sum(roles.values())
    rollout_s = finite(metrics.get("rollout_s"))
    if not (env or inference or rollout) and rollout_s > 0:
        rollout = min(rollout_s, learn)
        learn -= rollout
    f_env = finite(metrics.get("env_s")) / rollout_s if rollout_s > 0 else 0.0
    f_inf = finite(metrics.get("inference_s")) / rollout_s if rollout_s > 0 else 0.0
    scale = max(1.0, f_env + f_inf)  # maxima of different replicas may exceed the rollout
    f_env, f_inf = f_env / scale, f_inf / scale
    return {
        "time/env_s": env + rollout * f_env,
        "time/inference_s": inference + rollout * f_inf,
        "time/rollout_other_s": rollout * (1.0 - f_env - f_inf),
        "time/learn_s": learn,
        "time/transfer_s": transfer,
        "time/idle_s": idle,
    }


class Timeline:
    """Splits each iteration's wall time using Dask's task stream (see the module notes).

    Parameters
    ----------
    backend : Backend
        Gives task-stream records (:meth:`~daskrl.runtime.dask_backend.DaskBackend.task_stream`); a
        backend without them (``--scheduler sync``) gets the split from the tasks' own
        clocks, with nothing in transfer.
    run : str
        The run id that ends every task key of this run.

    Examples
    --------
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> tl = Timeline(SyncBackend(), "r")
    >>> row = {"iteration_s": 1.0, "rollout_s": 0.6, "env_s": 0.4, "learn_s": 0.3}
    >>> {k: round(v, 3) for k, v in tl.split(0, row).items()}["time/idle_s"]
    0.1
    """

    def __init__(self, backend: Any, run: str) -> None:
        self.backend, self.run = backend, run
        self.records: list[Mapping[str, Any]] = []
        self.prev_end: float | None = None
        self.compute_s = 0.0
        """Seconds this run's tasks computed on workers so far, summed over tasks (its
        CPU-seconds where each task runs one thread); from the task stream, or the tasks'
        own clocks without one."""
        try:
            self.cursor: int | None = backend.task_stream(None)[0]
        except Exception:  # noqa: BLE001 - a scheduler without the task-stream cursor
            self.cursor = None

    def _fetch(self) -> None:
        if self.cursor is None:
            return
        try:
            self.cursor, new = self.backend.task_stream(self.cursor)
        except Exception:  # noqa: BLE001 - profiling must never stop a run
            self.cursor, new = None, []
        mine = of_runs([self.run])
        new = [r for r in new if mine(r.get("key", ""))]
        self.compute_s += sum(ss["stop"] - ss["start"] for r in new
                              for ss in r.get("startstops", ()) if ss["action"] == "compute")
        self.records += new

    def split(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """The parts of iteration ``iteration`` (0-based) and ``time/iteration_s``.

        ``metrics`` is the iteration's row (``rollout_s``, ``env_s``, ``inference_s``,
        ``learn_s``, ``iteration_s``).
        """
        self._fetch()
        if self.cursor is None:
            self.compute_s += finite(metrics.get("rollout_s")) + finite(metrics.get("learn_s"))
        window = self._window(iteration)
        if window is None:  # no record of this learner task: the tasks' own clocks
            self.prev_end, self.records = None, self.records[-10_000:]
            return self._from_clocks(metrics)
        start, stop = window
        roles, transfer, idle = sweep(self.records, start, stop)
        out = split(roles, transfer, idle, metrics)
        out["time/iteration_s"] = stop - start
        self.records = [r for r in self.records
                        if max((s["stop"] for s in r.get("startstops", ())), default=0) > stop]
        self.prev_end = stop
        return out

    def _window(self, iteration: int) -> tuple[float, float] | None:
        """From the previous learner task's end (or this iteration's first task) to this
        learner task's end, on the scheduler's clock."""
        final = task_key("learner", 0, iteration, self.run)
        ends = [ss["stop"] for r in self.records if r["key"] == final
                for ss in r.get("startstops", ()) if ss["action"] == "compute"]
        if not ends:
            return None
        stop = ends[-1]
        start = self.prev_end
        if start is None:
            starts = [ss["start"] for r in self.records if in_iteration(r["key"], iteration)
                      for ss in r.get("startstops", ()) if ss["action"] == "compute"]
            start = min(starts, default=stop)
        return start, stop

    @staticmethod
    def _from_clocks(metrics: Mapping[str, Any]) -> dict[str, float]:
        """The split from the tasks' own clocks (no task stream: nothing moves)."""
        wall = finite(metrics.get("iteration_s"))
        rollout, learn = finite(metrics.get("rollout_s")), finite(metrics.get("learn_s"))
        out = split({"rollout": rollout, "learner": learn}, 0.0, 0.0, metrics)
        out["time/idle_s"] = max(0.0, wall - rollout - learn)
        out["time/iteration_s"] = wall
        return out
