"""The runs a scheduler serves, as it holds them for the dashboard's daskrl page.

The driver sends each ``metrics.csv`` row, cut down to :data:`FIGURES`, on the scheduler
event topic :data:`TOPIC` (``Client.log_event``, see :mod:`daskrl.observe.board_feed`);
the scheduler's :class:`~daskrl.observe.board_plugin.RunBoard` plugin hears every event
through its ``log_event`` hook and hands this topic's to a :class:`Board`, which keeps,
per run id, the latest figures and a history bounded by :attr:`Board.keep` points
(thinned to every other point when full, so a run of any length keeps its whole curve in
the same memory). Runs beyond :attr:`Board.max_runs` are dropped oldest first, ended ones
before running ones. The broker keeps its own log of the topic, bounded by Dask's
``distributed.admin.low-level-log-length``.

A sweep (many runs of one graph on one cluster) sends its whole table of trials on the same
topic, each time a trial changes state and every few seconds
(:func:`~daskrl.observe.board_feed.sweep_message`): the board keeps each sweep's latest
table only, at most :attr:`Board.max_runs` sweeps, dropped like the runs.

The page and its JSON (:mod:`daskrl.observe.board_routes`) and the Prometheus gauges on
``/metrics`` (:mod:`daskrl.observe.board_metrics`) read the board; nothing else is kept.

Examples
--------
>>> board = Board()
>>> board.take({"kind": "start", "run": "ab12cd34", "name": "ppo-1", "graph": "ppo",
...             "distribution": "actors-learner"})
>>> board.take({"kind": "row", "run": "ab12cd34",
...             "row": {"iteration": 1, "env_steps": 1024, "episode_return_mean": 21.5}})
>>> track = board.runs["ab12cd34"]
>>> track.status, track.latest["episode_return_mean"], track.history["env_steps"]
('running', 21.5, [1024.0])
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

TOPIC = "daskrl-board"
"""The scheduler event topic that carries a run's start, rows and end."""

PLUGIN = "daskrl-board"
"""The name :class:`~daskrl.observe.board_plugin.RunBoard` is registered under."""

ROUTES = "daskrl.observe.board_routes"
"""The module to add to ``distributed.scheduler.http.routes`` to serve the page."""

PARTS = {
    "env": "time/env_s",
    "inference": "time/inference_s",
    "rollout_other": "time/rollout_other_s",
    "learn": "time/learn_s",
    "transfer": "time/transfer_s",
    "idle": "time/idle_s",
}
"""Part of an iteration's wall time -> its ``metrics.csv`` column
(:data:`daskrl.observe.parts.PARTS`)."""

FIGURES = ("iteration", "env_steps", "wall_s", "episode_return_mean", "env_steps_per_s",
           *PARTS.values(), "policy_lag", "policy_lag_max", "learner_busy", "replay_size",
           "eval_return_mean", "eval_iteration")
"""The ``metrics.csv`` columns a run sends to the board (those its rows have)."""

CURVES = ("episode_return_mean", "env_steps_per_s", "policy_lag", "learner_busy",
          "replay_size")
"""Figures kept as curves over env steps (with ``iteration`` and ``env_steps``)."""

STATUSES = ("running", "finished", "stopped", "failed")
"""What a run can be: its driver sends the last three as it ends."""

TRIAL_STATES = ("pending", "running", "paused", "finished", "failed", "pruned", "stopped")
"""What a sweep's trial can be (:func:`~daskrl.observe.board_feed.sweep_message`)."""

_ACTIVE = ("pending", "running", "paused")  # a sweep with such a trial has not ended


def figures(row: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`FIGURES` of a ``metrics.csv`` row, as floats (missing and NaN left out).

    A replay split into shards (``replay_size/0``, ``replay_size/1``, ...) counts as the
    sum of its shards.

    Examples
    --------
    >>> import numpy as np
    >>> figures({"iteration": 3, "env_steps": np.int64(96), "losses/value_loss": 0.5,
    ...          "episode_return_mean": float("nan"), "replay_size/0": 10, "replay_size/1": 12})
    {'iteration': 3.0, 'env_steps': 96.0, 'replay_size': 22.0}
    """
    out = {key: float(row[key]) for key in FIGURES if _finite(row.get(key))}
    shards = [float(v) for k, v in row.items() if k.startswith("replay_size/") and _finite(v)]
    if "replay_size" not in out and shards:
        out["replay_size"] = sum(shards)
    return out


def scalars(values: Mapping[str, Any]) -> dict[str, str | int | float | bool | None]:
    """The strings, numbers and Nones of ``values``, JSON-ready: numpy's scalars as Python's,
    a non-finite float as None, a path as a string; anything else is left out.

    A sweep's message is cleaned with it where it is made and again where the board takes
    it: one NaN would make the page's JSON invalid (:meth:`Board.as_text`).

    Examples
    --------
    >>> import numpy as np
    >>> from pathlib import Path
    >>> scalars({"steps": np.int64(4096), "return": float("nan"), "lr": np.float32(0.5),
    ...          "out": Path("/runs/a"), "run": None, "params": {"lr": 0.5}})
    {'steps': 4096, 'return': None, 'lr': 0.5, 'out': '/runs/a', 'run': None}
    """
    out: dict[str, str | int | float | bool | None] = {}
    for key, value in values.items():
        if value is None or isinstance(value, (str, bool)):
            out[str(key)] = value
        elif isinstance(value, numbers.Integral):
            out[str(key)] = int(value)
        elif isinstance(value, numbers.Real):
            out[str(key)] = float(value) if math.isfinite(value) else None
        elif isinstance(value, os.PathLike):
            out[str(key)] = os.fspath(value)
    return out


def _finite(value: Any) -> bool:
    """A finite number, numpy's scalars included (not a bool, not a string)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


class RunTrack:
    """One run on the board: what its driver said at the start, its latest figures, its
    curves (at most ``keep`` points each) and its evaluations (at most ``keep``).

    Points are kept every ``stride`` rows; when ``keep`` are held, every other one is
    dropped and the stride doubles, so the curves span the whole run at an even spacing.

    Examples
    --------
    >>> track = RunTrack("r", keep=4)
    >>> for i in range(1, 10):
    ...     track.add({"iteration": i, "env_steps": 10 * i})
    >>> track.history["iteration"], track.stride, track.latest["iteration"]
    ([1, 5, 9], 4, 9)
    """

    def __init__(self, run: str, keep: int = 500) -> None:
        if keep < 2:
            raise ValueError(f"keep must be >= 2 points, got {keep}")
        self.run, self.keep = run, keep
        self.meta: dict[str, Any] = {}
        self.status = "running"
        self.started = self.updated = time.time()
        self.latest: dict[str, float] = {}
        self.rows = 0  # iteration rows received
        self.stride = 1
        self.history: dict[str, list[float]] = {key: [] for key in ("iteration", "env_steps",
                                                                     *CURVES)}
        self.evals: list[tuple[float, float, float]] = []  # (env_steps, iteration, return)
        self.eval_stride, self.eval_count = 1, 0

    def add(self, row: Mapping[str, float]) -> None:
        """Take one row's figures: the latest always, a curve point every ``stride`` rows."""
        self.updated = time.time()
        if "eval_return_mean" in row:
            self._add_eval(row)
        if "iteration" not in row:  # an evaluation that no iteration row took
            return
        self.latest = {**{k: v for k, v in self.latest.items()
                          if k in ("eval_return_mean", "eval_iteration")}, **row}
        if self.rows % self.stride == 0:
            for key, points in self.history.items():
                points.append(row.get(key, math.nan))
            if len(self.history["iteration"]) >= self.keep:
                for points in self.history.values():
                    del points[1::2]
                self.stride *= 2
        self.rows += 1

    def _add_eval(self, row: Mapping[str, float]) -> None:
        self.latest["eval_return_mean"] = row["eval_return_mean"]
        if "eval_iteration" in row:
            self.latest["eval_iteration"] = row["eval_iteration"]
        if self.eval_count % self.eval_stride == 0:
            iteration = row.get("eval_iteration", row.get("iteration", math.nan))
            steps = self._steps_at(iteration)
            self.evals.append((steps if math.isfinite(steps) else row.get("env_steps", math.nan),
                               iteration, row["eval_return_mean"]))
            if len(self.evals) >= self.keep:
                del self.evals[1::2]
                self.eval_stride *= 2
        self.eval_count += 1

    def _steps_at(self, iteration: float) -> float:
        """The env steps at the end of ``iteration`` (between two kept points: interpolated),
        where an evaluation of it is drawn; NaN when the curve does not reach it."""
        its, steps = self.history["iteration"], self.history["env_steps"]
        if self.latest.get("iteration") == iteration:
            return self.latest.get("env_steps", math.nan)
        j = bisect.bisect_left(its, iteration)
        if j < len(its) and its[j] == iteration:
            return steps[j]
        if 0 < j < len(its):
            share = (iteration - its[j - 1]) / (its[j] - its[j - 1])
            return steps[j - 1] + share * (steps[j] - steps[j - 1])
        return math.nan

    def as_json(self) -> dict[str, Any]:
        """What the page draws, JSON-ready (NaN as None; times on the scheduler's clock)."""
        return {"run": self.run, **self.meta, "status": self.status,
                "started": self.started, "updated": self.updated,
                "latest": _clean(self.latest), "stride": self.stride,
                "history": {k: [_none(v) for v in vs] for k, vs in self.history.items()},
                "evals": [[_none(v) for v in e] for e in self.evals]}


def _none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _clean(values: Mapping[str, float]) -> dict[str, float | None]:
    return {k: _none(v) for k, v in values.items()}


class Board:
    """The runs of one scheduler, keyed by run id, and its sweeps, keyed by sweep id (see
    the module notes).

    Its state is read and changed on the scheduler's event loop, where the events arrive
    and the page's requests are answered, so it takes no lock.

    Parameters
    ----------
    keep : int
        Points per curve of one run (and evaluations per run).
    max_runs : int
        Runs held; beyond it the one updated longest ago goes, ended ones first. Sweeps
        held, the same way (a sweep has ended when none of its trials is pending or running).

    Examples
    --------
    >>> board = Board(max_runs=2)
    >>> for sweep in ("s1", "s2", "s1", "s3"):
    ...     board.take({"kind": "sweep", "sweep": sweep, "name": f"grid-{sweep}",
    ...                 "trials": [{"name": "t000", "state": "running", "env_steps": 64}]})
    >>> [s["sweep"] for s in board.as_json()["sweeps"]]  # s2 was heard from longest ago
    ['s3', 's1']
    """

    def __init__(self, keep: int = 500, max_runs: int = 64) -> None:
        self.keep, self.max_runs = keep, max_runs
        self.runs: dict[str, RunTrack] = {}
        self.sweeps: dict[str, dict[str, Any]] = {}  # sweep id -> its latest message
        self.version = 0  # counts changes: the JSON is serialised once per change
        self.ignored = 0  # malformed messages (a driver of another daskrl version)
        self._text: tuple[int, str] | None = None  # (version, JSON) of the last as_text

    def take(self, msg: Any) -> None:
        """Take one message of :data:`TOPIC`: a run's ``start``, ``row`` or ``end``, or a
        sweep's table (``kind`` ``sweep``)."""
        if isinstance(msg, Mapping) and msg.get("kind") == "sweep":
            self._take_sweep(msg)
            return
        if not isinstance(msg, Mapping) or not isinstance(msg.get("run"), str):
            self.ignored += 1
            return
        self.version += 1
        track = self._track(msg["run"])
        kind = msg.get("kind")
        if kind == "start":
            track.meta = {k: v for k, v in msg.items() if k not in ("kind", "run")
                          and isinstance(v, (str, int, float))}
        elif kind == "row" and isinstance(msg.get("row"), Mapping):
            track.add(figures(msg["row"]))
        elif kind == "end" and msg.get("status") in STATUSES:
            track.status = str(msg["status"])
            track.updated = time.time()
        else:
            self.ignored += 1

    def _take_sweep(self, msg: Mapping[str, Any]) -> None:
        """Keep a sweep's message in place of its last one (it is the whole table), cleaned
        (:func:`scalars`) and stamped ``received`` on the scheduler's clock."""
        sweep, trials = msg.get("sweep"), msg.get("trials")
        if (not isinstance(sweep, str) or not isinstance(trials, Sequence)
                or isinstance(trials, str) or not all(isinstance(t, Mapping) for t in trials)):
            self.ignored += 1
            return
        self.version += 1
        # a known sweep keeps its place (the page's order); a new one pushes out another
        self.sweeps[sweep] = {**scalars(msg), "trials": [scalars(t) for t in trials],
                              "received": time.time()}
        others = [s for s in self.sweeps.values() if s["sweep"] != sweep]
        while others and len(self.sweeps) > self.max_runs:
            oldest = min(others, key=lambda s: (
                any(t.get("state") in _ACTIVE for t in s["trials"]), s["received"]))
            others.remove(oldest)
            del self.sweeps[oldest["sweep"]]

    def _track(self, run: str) -> RunTrack:
        track = self.runs.get(run)
        if track is None:
            track = self.runs[run] = RunTrack(run, self.keep)
            while len(self.runs) > self.max_runs:
                oldest = min(self.runs.values(),
                             key=lambda t: (t.status == "running", t.updated))
                del self.runs[oldest.run]
        return track

    def as_json(self) -> dict[str, Any]:
        """Every run, newest first, for the page (see :meth:`RunTrack.as_json`), and every
        sweep's latest message, newest first (the one first heard from last), with
        ``received``: when the scheduler took it, on its clock."""
        tracks = sorted(self.runs.values(), key=lambda t: t.started, reverse=True)
        return {"version": self.version, "runs": [t.as_json() for t in tracks],
                "sweeps": list(reversed(self.sweeps.values()))}

    def as_text(self) -> str:
        """:meth:`as_json` as JSON text (runs and sweeps), serialised once per change
        (however many pages ask for it) and kept until the next."""
        if self._text is None or self._text[0] != self.version:
            self._text = (self.version, json.dumps(self.as_json(), allow_nan=False))
        return self._text[1]


def board_settings(routes: list[str]) -> dict[str, Any]:
    """The Dask setting that serves the page: ``routes`` (the scheduler's
    ``distributed.scheduler.http.routes``) with :data:`ROUTES` added.

    Examples
    --------
    >>> board_settings(["distributed.http.health"])["distributed.scheduler.http.routes"]
    ['distributed.http.health', 'daskrl.observe.board_routes']
    """
    return {"distributed.scheduler.http.routes": [*(r for r in routes if r != ROUTES), ROUTES]}
