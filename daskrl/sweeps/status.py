"""``daskrl sweep-status OUT``: every trial's state, steps and latest return, read from
``OUT/sweep.json`` and, for trials that train now, their ``metrics.csv``."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from daskrl.sweeps.runner import latest
from daskrl.sweeps.state import read_sweep


def status_table(out: Path) -> str:
    """The sweep's trials as a text table, with a counts line above it.

    Raises ``FileNotFoundError`` when ``out`` holds no sweep.

    Examples
    --------
    >>> import json, tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> _ = (out / "sweep.json").write_text(json.dumps({"definition": {"mode": "seeds",
    ...     "steps": 1000}, "trials": {"t000-seed1": {"state": "finished", "seed": 1,
    ...     "config": {}, "env_steps": 1024, "eval_return_mean": 500.0}}}))
    >>> print(status_table(out))  # doctest: +NORMALIZE_WHITESPACE
    seeds sweep, 1 trial: 1 finished
    trial        state     env steps  of steps  return  eval return
    t000-seed1   finished  1024       1000      -       500.0
    """
    sweep = read_sweep(out)
    trials = sweep["trials"]
    steps = sweep["definition"].get("steps", 0)
    counts = Counter(rec["state"] for rec in trials.values())
    head = (f"{sweep['definition'].get('mode', 'grid')} sweep, {len(trials)} "
            f"trial{'s' if len(trials) != 1 else ''}: "
            + ", ".join(f"{n} {state}" for state, n in counts.most_common()))
    if "round" in sweep:
        head += f"; round {sweep['round']}, {len(sweep.get('lineage', []))} copies"
    rows = [("trial", "state", "env steps", "of steps", "return", "eval return")]
    for name, rec in trials.items():
        seen: dict[str, Any] = latest(out / name) if rec["state"] == "running" else {}
        rows.append((name, rec["state"], str(seen.get("env_steps", rec.get("env_steps", 0))),
                     str(steps), _fmt(seen.get("episode_return_mean",
                                               rec.get("episode_return_mean"))),
                     _fmt(rec.get("eval_return_mean"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    return "\n".join([head, *lines])


def _fmt(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.1f}"
    return "-"
