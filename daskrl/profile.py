"""Where an iteration's time goes, from ``metrics.csv``, and which setting to change."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .plot import read_metrics

PARTS = {
    "env stepping": "env_s",
    "inference": "inference_s",
    "rollout (env + inference)": "rollout_s",
    "learning": "learn_s",
    "scheduler, transfer and idle": "overhead_s",
}

ADVICE = {
    "env": "env-bound: add rollout replicas (--num-actors) or envs per replica (--num-envs), "
           "or more workers",
    "learn": "learner-bound: give the learner a GPU (--resources learner=GPU:1), use larger "
             "minibatches (--num-minibatches), or the data-parallel distribution",
    "overhead": "overhead-bound: put more work in each task (--num-steps, --num-envs) so "
                "Dask's per-task cost is amortised",
}


def breakdown(run_dir: Path, skip: int = 1) -> dict[str, float]:
    """Mean seconds per iteration of each part (the first ``skip`` iterations dropped).

    Means, not medians, so the parts add up to the mean iteration time.

    When the rollout reports env and inference time separately, those replace the
    combined rollout part.
    """
    data = read_metrics(run_dir)
    if "iteration_s" not in data:
        raise ValueError(f"{run_dir}/metrics.csv has no iteration_s column: not a daskrl run?")
    n = len(data["iteration_s"])
    rows = range(min(skip, n - 1), n)
    out: dict[str, float] = {}
    for label, col in PARTS.items():
        values = [data[col][i] for i in rows if col in data and not math.isnan(data[col][i])]
        if values:
            out[label] = statistics.fmean(values)
    if "env stepping" in out and "inference" in out:
        out.pop("rollout (env + inference)", None)
    out["iteration"] = statistics.fmean(data["iteration_s"][i] for i in rows)
    return out


def bottleneck(parts: dict[str, float]) -> str:
    """The advice for the largest part."""
    env = parts.get("env stepping", parts.get("rollout (env + inference)", 0.0))
    scores = {"env": env, "learn": parts.get("learning", 0.0),
              "overhead": parts.get("scheduler, transfer and idle", 0.0)}
    return ADVICE[max(scores, key=scores.get)]


def report(run_dir: Path) -> str:
    """A printable breakdown with shares of the iteration time and the bottleneck.

    Examples
    --------
    >>> print(report(Path("runs/ppo-20260101-000000")))  # doctest: +SKIP
    """
    parts = breakdown(run_dir)
    total = parts.pop("iteration")
    lines = [f"mean iteration: {total * 1e3:.1f} ms"]
    for label, value in parts.items():
        share = value / total if total > 0 else float("nan")
        lines.append(f"  {label:<30} {value * 1e3:8.1f} ms  {share:6.1%}")
    lines.append(f"bottleneck: {bottleneck(parts)}")
    return "\n".join(lines)
