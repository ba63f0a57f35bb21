"""Where an iteration's time goes, and which setting to change.

During a run, :class:`Timeline` reads Dask's task stream (the scheduler's record of when
each task computed and when the worker fetched its inputs) after every iteration and
splits the iteration's wall time, from the previous learner task's end to this one's,
into parts that add up to it:

``time/env_s``           envs stepping (env tasks; the rollout's ``env_s`` share)
``time/inference_s``     policy forward passes (inference tasks; the rollout's share)
``time/rollout_other_s`` the rest of the rollouts (buffers, GAE; all of a rollout whose
                         actor does not time its env and inference)
``time/learn_s``         learner and gradient tasks, less any rollout fused into them
``time/transfer_s``      inputs moving between workers while no task computes
``time/idle_s``          nothing running: scheduler latency, the driver, waiting

Overlapping tasks of different roles share the time between them equally; rollouts fused
into a learner task (``single``, ``data-parallel``) are carved out of it by their own
clocks. ``daskrl profile DIR`` prints the means and names the bottleneck.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from daskrl.observe.plot import read_metrics

PARTS = {
    "env stepping": "time/env_s",
    "inference": "time/inference_s",
    "rollout, other (buffers, GAE)": "time/rollout_other_s",
    "learning": "time/learn_s",
    "data transfer": "time/transfer_s",
    "scheduler and idle": "time/idle_s",
}
"""Label -> metrics.csv column of each part :class:`Timeline` writes."""

LEGACY_PARTS = {
    "env stepping": "env_s",
    "inference": "inference_s",
    "rollout (env + inference)": "rollout_s",
    "learning": "learn_s",
    "scheduler, transfer and idle": "overhead_s",
}
"""The parts of runs written before the task-stream columns (tasks' own clocks)."""

OVERHEAD_PARTS = ("time/transfer_s", "time/idle_s")
"""The parts in which no fragment computes: what Dask (and the driver) cost the run."""


def overhead_seconds(row: Mapping[str, Any]) -> tuple[float, float]:
    """``(wall, overhead)`` seconds of one metrics row: its iteration's wall time, and the
    part of it in which no fragment computed (data transfer, scheduler and idle).

    This is the one definition behind ``summary.json``'s ``dask_overhead_share`` and the
    share ``daskrl profile`` prints: the share of wall time not spent computing fragments
    on the iteration's path, from the learner task's end to the next one's. Rows written
    without the task-stream parts fall back to the tasks' own clocks (``overhead_s``).

    Examples
    --------
    >>> overhead_seconds({"time/iteration_s": 2.0, "time/transfer_s": 0.5,
    ...                   "time/idle_s": 0.25, "overhead_s": 0.01})
    (2.0, 0.75)
    >>> overhead_seconds({"iteration_s": 1.0, "overhead_s": 0.25})
    (1.0, 0.25)
    """
    if any(not math.isnan(finite_or_nan(row.get(c))) for c in OVERHEAD_PARTS):
        wall = finite(row.get("time/iteration_s", row.get("iteration_s")))
        return wall, sum(finite(row.get(c)) for c in OVERHEAD_PARTS)
    return finite(row.get("iteration_s")), max(0.0, finite(row.get("overhead_s")))


def overhead_share(rows: list[Mapping[str, Any]]) -> float:
    """Summed overhead over summed wall time of ``rows`` (see :func:`overhead_seconds`);
    NaN without wall time.

    Examples
    --------
    >>> overhead_share([{"iteration_s": 1.0, "overhead_s": 0.5},
    ...                 {"iteration_s": 3.0, "overhead_s": 0.5}])
    0.25
    """
    pairs = [overhead_seconds(r) for r in rows]
    wall = sum(w for w, _ in pairs)
    return sum(o for _, o in pairs) / wall if wall > 0 else float("nan")


def finite_or_nan(value: Any) -> float:
    """``value`` as a float, NaN when it is missing or not a number.

    Examples
    --------
    >>> finite_or_nan("1.5"), finite_or_nan(None)
    (1.5, nan)
    """
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def advice(kind: str, config: Mapping[str, Any] | None = None) -> str:
    """What to change for a ``kind``-bound run, naming the values to set from the run's
    graph ``config`` (``summary.json``'s) when it has the setting.

    Examples
    --------
    >>> advice("learn", {"num_minibatches": 8, "num_envs": 8, "num_steps": 128})[:80]
    'learner-bound: fewer, larger minibatches (--num-minibatches 4: half as many grad'
    >>> advice("overhead", {})[:72]
    'overhead-bound: put more work in each task (e.g. double --num-steps and '
    """
    cfg = dict(config or {})

    def doubled(name: str) -> str:
        flag = "--" + name.replace("_", "-")
        value = cfg.get(name)
        return f"{flag} {value * 2}" if isinstance(value, int) and value > 0 else (
            f"double {flag}")

    if kind == "env":
        return (f"env-bound: add rollout replicas ({doubled('num_actors')}) or envs per "
                f"replica ({doubled('num_envs')}), with a worker per replica (--workers)")
    if kind == "inference":
        return (f"inference-bound: batch more envs per forward pass ({doubled('num_envs')}), "
                "or serve the policy from a GPU (--distribution central-inference "
                "--resources learner=GPU:1)")
    if kind == "learn":
        mb = cfg.get("num_minibatches")
        fewer = (f"--num-minibatches {max(1, mb // 2)}" if isinstance(mb, int) and mb > 1
                 else "halve --num-minibatches")
        return (f"learner-bound: fewer, larger minibatches ({fewer}: half as many gradient "
                "steps, each on twice the data), give the learner a GPU (--resources "
                "learner=GPU:1), or the data-parallel distribution")
    if kind == "transfer":
        return ("transfer-bound: move less between workers per iteration: fewer, larger "
                "workers (--workers 1), or everything on one worker (--distribution single)")
    steps = doubled("num_steps")
    steps = f"e.g. {steps}" if steps.startswith("double") else steps
    return (f"overhead-bound: put more work in each task ({steps} and "
            f"{doubled('num_envs')}) so Dask's per-task cost is amortised")


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
        role = str(rec["key"]).split("-", 1)[0]
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
    """The parts of :data:`PARTS` from a :func:`sweep` and the iteration's own metrics.

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


def finite(value: Any) -> float:
    """``value`` as a float; 0.0 when it is missing, not a number or not finite.

    Examples
    --------
    >>> finite("0.5"), finite(None), finite(float("nan"))
    (0.5, 0.0, 0.0)
    """
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0


class Timeline:
    """Splits each iteration's wall time using Dask's task stream (see the module notes).

    Parameters
    ----------
    backend : Backend
        Gives task-stream records (:meth:`~daskrl.runtime.backend.DaskBackend.task_stream`); a
        backend without them (``--scheduler sync``) gets the split from the tasks' own
        clocks, with nothing in transfer.
    run : str
        The run id that ends every task key of this run.

    Examples
    --------
    >>> from daskrl.runtime.backend import SyncBackend
    >>> tl = Timeline(SyncBackend(), "r")
    >>> row = {"iteration_s": 1.0, "rollout_s": 0.6, "env_s": 0.4, "learn_s": 0.3}
    >>> {k: round(v, 3) for k, v in tl.split(0, row).items()}["time/idle_s"]
    0.1
    """

    def __init__(self, backend: Any, run: str) -> None:
        self.backend, self.run = backend, run
        self.records: list[Mapping[str, Any]] = []
        self.prev_end: float | None = None
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
        suffix = f"-{self.run}"
        self.records += [r for r in new if str(r.get("key", "")).endswith(suffix)]

    def split(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """The parts of iteration ``iteration`` (0-based) and ``time/iteration_s``.

        ``metrics`` is the iteration's row (``rollout_s``, ``env_s``, ``inference_s``,
        ``learn_s``, ``iteration_s``).
        """
        self._fetch()
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
        final = f"learner-0-it{iteration}-{self.run}"
        ends = [ss["stop"] for r in self.records if r["key"] == final
                for ss in r.get("startstops", ()) if ss["action"] == "compute"]
        if not ends:
            return None
        stop = ends[-1]
        start = self.prev_end
        if start is None:
            mark = f"-it{iteration}-"
            starts = [ss["start"] for r in self.records if mark in str(r["key"])
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


def breakdown(run_dir: Path, skip: int = 1) -> dict[str, float]:
    """Mean seconds per iteration of each part, and ``"iteration"`` (the first ``skip``
    iterations dropped: they pay for worker start-up).

    Means, not medians, so the parts add up to the mean iteration time. Runs written
    before the ``time/`` columns get :data:`LEGACY_PARTS`.

    Examples
    --------
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "metrics.csv").write_text("iteration_s,time/env_s,time/learn_s\\n"
    ...                                      "9.0,1.0,1.0\\n0.5,0.25,0.125\\n0.25,0.125,0.125\\n")
    >>> breakdown(run)  # the first row pays for worker start-up: skipped
    {'env stepping': 0.1875, 'learning': 0.125, 'iteration': 0.375}
    """
    data = read_metrics(run_dir)
    if "iteration_s" not in data:
        raise ValueError(f"{run_dir}/metrics.csv has no iteration_s column: not a daskrl run?")
    trained = [i for i, v in enumerate(data["iteration_s"]) if not math.isnan(v)]
    rows = trained[min(skip, len(trained) - 1):]  # periodic evaluations' rows have no time
    modern = any(not math.isnan(v) for v in data.get(PARTS["learning"], []))
    parts = PARTS if modern else LEGACY_PARTS
    out: dict[str, float] = {}
    for label, col in parts.items():
        values = [data[col][i] for i in rows if col in data and not math.isnan(data[col][i])]
        if values:
            out[label] = statistics.fmean(values)
    if not modern and "env stepping" in out and "inference" in out:
        out.pop("rollout (env + inference)", None)
    out["iteration"] = statistics.fmean(data["iteration_s"][i] for i in rows)
    return out


def bottleneck(parts: Mapping[str, float], config: Mapping[str, Any] | None = None) -> str:
    """The :func:`advice` for the largest part (rollout bookkeeping counts with the envs:
    more replicas share it too).

    Examples
    --------
    >>> bottleneck({"env stepping": 0.5, "learning": 0.2, "scheduler and idle": 0.1},
    ...            {"num_actors": 1, "num_envs": 8})[:72]
    'env-bound: add rollout replicas (--num-actors 2) or envs per replica (--'
    """
    get = parts.get
    scores = {
        "env": get("env stepping", 0.0) + get("rollout, other (buffers, GAE)", 0.0)
        + (0.0 if "env stepping" in parts else get("rollout (env + inference)", 0.0)),
        "inference": get("inference", 0.0),
        "learn": get("learning", 0.0),
        "transfer": get("data transfer", 0.0),
        "overhead": get("scheduler and idle", get("scheduler, transfer and idle", 0.0)),
    }
    return advice(max(scores, key=lambda k: scores[k]), config)


def report(run_dir: Path) -> str:
    """A printable breakdown with shares of the iteration time, the Dask overhead share
    (:func:`overhead_seconds`, as in ``summary.json``) and the bottleneck.

    Examples
    --------
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "metrics.csv").write_text("iteration_s,time/env_s,time/learn_s\\n"
    ...                                      "9.0,1.0,1.0\\n0.5,0.375,0.125\\n")
    >>> print(report(run))  # doctest: +ELLIPSIS
    mean iteration: 500.0 ms (parts add up to 100.0%)
      env stepping                      375.0 ms   75.0%
      learning                          125.0 ms   25.0%
    Dask overhead share: 0.0% of wall time (transfer, scheduler and idle; ...)
    bottleneck: env-bound: add rollout replicas (double --num-actors) ...
    """
    parts = breakdown(run_dir)
    total = parts.pop("iteration")
    covered = sum(parts.values()) / total if total > 0 else float("nan")
    lines = [f"mean iteration: {total * 1e3:.1f} ms (parts add up to {covered:.1%})"]
    for label, value in parts.items():
        share = value / total if total > 0 else float("nan")
        lines.append(f"  {label:<30} {value * 1e3:8.1f} ms  {share:6.1%}")
    rows = [r for r in _rows(run_dir) if not math.isnan(r.get("iteration_s", math.nan))][1:]
    # (the first iteration pays for worker start-up, and is left out of the summary too)
    lines.append(f"Dask overhead share: {overhead_share(rows):.1%} of wall time (transfer, "
                 "scheduler and idle; summary.json's dask_overhead_share)")
    lines.append(f"bottleneck: {bottleneck(parts, _config(run_dir))}")
    waits = learner_waits(rows, _config(run_dir))
    if waits is not None:
        lines.append(waits)
    return "\n".join(lines)


BUSY_TARGET = 0.95
"""The learner busy share below which a learner on its own clock counts as actor-bound."""


def learner_waits(rows: list[dict[str, float]], config: Mapping[str, Any] | None = None
                  ) -> str | None:
    """For a learner on its own clock (``impala``: rows with ``learner_busy``), its busy
    share and, when it waited for batches, how many actors to add (from the rows'
    ``actors_for_busy``: actors whose batches would land one per update). None for other
    runs.

    Examples
    --------
    >>> rows = [{"learner_busy": 0.6, "actors_for_busy": 4.0}] * 3
    >>> learner_waits(rows, {"num_actors": 2})[:68]
    'learner busy: 60.0% of wall time (waiting for batches 40.0%); actor-'
    >>> learner_waits(rows, {"num_actors": 2}).split("; ")[1][:44]
    'actor-bound: add 2 actors (--num-actors 4), '
    >>> learner_waits([{"learner_busy": 0.99}]) is None or "actor-bound" not in learner_waits(
    ...     [{"learner_busy": 0.99}])
    True
    """
    busy = [r["learner_busy"] for r in rows if not math.isnan(r.get("learner_busy", math.nan))]
    if not busy:
        return None
    share = statistics.fmean(busy)
    line = f"learner busy: {share:.1%} of wall time (waiting for batches {1 - share:.1%})"
    if share >= BUSY_TARGET:
        return line
    want = [r["actors_for_busy"] for r in rows
            if not math.isnan(r.get("actors_for_busy", math.nan))]
    have = int((config or {}).get("num_actors") or 0)
    add = max(1, math.ceil(statistics.median(want)) - have) if want and have else 1
    flag = f" (--num-actors {have + add})" if have else ""
    return (f"{line}; actor-bound: add {add} actor{'s' if add > 1 else ''}{flag}, each with a "
            "core of its own (--workers), so that a batch is there when an update ends")


def _rows(run_dir: Path) -> list[dict[str, float]]:
    """``metrics.csv``'s rows as column -> number."""
    data = read_metrics(run_dir)
    n = len(next(iter(data.values()))) if data else 0
    return [{k: v[i] for k, v in data.items()} for i in range(n)]


def _config(run_dir: Path) -> dict[str, Any]:
    """The graph config in ``run_dir/summary.json`` (empty while the run is going)."""
    import json

    path = run_dir / "summary.json"
    try:
        return dict(json.loads(path.read_text()).get("config") or {})
    except (OSError, ValueError):
        return {}
