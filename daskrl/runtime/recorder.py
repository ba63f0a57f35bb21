"""The driver's record of a run: a metrics row per iteration, progress, counters, overhead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from daskrl.core.algorithm import LearnerOutput
from daskrl.observe.board_feed import RunFeed
from daskrl.observe.metrics import MetricsWriter
from daskrl.observe.parts import finite, overhead_seconds
from daskrl.observe.timeline import Timeline


class Recorder:
    """Turns each finished iteration into a metrics row, progress and counters.

    Parameters
    ----------
    out : Path
        The run's folder: rows go to ``out/metrics.csv`` (and TensorBoard under ``out``).
    total : int
        Iterations of the whole run (for the progress bar).
    start : int
        Iterations done before this process started (a resumed run's checkpoint).
    counters : dict
        ``env_steps`` and ``wall_s`` to continue from (empty for a new run).
    resume : bool
        Keep the rows of ``metrics.csv`` up to ``start`` and drop those after it.
    tensorboard, progress : bool
        Also write TensorBoard events; show a progress bar.
    timeline : Timeline, optional
        Splits each iteration's time using Dask's task stream.
    feed : RunFeed, optional
        Also sends each row to the scheduler, for the dashboard's daskrl page.

    Examples
    --------
    >>> import tempfile
    >>> rec = Recorder(Path(tempfile.mkdtemp()), 2, 0, {}, tensorboard=False)
    >>> out = LearnerOutput(1, {}, {}, {"env_steps": 8, "learn_t_start": 0.5,
    ...                                 "learn_t_end": 1.0, "rollout_t_start": 0.0})
    >>> rec.record(0, out), rec.env_steps
    (1.0, 8)
    >>> rec.close()
    """

    def __init__(self, out: Path, total: int, start: int, counters: dict, *,
                 resume: bool = False, tensorboard: bool = True, progress: bool = False,
                 timeline: Timeline | None = None, feed: RunFeed | None = None) -> None:
        self.timeline, self.feed = timeline, feed
        self.writer = MetricsWriter(out / "metrics.csv", resume_after=start if resume else None,
                                    tensorboard=tensorboard)
        self.env_steps = int(counters.get("env_steps", 0))
        self.wall_before = float(counters.get("wall_s", 0.0))
        self.compute_before = float(counters.get("task_compute_s", 0.0))
        self.counters = {"env_steps": self.env_steps, "wall_s": self.wall_before,
                         "task_compute_s": self.compute_before}
        self.bar = _progress(progress, total, start)
        self.start = start
        self.attached: dict[str, Any] = {}  # columns for the next row (a periodic evaluation)
        self.last_end: float | None = None
        self.iteration_sum = self.overhead_sum = 0.0
        self.t0 = time.perf_counter()
        self.last_rows: list[dict[str, Any]] = []  # the last task's iterations

    def record(self, it: int, output: LearnerOutput) -> float:
        """Write the rows of a task's iterations, ``it`` onwards (one, or the task's
        ``history`` and then its last); return their mean wall time per iteration.

        An iteration's wall time runs from the previous learner's end to its own, so the
        first iteration of a task also carries the wait for that task.
        """
        rows = [self._row(it + j, m) for j, m in enumerate([*output.history, output.metrics])]
        total = sum(r["iteration_s"] for r in rows)
        if self.timeline is not None:
            if len(rows) == 1:
                rows[0].update(self.timeline.split(it, rows[0]))
            else:  # one task ran them all: split its time, share it by iteration time
                group = {key: sum(finite(r.get(key)) for r in rows)
                         for key in ("iteration_s", "rollout_s", "env_s", "inference_s")}
                parts = self.timeline.split(it, group)
                for r in rows:
                    share = r["iteration_s"] / total if total > 0 else 1 / len(rows)
                    r.update({key: v * share for key, v in parts.items()})
        if self.attached:
            rows[-1].update(self.attached)
            self.attached = {}
        self.last_rows = rows
        for j, row in enumerate(rows):
            if it + j > self.start:  # the first iteration also pays for worker start-up
                wall, overhead = overhead_seconds(row)
                self.iteration_sum += wall
                self.overhead_sum += overhead
            self._write(row)
        if self.bar is not None:
            m = output.metrics
            self.bar.update(len(rows))
            self.bar.set_postfix(steps=self.env_steps, sps=f"{rows[-1]['env_steps_per_s']:.0f}",
                                 ret=f"{m.get('episode_return_mean', float('nan')):.1f}")
        return total / len(rows)

    def _row(self, it: int, m: dict[str, Any]) -> dict[str, Any]:
        """Iteration ``it``'s row from its metrics (counters advance)."""
        self.env_steps += m.get("env_steps", 0)
        wall = self.wall_before + time.perf_counter() - self.t0
        end = m.get("learn_t_end", 0.0)
        begin = self.last_end if self.last_end is not None else m.get("rollout_t_start", end)
        iter_s = end - begin
        inside = m.get("rollout_s", 0.0) + end - m.get("learn_t_start", end)
        self.last_end = end
        row = {key: v for key, v in m.items() if not key.endswith(("_t_start", "_t_end"))}
        row["iteration_env_steps"] = row.pop("env_steps", 0)
        row.update(iteration=it + 1, env_steps=self.env_steps, wall_s=wall,
                   env_steps_per_s=self.env_steps / wall if wall > 0 else 0.0,
                   iteration_s=iter_s, overhead_s=iter_s - inside,
                   learn_s=end - m.get("learn_t_start", end))
        if m.get("agent_steps") and iter_s > 0:  # multi-agent: rate with Dask's gaps included
            row["agent_steps_per_s_wall"] = m["agent_steps"] / iter_s
        self.counters = {"env_steps": self.env_steps, "wall_s": wall,
                         "task_compute_s": self.compute_s()}
        return row

    def compute_s(self) -> float:
        """Seconds the run's tasks computed on workers, summed over tasks and carried over
        resumes (:attr:`~daskrl.observe.timeline.Timeline.compute_s`); its CPU-seconds where
        each task runs one thread, as a role's default CPU grant has it."""
        done = self.timeline.compute_s if self.timeline is not None else 0.0
        return self.compute_before + done

    def attach(self, values: dict[str, Any]) -> None:
        """Add ``values`` (an evaluation that finished meanwhile) to the next row written;
        what is attached already under the same columns is written first, in a row of its own."""
        if self.attached.keys() & values.keys():
            self.flush()
        self.attached.update(values)

    def flush(self) -> None:
        """Write what is attached and no iteration row took, as a row of its own (its
        ``iteration`` cell empty: no iteration is recorded twice)."""
        if self.attached:
            self._write({"env_steps": self.env_steps, **self.attached})
            self.attached = {}

    def _write(self, row: dict[str, Any]) -> None:
        """To ``metrics.csv`` (and TensorBoard), then to the dashboard's page."""
        self.writer.write(row)
        if self.feed is not None:
            self.feed.row(row)

    def overhead_share(self) -> float:
        """``summary.json``'s ``dask_overhead_share``: the share of wall time in which no
        fragment computed (:func:`~daskrl.observe.parts.overhead_seconds`, the definition
        ``daskrl profile`` prints), all iterations after the first (NaN before any)."""
        if self.iteration_sum <= 0:
            return float("nan")
        return self.overhead_sum / self.iteration_sum

    def close(self) -> None:
        """Close the CSV and the progress bar."""
        self.writer.close()
        if self.bar is not None:
            self.bar.close()


def _progress(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="it", desc="train", dynamic_ncols=True)
