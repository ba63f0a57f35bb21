"""A sweep's record, ``OUT/sweep.json``: its definition, every trial's state and result,
and (for population-based training) the lineage. Written after every change, atomically,
so a stopped sweep resumes from it and ``daskrl sweep-status`` reads it while it runs."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STATES = ("pending", "running", "paused", "finished", "failed", "pruned", "stopped")
"""A trial's states: ``stopped`` trials (Ctrl-C, a stop from Python) go on at ``--resume``;
``paused``: a population member between rounds."""
DONE = frozenset({"finished", "failed", "pruned"})
"""States a resumed sweep keeps as they are."""


class SweepState:
    """``OUT/sweep.json`` held in memory; every change is saved at once.

    Parameters
    ----------
    out : Path
        The sweep's folder.
    definition : dict
        What the sweep trains (graph, steps, settings, mode and its parameters): a resume
        must give the same.
    resume : bool
        Continue the sweep recorded in ``out`` (refused when there is none, or when its
        definition differs); without it an ``out`` holding anything is refused.

    Examples
    --------
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "sweep"
    >>> state = SweepState(out, {"graph": "ppo.py", "steps": 100}, resume=False)
    >>> state.add("t000-seed1", {}, 1)
    >>> state.update("t000-seed1", state="finished", eval_return_mean=500.0)
    >>> SweepState(out, {"graph": "ppo.py", "steps": 100}, resume=True).trials["t000-seed1"][
    ...     "state"]
    'finished'
    >>> SweepState(out, {"graph": "ppo.py", "steps": 200}, resume=True)
    Traceback (most recent call last):
    ...
    ValueError: --resume: the sweep in ... was started with steps=100, not 200: ...
    """

    def __init__(self, out: Path, definition: Mapping[str, Any], resume: bool) -> None:
        self.out, self.path = out, out / "sweep.json"
        self.lock = threading.Lock()
        definition = json.loads(json.dumps(definition))  # as it will read back
        if resume:
            if not self.path.is_file():
                raise ValueError(f"--resume: no sweep.json under {out}; pass the --out of an "
                                 "earlier sweep")
            self.data = json.loads(self.path.read_text())
            _same(out, self.data["definition"], definition)
        else:
            # jobs/: the logs of the batch jobs started for this sweep (--cluster)
            if out.exists() and (not out.is_dir() or any(p.name != "jobs"
                                                          for p in out.iterdir())):
                what = "a sweep" if self.path.is_file() else "files"
                raise ValueError(f"{out} already holds {what}: pass --resume to continue it, "
                                 "or choose another --out")
            self.data = {"version": 1, "definition": definition, "trials": {}, "lineage": []}
            out.mkdir(parents=True, exist_ok=True)
            self.save()

    @property
    def trials(self) -> dict[str, dict[str, Any]]:
        """Trial name -> its record (``config``, ``seed``, ``state``, results)."""
        return self.data["trials"]

    def add(self, name: str, config: Mapping[str, Any], seed: int, **fields: Any) -> None:
        """Record a trial as pending (kept as it is when already there)."""
        with self.lock:
            self.trials.setdefault(name, {"config": dict(config), "seed": seed,
                                          "state": "pending", **fields})
            self._save()

    def update(self, name: str, **fields: Any) -> None:
        """Change a trial's record and save."""
        with self.lock:
            self.trials[name].update(fields)
            self._save()

    def set(self, key: str, value: Any) -> None:
        """Set a sweep-wide entry (``lineage``, ``round``...) and save."""
        with self.lock:
            self.data[key] = value
            self._save()

    def save(self) -> None:
        """Write ``sweep.json`` (through a temporary file: a reader never sees half)."""
        with self.lock:
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_plain))
        os.replace(tmp, self.path)


def _plain(value: Any) -> Any:
    return str(value)


def _same(out: Path, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            raise ValueError(f"--resume: the sweep in {out} was started with "
                             f"{key}={_show(before.get(key))}, not {_show(now.get(key))}: "
                             "resume it with the same settings, or choose another --out")


def _show(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return str(value)


def read_sweep(out: Path) -> dict[str, Any]:
    """``OUT/sweep.json`` as a dict; ``FileNotFoundError`` naming what to pass instead."""
    path = out / "sweep.json"
    if not path.is_file():
        raise FileNotFoundError(f"{out}: no sweep.json here; pass the --out of a "
                                "`daskrl sweep`")
    return json.loads(path.read_text())
