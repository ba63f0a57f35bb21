"""The runs on a scheduler's board as Prometheus gauges ``daskrl_...``, on its ``/metrics``.

Dask serves ``/metrics`` (route module ``distributed.http.scheduler.prometheus``) as
``prometheus_client.generate_latest()`` of prometheus_client's process-wide
``REGISTRY``, where Dask registers its own collectors; :class:`BoardCollector` is
registered there the same way, a collector in prometheus_client's documented form
(``collect`` yielding metric families). There is one registry per process, so there is
one collector per process, registered while a scheduler with a
:class:`~daskrl.observe.board_plugin.RunBoard` runs in it, and it reports the boards of
every such scheduler of the process (one, unless a notebook starts several); a run id
names one run whichever scheduler holds it. Without the ``prometheus_client`` package (the
``prometheus`` extra) Dask serves no metrics and nothing is registered.

Every gauge is labelled ``run`` (the run id the page shows); ``daskrl_run_info`` carries
the run's name (its output folder), graph and distribution, ``daskrl_run_status`` is 1
for the status it has and 0 for the others. A sweep's trials are counted by state in
``daskrl_sweep_trials``, labelled ``sweep`` (the sweep id, as ``run`` is the run id),
``name`` (its folder) and ``state`` (every state of
:data:`~daskrl.observe.board.TRIAL_STATES`, 0 included).

Examples
--------
>>> from daskrl.observe.board import Board
>>> board = Board()
>>> board.take({"kind": "row", "run": "r1",
...             "row": {"iteration": 2, "episode_return_mean": 9.5}})
>>> [(f.name, f.samples[0].value) for f in families([board])][:2]
[('daskrl_iteration', 2.0), ('daskrl_episode_return_mean', 9.5)]
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from daskrl.observe.board import PARTS, STATUSES, TRIAL_STATES, Board

GAUGES = {
    "iteration": ("daskrl_iteration", "Iterations recorded (metrics.csv iteration)"),
    "env_steps": ("daskrl_env_steps", "Env steps so far (metrics.csv env_steps)"),
    "wall_s": ("daskrl_wall_seconds", "Wall time of the run so far (metrics.csv wall_s)"),
    "episode_return_mean": ("daskrl_episode_return_mean",
                            "Mean return of the episodes that ended in the latest iteration"),
    "env_steps_per_s": ("daskrl_env_steps_per_second",
                        "Env steps per second of wall time (metrics.csv env_steps_per_s)"),
    "policy_lag": ("daskrl_policy_lag",
                   "Updates between the acting and the learning weights (mean, latest iteration)"),
    "policy_lag_max": ("daskrl_policy_lag_max", "Largest policy lag of the latest iteration"),
    "learner_busy": ("daskrl_learner_busy_ratio",
                     "Share of the latest iteration's wall time the learner computed"),
    "replay_size": ("daskrl_replay_size", "Transitions held in replay (all shards)"),
    "eval_return_mean": ("daskrl_eval_return_mean", "Mean return of the latest evaluation"),
}
"""Figure -> (gauge name, help) of the gauges labelled by run alone."""

_lock = threading.Lock()
_boards: weakref.WeakSet[Board] = weakref.WeakSet()
_registered: list[BoardCollector] = []  # the one collector in prometheus_client's REGISTRY


class BoardCollector:
    """The prometheus_client collector of the boards of this process's schedulers."""

    def describe(self) -> list[Any]:
        """No fixed families: registering must not call :meth:`collect` (runs come and go)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The gauges of every run on a board of this process's running schedulers."""
        with _lock:
            boards = list(_boards)
        yield from families(boards)


def families(boards: Iterable[Board]) -> Iterator[Any]:
    """The metric families (``prometheus_client.core.GaugeMetricFamily``) of ``boards``;
    those no run has a value for are left out."""
    from prometheus_client.core import GaugeMetricFamily

    boards = list(boards)  # read twice: runs, then sweeps
    tracks = [t for board in boards for t in board.runs.values()]
    out = []
    for figure, (name, doc) in GAUGES.items():
        gauge = GaugeMetricFamily(name, doc, labels=["run"])
        for t in tracks:
            if figure in t.latest:
                gauge.add_metric([t.run], t.latest[figure])
        out.append(gauge)
    parts = GaugeMetricFamily("daskrl_iteration_part_seconds",
                              "Seconds of the latest iteration in each part (metrics.csv time/*)",
                              labels=["run", "part"])
    for t in tracks:
        for part, column in PARTS.items():
            if column in t.latest:
                parts.add_metric([t.run, part], t.latest[column])
    info = GaugeMetricFamily("daskrl_run_info", "A run on this scheduler (value 1)",
                             labels=["run", "name", "graph", "distribution"])
    status = GaugeMetricFamily("daskrl_run_status", "1 for the run's status, 0 for the others",
                               labels=["run", "status"])
    updated = GaugeMetricFamily("daskrl_last_update_timestamp_seconds",
                                "When the scheduler last heard from the run (Unix time)",
                                labels=["run"])
    for t in tracks:
        info.add_metric([t.run, *(str(t.meta.get(k, "")) for k in ("name", "graph",
                                                                     "distribution"))], 1.0)
        for s in STATUSES:
            status.add_metric([t.run, s], float(t.status == s))
        updated.add_metric([t.run], t.updated)
    trials = GaugeMetricFamily("daskrl_sweep_trials", "Trials of the sweep in each state",
                               labels=["sweep", "name", "state"])
    for sweep in (s for board in boards for s in board.sweeps.values()):
        counts = collections.Counter(str(t.get("state")) for t in sweep["trials"])
        # every known state, 0 included, so a state's series does not come and go
        for state in (*TRIAL_STATES, *sorted(set(counts) - set(TRIAL_STATES))):
            trials.add_metric([sweep["sweep"], str(sweep.get("name", "")), state],
                              float(counts[state]))
    out += [parts, info, status, updated, trials]
    yield from (family for family in out if family.samples)


def export(board: Board) -> None:
    """Report ``board``'s runs on ``/metrics`` (registers the collector once)."""
    try:
        import prometheus_client
    except ImportError:  # Dask serves no /metrics without it
        return
    with _lock:
        _boards.add(board)
        if not _registered:
            collector = BoardCollector()
            prometheus_client.REGISTRY.register(collector)
            _registered.append(collector)


def unexport(board: Board) -> None:
    """Stop reporting ``board``'s runs; the last one out unregisters the collector."""
    with _lock:
        _boards.discard(board)
        if _registered and not _boards:
            import prometheus_client

            prometheus_client.REGISTRY.unregister(_registered.pop())
