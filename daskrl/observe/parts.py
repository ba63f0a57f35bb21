"""The parts an iteration's wall time is split into, and the Dask overhead among them.

:class:`~daskrl.observe.timeline.Timeline` writes these ``metrics.csv`` columns for each
iteration, from the previous learner task's end to this one's; they add up to its wall
time:

``time/env_s``           envs stepping (env tasks; the rollout's ``env_s`` share)
``time/inference_s``     policy forward passes (inference tasks; the rollout's share)
``time/rollout_other_s`` the rest of the rollouts (buffers, GAE; all of a rollout whose
                         actor does not time its env and inference)
``time/learn_s``         learner and gradient tasks, less any rollout fused into them
``time/transfer_s``      inputs moving between workers while no task computes
``time/idle_s``          nothing running: scheduler latency, the driver, waiting

The overhead (transfer, scheduler and idle) is defined once here, for ``summary.json``'s
``dask_overhead_share`` and for ``daskrl profile``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

PARTS = {
    "env stepping": "time/env_s",
    "inference": "time/inference_s",
    "rollout, other (buffers, GAE)": "time/rollout_other_s",
    "learning": "time/learn_s",
    "data transfer": "time/transfer_s",
    "scheduler and idle": "time/idle_s",
}
"""Label -> metrics.csv column of each part :class:`~daskrl.observe.timeline.Timeline`
writes."""

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
