"""``metrics.csv`` (one row per iteration) and ``summary.json``."""

from __future__ import annotations

import csv
import json
import math
import queue
import threading
import time
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
        self.tb = _Scalars(path.parent / "tb") if tensorboard else None
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
        if self.tb is not None:
            self.tb.write(row)

    def close(self) -> None:
        """Close the file (and the event files)."""
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


class _Scalars:
    """A row's numeric columns as TensorBoard scalars (tags ``charts/<column>`` unless the
    column has a ``/``), stepped by ``env_steps``, written by a thread of their own.

    The thread imports TensorBoard when the first row comes, that is once the first
    iteration has run, not while the run starts: the import holds the interpreter, and the
    embedded scheduler shares this process while its start-up is on the way to the first
    iteration. Each row is one event holding every value, not one event per value, because
    the cost of writing is per event.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: queue.SimpleQueue[tuple[float, dict[str, Any]] | None] = (
            queue.SimpleQueue())
        self.thread: threading.Thread | None = None

    def write(self, row: dict[str, Any]) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="daskrl-tensorboard",
                                           daemon=True)
            self.thread.start()
        self.rows.put((time.time(), row))

    def _run(self) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:  # the tensorboard package is optional
            while self.rows.get() is not None:
                pass
            return
        writer = EventFileWriter(str(self.folder))
        while (item := self.rows.get()) is not None:
            wall, row = item
            values = [Summary.Value(tag=key if "/" in key else f"charts/{key}",
                                    simple_value=value)
                      for key, value in row.items()
                      if isinstance(value, (int, float)) and not isinstance(value, bool)]
            step = int(row.get("env_steps", row.get("iteration", 0)))
            writer.add_event(Event(wall_time=wall, step=step, summary=Summary(value=values)))
        writer.close()

    def close(self) -> None:
        if self.thread is not None:
            self.rows.put(None)
            self.thread.join()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` (NaN written as null)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
    path.write_text(json.dumps(clean, indent=2, sort_keys=True) + "\n")
