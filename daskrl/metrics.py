"""``metrics.csv`` (one row per iteration) and ``summary.json``."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path
from typing import Any

FIRST = ("iteration", "env_steps", "wall_s", "episode_return_mean", "env_steps_per_s")


class MetricsWriter:
    """Append-only CSV of per-iteration metrics, flushed after every row.

    On resume, rows after the checkpoint's iteration are dropped first, so the file stays
    contiguous with no duplicate iterations. With ``tensorboard=True`` (and the
    ``tensorboard`` package installed) numeric columns also go to TensorBoard event files
    under ``<folder>/tb``, stepped by env steps.

    Examples
    --------
    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "metrics.csv"
    >>> w = MetricsWriter(p); w.write({"iteration": 1, "env_steps": 8, "loss": 0.5}); w.close()
    >>> p.read_text().splitlines()[0]
    'iteration,env_steps,loss'
    """

    def __init__(self, path: Path, resume_after: int | None = None,
                 tensorboard: bool = False) -> None:
        self.path = path
        # made before the run's first task: done later, TensorBoard's start-up (~0.1 s of
        # the interpreter) would hold up the embedded scheduler between two iterations
        self.tb = _tensorboard(path.parent / "tb") if tensorboard else None
        self.columns: list[str] | None = None
        kept: list[dict[str, str]] = []
        if resume_after is not None and path.exists():
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                self.columns = list(reader.fieldnames or []) or None
                kept = [r for r in reader if int(r["iteration"]) <= resume_after]
        self.fh = path.open("w", newline="")
        self.writer: csv.DictWriter | None = None
        if self.columns:
            self._start(self.columns)
            for row in kept:
                self.writer.writerow(row)  # type: ignore[union-attr]
            self.fh.flush()

    def _start(self, columns: list[str]) -> None:
        self.columns = columns
        self.writer = csv.DictWriter(self.fh, fieldnames=columns, extrasaction="ignore")
        self.writer.writeheader()

    def write(self, row: dict[str, Any]) -> None:
        """Write one iteration's row (columns fixed by the first row written)."""
        if self.writer is None:
            first = [c for c in FIRST if c in row]
            self._start(first + sorted(c for c in row if c not in first))
        self.writer.writerow({k: _fmt(v) for k, v in row.items()})  # type: ignore[union-attr]
        self.fh.flush()
        tb = self.tb
        if tb is not None:
            step = int(row.get("env_steps", row.get("iteration", 0)))
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    tb.add_scalar(key if "/" in key else f"charts/{key}", value, step)

    def close(self) -> None:
        """Close the file (and the event files)."""
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


_IMPORTING: list[threading.Thread] = []


def preload_tensorboard() -> None:
    """Start importing TensorBoard's writer in a thread (once per process).

    The import takes ~0.3 s of the interpreter. Begun while the driver starts, it is done
    before training; begun with the first iteration, it would hold up the embedded
    scheduler, which shares this process. Call it once torch is imported: two threads
    importing torch at once can each see the other's half-imported modules.

    Examples
    --------
    >>> preload_tensorboard()
    """
    if not _IMPORTING:
        thread = threading.Thread(target=_import_writer, name="daskrl-tensorboard-import",
                                  daemon=True)
        _IMPORTING.append(thread)
        thread.start()


def _import_writer() -> None:
    try:
        from torch.utils.tensorboard.summary import scalar
    except ImportError:  # the tensorboard package is optional
        return
    scalar("warm-up", 0.0)  # the first summary loads more of TensorBoard: not during a run


def _tensorboard(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the tensorboard package is optional
        return None
    return SummaryWriter(log_dir=str(folder))


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` (NaN written as null)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
    path.write_text(json.dumps(clean, indent=2, sort_keys=True) + "\n")
