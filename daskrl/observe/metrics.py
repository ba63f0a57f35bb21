"""``metrics.csv`` (one row per iteration) and ``summary.json``."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from daskrl.core.failures import RunStopped

FIRST = ("iteration", "env_steps", "wall_s", "episode_return_mean", "env_steps_per_s")


class MetricsWriter:
    """Append-only CSV of per-iteration metrics, flushed after every row.

    The file is never silently shortened: on resume, rows after the checkpoint's iteration
    (redone by the resumed run) are first kept in ``metrics.csv.bak`` (``.bak.2``, ... when
    that exists) and the move is reported on stderr; a fresh run in a folder that holds a
    ``metrics.csv`` keeps the old file the same way. A row with a column the file lacks
    rewrites the file with the wider header (a temp file renamed over it: a crash leaves the
    old or the new file, never half of one). With ``tensorboard=True`` (and the
    ``tensorboard`` package installed) numeric columns also go to TensorBoard event files
    under ``<folder>/tb``, stepped by env steps.

    Raises
    ------
    RunStopped
        From :meth:`write`/:meth:`close` when the file or the TensorBoard writer fails (disk
        full, folder read-only): a run must not go on without its record.

    Examples
    --------
    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "metrics.csv"
    >>> w = MetricsWriter(p); w.write({"iteration": 1, "env_steps": 8, "loss": 0.5})
    >>> w.write({"iteration": 2, "env_steps": 16, "loss": 0.25, "late": 1}); w.close()
    >>> p.read_text().splitlines()
    ['iteration,env_steps,loss,late', '1,8,0.5,', '2,16,0.25,1']
    """

    def __init__(self, path: Path, resume_after: int | None = None,
                 tensorboard: bool = False) -> None:
        self.path = path
        self.tb = _Scalars(path.parent / "tb") if tensorboard else None
        self.columns: list[str] | None = None
        self.fh: Any = None
        if path.exists():
            self._adopt(resume_after)

    def _adopt(self, resume_after: int | None) -> None:
        """Continue the existing file: keep its rows up to ``resume_after`` in place and
        everything else in a backup (a fresh run keeps none in place)."""
        text = self.path.read_text()
        columns, rows = _parse(text)
        keep = [] if resume_after is None else [r for r in rows if _row_iteration(r)
                                                 <= resume_after]
        if len(keep) == len(rows) and (not text or text.endswith("\n")):
            self.columns = columns or None
            return  # nothing to drop: append to the file as it is
        backup = _backup_name(self.path)
        self._guard(lambda: shutil.copy2(self.path, backup))
        moved = [_row_iteration(r) for r in rows[len(keep):]]
        what = (f"rows of iterations {min(moved)}-{max(moved)}" if moved else "a torn last row")
        if resume_after is None:
            print(f"daskrl: {self.path} of an earlier run moved to {backup.name}",
                  file=sys.stderr)
            self._guard(lambda: self.path.unlink())
            return
        print(f"daskrl: {self.path}: {what} (after the checkpoint of iteration "
              f"{resume_after}) kept in {backup.name}; the resumed run writes them again",
              file=sys.stderr)
        self.columns = columns or None
        self._rewrite(keep)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace the file with ``rows`` under :attr:`columns`, atomically."""
        def write() -> None:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".metrics-", suffix=".csv")
            try:
                with os.fdopen(fd, "w", newline="") as fh:
                    writer = csv.DictWriter(fh, fieldnames=self.columns or [], restval="",
                                            extrasaction="ignore")
                    writer.writeheader()
                    writer.writerows(rows)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        self._guard(write)

    def _open(self) -> Any:
        if self.fh is None:
            self.fh = self._guard(lambda: self.path.open("a", newline=""))
        return self.fh

    def _guard(self, action: Any) -> Any:
        """Run ``action``; an ``OSError`` (disk full, read-only folder) stops the run."""
        try:
            return action()
        except OSError as exc:
            raise RunStopped(f"cannot write {self.path} ({exc.strerror or exc}): the run "
                             "stopped; free space or fix the folder's permissions, then "
                             "continue it with --resume") from exc

    def write(self, row: dict[str, Any]) -> None:
        """Append one row; a column the file lacks widens its header first."""
        if self.tb is not None:
            self.tb.check()
        if self.columns is None:
            first = [c for c in FIRST if c in row]
            self.columns = first + sorted(c for c in row if c not in first)
            self._rewrite([])
        elif any(c not in self.columns for c in row):
            self._close_file()
            rows = _parse(self._guard(self.path.read_text))[1] if self.path.exists() else []
            self.columns = self.columns + sorted(c for c in row if c not in self.columns)
            self._rewrite(rows)
        fh = self._open()
        writer = csv.DictWriter(fh, fieldnames=self.columns, restval="")

        def append() -> None:
            writer.writerow({k: _fmt(v) for k, v in row.items()})
            fh.flush()
        self._guard(append)
        if self.tb is not None:
            self.tb.write(row)

    def _close_file(self) -> None:
        if self.fh is not None:
            fh, self.fh = self.fh, None
            self._guard(fh.close)

    def close(self) -> None:
        """Close the file (and the event files); raise if the TensorBoard writer failed."""
        try:
            self._close_file()
        finally:
            if self.tb is not None:
                self.tb.close()


def _parse(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and complete rows of a CSV text (a torn last line, without newline, dropped)."""
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def _row_iteration(row: dict[str, str]) -> int:
    """The iteration a row belongs to (an evaluation-only row: the one it evaluated)."""
    for key in ("iteration", "eval_iteration"):
        value = row.get(key) or ""
        if value.strip():
            return int(float(value))
    return 0


def _backup_name(path: Path) -> Path:
    """``metrics.csv.bak``, or ``.bak.2``, ``.bak.3``... : never over an earlier backup."""
    backup = path.with_name(path.name + ".bak")
    n = 2
    while backup.exists():
        backup = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    return backup


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
        self.error: BaseException | None = None
        """Why the thread stopped writing; raised by the next :meth:`check`."""

    def check(self) -> None:
        """Raise :class:`RunStopped` when the thread has failed (its events are lost)."""
        if self.error is not None:
            raise RunStopped(f"the TensorBoard writer for {self.folder} failed "
                             f"({type(self.error).__name__}: {self.error}): the run stopped; "
                             "fix the folder (space, permissions) and continue with --resume"
                             ) from self.error

    def write(self, row: dict[str, Any]) -> None:
        self.check()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="daskrl-tensorboard",
                                           daemon=True)
            self.thread.start()
        self.rows.put((time.time(), row))

    def _run(self) -> None:
        try:
            self._write_events()
        except BaseException as exc:  # noqa: BLE001 - reported by check(), in the driver
            self.error = exc
            while self.rows.get() is not None:  # let close() finish
                pass

    def _write_events(self) -> None:
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
            self.thread = None
        self.check()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def iteration_rows(run_dir: Path) -> list[dict[str, str]]:
    """The iteration rows of ``run_dir/metrics.csv`` as written so far (as strings; a line
    being written and evaluation-only rows left out); empty before the file exists. What a
    watcher of a running run reads.

    Examples
    --------
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> iteration_rows(run)
    []
    >>> _ = (run / "metrics.csv").write_text("iteration,eval_return_mean\\n1,\\n,9.5\\n2,")
    >>> [r["iteration"] for r in iteration_rows(run)]
    ['1']
    """
    path = Path(run_dir) / "metrics.csv"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [r for r in _parse(text)[1] if (r.get("iteration") or "").strip()]


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``run_dir/summary.json`` (what :func:`write_summary` wrote); empty while the run has
    not written it yet.

    Raises
    ------
    ValueError
        Naming the file when it holds no JSON object (e.g. cut short by a full disk).

    Examples
    --------
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> read_summary(run)
    {}
    >>> write_summary(run / "summary.json", {"env_steps": 64, "eval_return_mean": math.nan})
    >>> read_summary(run)
    {'env_steps': 64, 'eval_return_mean': None}
    """
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}): written by a run cut short?") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not the summary's JSON object")
    return data


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` (NaN written as null)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
    try:
        path.write_text(json.dumps(clean, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise RunStopped(f"cannot write {path} ({exc.strerror or exc}); the checkpoints are "
                         "written: free space and continue with --resume") from exc
