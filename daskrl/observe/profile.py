"""Where a finished (or running) run's iteration time went, and which setting to change:
what ``daskrl profile DIR`` prints.

The parts are those :class:`~daskrl.observe.timeline.Timeline` wrote to ``metrics.csv``
during the run (:mod:`daskrl.observe.parts` defines them); :func:`report` prints their
means and names the bottleneck with :mod:`daskrl.observe.advice`. The names of those
modules are also importable from here.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from daskrl.observe.advice import BUSY_TARGET, advice, bottleneck, learner_waits
from daskrl.observe.metrics import read_summary
from daskrl.observe.parts import (
    LEGACY_PARTS,
    OVERHEAD_PARTS,
    PARTS,
    finite,
    finite_or_nan,
    overhead_seconds,
    overhead_share,
)
from daskrl.observe.plot import read_metrics
from daskrl.observe.timeline import Timeline, split, sweep

__all__ = ["BUSY_TARGET", "LEGACY_PARTS", "OVERHEAD_PARTS", "PARTS", "Timeline", "advice",
           "bottleneck", "breakdown", "finite", "finite_or_nan", "learner_waits",
           "overhead_seconds", "overhead_share", "report", "split", "sweep"]


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
    cores = core_use(rows)
    if cores is not None:
        lines.append(cores)
    return "\n".join(lines)


def _mean(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if not math.isnan(r.get(key, math.nan))]
    return statistics.fmean(values) if values else math.nan


def kept_threads(threads: list[float], last: int = 20) -> int | None:
    """The learner's kept thread count from the ``learner_threads`` of each update: the most
    common over the last ``last`` (a measurement, :mod:`daskrl.core.learner_threads`, tries
    the other count in a few), the latest on a tie; None without any.

    Examples
    --------
    >>> kept_threads([2, 2, 1, 2, 2, 1]), kept_threads([float("nan")])  # the last: a trial
    (2, None)
    """
    counts = [int(t) for t in threads if not math.isnan(t)][-last:]
    if not counts:
        return None
    return max(reversed(counts), key=counts.count)


def core_use(rows: list[dict[str, float]]) -> str | None:
    """How many cores each role kept busy: CPU seconds per wall second while the learner
    updates (``learner_cpu_s`` over ``learn_s``, with its torch threads) and while the
    rollouts run (every replica's ``rollout_cpu_s`` over ``rollout_s``), and over the whole
    iteration; None for a run without the CPU columns. A worker process's CPU counts
    everything it ran meanwhile (its other tasks, Dask's own threads).

    Examples
    --------
    >>> rows = [{"learner_cpu_s": 0.18, "learn_s": 0.1, "learner_threads": 2,
    ...          "rollout_cpu_s": 0.2, "rollout_s": 0.2, "iteration_s": 0.32}]
    >>> print(core_use(rows))
    cores busy (CPU s / wall s): learner 1.80 updating (2 threads), rollouts 1.00, iteration 1.19
    """
    learner_cpu, learn = _mean(rows, "learner_cpu_s"), _mean(rows, "learn_s")
    rollout_cpu, rollout = _mean(rows, "rollout_cpu_s"), _mean(rows, "rollout_s")
    parts = []
    if learn > 0 and not math.isnan(learner_cpu):
        count = kept_threads([r.get("learner_threads", math.nan) for r in rows])
        kept = f" ({count} thread{'s' if count > 1 else ''})" if count else ""
        parts.append(f"learner {learner_cpu / learn:.2f} updating{kept}")
    if rollout > 0 and not math.isnan(rollout_cpu):
        parts.append(f"rollouts {rollout_cpu / rollout:.2f}")
    iteration = _mean(rows, "iteration_s")
    busy = sum(v for v in (learner_cpu, rollout_cpu) if not math.isnan(v))
    if not parts or not iteration > 0:
        return None
    return f"cores busy (CPU s / wall s): {', '.join(parts)}, iteration {busy / iteration:.2f}"


def _rows(run_dir: Path) -> list[dict[str, float]]:
    """``metrics.csv``'s rows as column -> number."""
    data = read_metrics(run_dir)
    n = len(next(iter(data.values()))) if data else 0
    return [{k: v[i] for k, v in data.items()} for i in range(n)]


def _config(run_dir: Path) -> dict[str, Any]:
    """The graph config in ``run_dir/summary.json`` (empty while the run is going, or when
    the file cannot be read: the report is made from ``metrics.csv`` all the same)."""
    try:
        return dict(read_summary(run_dir).get("config") or {})
    except (OSError, ValueError):
        return {}
