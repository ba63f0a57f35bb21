"""A sweep's results the way RL papers give them: per configuration, the interquartile
mean (IQM) of the trials' final greedy returns with a 95 % stratified bootstrap confidence
interval (the ``rliable`` package), learning curves of the training return's IQM with
95 % bands, and what each configuration cost in wall-clock and CPU-seconds.

Writes ``OUT/report.json``, ``OUT/report.md`` and ``OUT/curves.png``/``.svg`` (and
``OUT/lineage.png``/``.svg`` for population-based training).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from daskrl.core.script import MissingExtra
from daskrl.observe.plot import read_metrics
from daskrl.sweeps.spec import label

REPS = 20_000
"""Bootstrap resamples of the final-return intervals (``$DASKRL_BOOTSTRAP_REPS`` sets
another number: rliable's bootstrap takes about 0.25 ms a resample)."""
CURVE_REPS = 2_000
"""Bootstrap resamples at each point of a learning curve."""
CURVE_POINTS = 40


def rliable_modules() -> tuple[Any, Any]:
    """rliable's ``library`` and ``metrics``, or one line naming the extra."""
    try:
        from rliable import library, metrics
    except ImportError:
        raise MissingExtra("a sweep's report", "sweep", "rliable") from None
    return library, metrics


def groups_of(trials: Mapping[str, Mapping[str, Any]], mode: str) -> dict[str, list[str]]:
    """Configuration label -> its trials (a configuration's seeds); a population-based
    sweep is one group, its population.

    Examples
    --------
    >>> groups_of({"a": {"config": {"lr": 1}}, "b": {"config": {"lr": 1}},
    ...            "c": {"config": {"lr": 2}}}, "grid")
    {'lr=1': ['a', 'b'], 'lr=2': ['c']}
    """
    if mode == "pbt":
        return {"population": list(trials)}
    out: dict[str, list[str]] = {}
    for name, rec in trials.items():
        out.setdefault(label(rec.get("config", {})), []).append(name)
    return out


def bootstrap_reps() -> int:
    """The final-return intervals' resamples: ``$DASKRL_BOOTSTRAP_REPS``, else :data:`REPS`.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"DASKRL_BOOTSTRAP_REPS": "500"}):
    ...     bootstrap_reps()
    500
    """
    text = os.environ.get("DASKRL_BOOTSTRAP_REPS", "").strip()
    if not text:
        return REPS
    try:
        reps = int(text)
    except ValueError:
        reps = 0
    if reps < 100:
        raise ValueError(f"DASKRL_BOOTSTRAP_REPS={text!r}: give a whole number of bootstrap "
                         "resamples, at least 100")
    return reps


def iqm_interval(scores: Sequence[float], reps: int | None = None, seed: int = 0
                 ) -> tuple[float, float, float]:
    """IQM of ``scores`` (one per run) and its 95 % stratified bootstrap interval, from
    ``reps`` resamples (default: :func:`bootstrap_reps`).

    Examples
    --------
    >>> iqm, low, high = iqm_interval([1.0, 2.0, 3.0, 4.0, 100.0], reps=500)
    >>> round(iqm, 3), low <= iqm <= high
    (3.0, True)
    """
    library, metrics = rliable_modules()
    reps = bootstrap_reps() if reps is None else reps
    np.random.seed(seed)  # rliable draws from numpy's global generator
    array = np.asarray(scores, dtype=float).reshape(-1, 1)
    point, interval = library.get_interval_estimates(
        {"x": array}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=reps)
    return float(point["x"][0]), float(interval["x"][0, 0]), float(interval["x"][1, 0])


def iqm_band(scores: np.ndarray, reps: int = CURVE_REPS, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM over runs at each point of ``scores[run, point]`` and its 95 % percentile
    bootstrap band: rliable's estimator (runs resampled with replacement; one task, so
    stratifying changes nothing), vectorised over the points, which rliable's per-call
    interface would take seconds for.

    Examples
    --------
    >>> iqm, low, high = iqm_band(np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 40.0]]))
    >>> iqm.tolist(), bool((low <= iqm).all() and (iqm <= high).all())
    ([1.5, 2.5], True)
    """
    from scipy.stats import trim_mean

    rng = np.random.default_rng(seed)
    runs = scores.shape[0]
    samples = scores[rng.integers(runs, size=(reps, runs))]  # (reps, runs, points)
    iqms = trim_mean(samples, 0.25, axis=1)
    low, high = np.percentile(iqms, [2.5, 97.5], axis=0)
    return trim_mean(scores, 0.25, axis=0), low, high


def curve_points(paths: Sequence[Path], points: int = CURVE_POINTS
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The trials' training returns on a common grid of env steps (up to the shortest
    trial's last step): ``(steps, returns[trial, point])``; None without two rows each."""
    series = []
    for path in paths:
        try:
            cols = read_metrics(path)
        except (FileNotFoundError, ValueError):
            continue
        pairs = [(s, r) for it, s, r in zip(cols.get("iteration", []), cols["env_steps"],
                                                cols.get("episode_return_mean", []),
                                                strict=False)
                  if math.isfinite(it) and math.isfinite(r)]
        if len(pairs) >= 2:
            steps, returns = zip(*pairs, strict=True)
            series.append((np.asarray(steps), np.asarray(returns)))
    if not series:
        return None
    end = min(s[-1] for s, _ in series)
    start = max(s[0] for s, _ in series)
    grid = np.linspace(start, end, points) if end > start else np.asarray([end])
    return grid, np.stack([np.interp(grid, s, r) for s, r in series])


def report(out: Path, sweep: Mapping[str, Any], wall_s: float | None = None
           ) -> dict[str, Any]:
    """Write the report of the sweep recorded in ``sweep`` (``sweep.json``'s contents) under
    ``out``; return what ``report.json`` holds."""
    rliable_modules()
    reps = bootstrap_reps()
    trials = sweep["trials"]
    mode = sweep["definition"].get("mode", "grid")
    rows = []
    curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for group, names in groups_of(trials, mode).items():
        done = [n for n in names if trials[n]["state"] == "finished"
                and _finite(trials[n].get("eval_return_mean"))]
        finals = [float(trials[n]["eval_return_mean"]) for n in done]
        row: dict[str, Any] = {
            "configuration": group, "trials": len(names), "finished": len(done),
            "states": _count(trials[n]["state"] for n in names),
            "final_returns": finals,
            "wall_s": sum(_num(trials[n].get("cost_wall_s")) for n in names),
            "task_compute_s": sum(_num(trials[n].get("cost_compute_s")) for n in names),
            "env_steps": sum(int(_num(trials[n].get("env_steps"))) for n in names),
        }
        if finals:
            iqm, low, high = iqm_interval(finals, reps)
            row.update(iqm=iqm, iqm_low=low, iqm_high=high, mean=float(np.mean(finals)),
                       median=float(np.median(finals)), best=max(finals),
                       best_trial=done[int(np.argmax(finals))])
        rows.append(row)
        curve = curve_points([out / n for n in names])
        if curve is not None:
            curves[group] = (curve[0], *iqm_band(curve[1]))
    result = {"mode": mode, "graph": sweep["definition"].get("graph"),
              "steps": sweep["definition"].get("steps"), "sweep_wall_s": wall_s,
              "configurations": rows, "interval": "95 % stratified bootstrap (rliable), "
              f"{reps} resamples", "score": "final greedy evaluation return (eval_return_mean)"}
    if mode == "pbt":
        result["lineage"] = sweep.get("lineage", [])
    (out / "report.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(table(result) + "\n")
    _plot_curves(out, curves)
    if mode == "pbt":
        _plot_lineage(out, sweep)
    return result


def table(result: Mapping[str, Any]) -> str:
    """The report as a markdown table, best IQM first.

    Examples
    --------
    >>> print(table({"configurations": [{"configuration": "lr=1", "trials": 3,
    ...     "finished": 3, "iqm": 2.0, "iqm_low": 1.0, "iqm_high": 3.0, "mean": 2.0,
    ...     "best": 3.0, "wall_s": 10.0, "task_compute_s": 8.0, "env_steps": 300}]}))
    ... # doctest: +NORMALIZE_WHITESPACE
    | configuration | finished | IQM [95 % CI] | mean | best | wall-clock s | CPU-s | env steps |
    |:--|--:|--:|--:|--:|--:|--:|--:|
    | lr=1 | 3/3 | 2.0 [1.0, 3.0] | 2.0 | 3.0 | 10.0 | 8.0 | 300 |
    """
    lines = ["| configuration | finished | IQM [95 % CI] | mean | best | wall-clock s | CPU-s "
             "| env steps |", "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    rows = sorted(result["configurations"], key=lambda r: -r.get("iqm", -math.inf))
    for r in rows:
        iqm = (f"{r['iqm']:.1f} [{r['iqm_low']:.1f}, {r['iqm_high']:.1f}]" if "iqm" in r
               else "-")
        mean = f"{r['mean']:.1f}" if "mean" in r else "-"
        best = f"{r['best']:.1f}" if "best" in r else "-"
        lines.append(f"| {r['configuration']} | {r['finished']}/{r['trials']} | {iqm} | "
                     f"{mean} | {best} | {r['wall_s']:.1f} | {r['task_compute_s']:.1f} | "
                     f"{r['env_steps']} |")
    return "\n".join(lines)


def _plot_curves(out: Path, curves: Mapping[str, tuple[np.ndarray, ...]]) -> None:
    if not curves:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for group, (steps, iqm, low, high) in curves.items():
        line, = ax.plot(steps, iqm, label=group)
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return (IQM, 95 % CI)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    for suffix in ("png", "svg"):
        fig.savefig(out / f"curves.{suffix}")
    plt.close(fig)


def _plot_lineage(out: Path, sweep: Mapping[str, Any]) -> None:
    """Each searched setting of each member through the rounds; a copy is marked where it
    happened, from the donor's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials, lineage = sweep["trials"], sweep.get("lineage", [])
    keys = sorted({k for rec in trials.values() for k in rec.get("initial_config", {})})
    if not keys:
        return
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.6 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for name, rec in trials.items():
            value = rec.get("initial_config", {}).get(key)
            xs, ys = [0], [value]
            for entry in lineage:
                if entry["member"] == name:
                    xs.append(entry["iteration"])
                    ys.append(entry["after"].get(key))
                    ax.plot([entry["iteration"]], [entry["after"].get(key)], "x", color="k")
            end = sweep["definition"].get("iterations")
            if isinstance(end, int) and end > xs[-1]:
                xs.append(end)
                ys.append(ys[-1])
            ax.step(xs, ys, where="post", label=name)
        ax.set_ylabel(key)
        if any(_num(rec.get("initial_config", {}).get(key)) > 0 for rec in trials.values()):
            ax.set_yscale("log")
    axes[-1, 0].set_xlabel("iteration (x: copied a better member)")
    axes[0, 0].legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    for suffix in ("png", "svg"):
        fig.savefig(out / f"lineage.{suffix}")
    plt.close(fig)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _num(value: Any) -> float:
    return float(value) if _finite(value) else 0.0


def _count(states: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in states:
        out[s] = out.get(s, 0) + 1
    return out
