"""Trials trained side by side on one Dask cluster: at most ``concurrency`` at once, each a
:func:`daskrl.train` run in a thread of its own, each in its own folder.

:class:`TrialPool` takes jobs (a trial, and whether it resumes or pauses) as slots free,
watches the running ones twice a second (the search's pruner reads their evaluations
there), records every change in ``sweep.json``, shows one progress bar, and sends the
trial table to the dashboard's daskrl page. Ctrl-C stops every running trial with a
checkpoint; ``--resume`` goes on from them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client

from daskrl.api import Run
from daskrl.api import train as train_run
from daskrl.observe.board import TOPIC
from daskrl.observe.board_feed import sweep_message
from daskrl.observe.plot import read_metrics
from daskrl.runtime.checkpoint import list_checkpoints, load_latest
from daskrl.sweeps.spec import Trial
from daskrl.sweeps.state import SweepState

POLL_S = 0.5
"""Seconds between looks at the running trials."""
BOARD_S = 2.0
"""Seconds between trial tables sent to the dashboard."""


@dataclass
class Job:
    """A trial to train now: from its start, or on from its checkpoint (``resume``), up to
    the end of its steps or a pause after iteration ``pause_at``."""

    trial: Trial
    resume: bool = False
    pause_at: int | None = None
    run: Run | None = None
    pruned: bool = False
    seen: dict[str, Any] = field(default_factory=dict)  # what the watchers kept of it


@dataclass
class Launch:
    """What every trial of a sweep shares: the graph, its settings and the run flags."""

    graph: str
    steps: int
    config: dict[str, Any]
    """The graph's ``Config`` fields set for every trial (a trial's own win)."""
    options: dict[str, Any]
    """:func:`daskrl.train` keywords: ``distribution``, ``eval_every``,
    ``checkpoint_every``, ``deterministic``, ``resources``..."""


class TrialPool:
    """Runs jobs on one cluster, at most ``concurrency`` at once.

    Parameters
    ----------
    client : distributed.Client
        The cluster every trial trains on.
    launch : Launch
        What the trials share.
    state : SweepState
        ``sweep.json``, updated at every change.
    concurrency : int
        Trials training at once.
    progress : bool
        One progress bar over the sweep's trials.
    total : int
        Trials the bar counts, member-rounds for ``pbt`` (0: no bar).
    mode : str
        The sweep's kind, for the dashboard: ``seeds``, ``grid``, ``search``, ``pbt``.
    """

    def __init__(self, client: Client, launch: Launch, state: SweepState, concurrency: int,
                 progress: bool = True, total: int = 0, mode: str = "grid") -> None:
        self.client, self.launch, self.state = client, launch, state
        self.concurrency = concurrency
        self.mode = mode
        self.running: list[Job] = []
        self.errors: list[str] = []
        self.board_at = 0.0
        done = (sum(r.get("round", 0) for r in state.trials.values()) if mode == "pbt" else
                sum(r["state"] in ("finished", "failed", "pruned")
                    for r in state.trials.values()))
        self.bar = _bar(progress, total, done)

    def run(self, jobs: Iterator[Job], watch: Callable[[Job], None] | None = None,
            ended: Callable[[Job], None] | None = None) -> None:
        """Train ``jobs`` (drawn when a slot frees) until none is left and none runs.

        ``watch(job)`` is called for each running job at every look (it may call
        :meth:`prune`); ``ended(job)`` once a job's run has ended and its record is written.
        Ctrl-C stops every running trial with a checkpoint, records them as ``stopped``
        and raises ``KeyboardInterrupt``.
        """
        exhausted = False
        try:
            while True:
                while not exhausted and len(self.running) < self.concurrency:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                    elif not self._start(job) and ended is not None:
                        ended(job)  # refused before it trained: recorded as failed
                for job in list(self.running):
                    if job.run is not None and job.run.status == "running":
                        if watch is not None and not job.pruned:
                            watch(job)
                        continue
                    self.running.remove(job)
                    self._end(job)
                    if ended is not None:
                        ended(job)
                self._board()
                if exhausted and not self.running:
                    return
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.stop_all()
            raise

    def prune(self, job: Job) -> None:
        """Stop ``job``'s run early (with a checkpoint); it ends as ``pruned``."""
        job.pruned = True
        if job.run is not None:
            job.run.stop(wait=False)  # noticed within a second; watched until it ends

    def stop_all(self) -> None:
        """Stop every running trial with a checkpoint (Ctrl-C) and record them."""
        for job in self.running:
            if job.run is not None:
                job.run.stop(wait=False)
        for job in self.running:
            if job.run is not None:
                try:
                    job.run.stop(timeout=120)
                except TimeoutError:
                    print(f"daskrl: trial {job.trial.name} did not stop within 120 s",
                          file=sys.stderr)
            self.state.update(job.trial.name, state="stopped", **latest(self._out(job)))
        self.running = []
        self._board(force=True)
        if self.bar is not None:
            self.bar.close()

    def close(self) -> None:
        """The bar's last line and the dashboard's last table."""
        self._board(force=True)
        if self.bar is not None:
            self.bar.close()

    # ------------------------------------------------------------------ internals

    def _out(self, job: Job) -> Path:
        return self.state.out / job.trial.name

    def _start(self, job: Job) -> bool:
        """Start ``job``'s run; False when its settings were refused (recorded failed)."""
        out = self._out(job)
        resume = job.resume or bool(list_checkpoints(out / "checkpoints"))
        try:
            job.run = train_run(self.launch.graph, client=self.client,
                                steps=self.launch.steps, out=out, wait=False,
                                seed=job.trial.seed, progress=False, resume=resume,
                                pause_at=job.pause_at, advice=False,
                                **self.launch.options,
                                **{**self.launch.config, **job.trial.config})
        except (ValueError, TypeError) as exc:  # this trial's own settings: the others go on
            error = _one_line(exc)
            self.errors.append(f"trial {job.trial.name}: {error}")
            print(f"daskrl: trial {job.trial.name} failed: {error}", file=sys.stderr)
            self.state.update(job.trial.name, state="failed", error=error)
            if self.bar is not None:
                self.bar.update(1)
            return False
        self.state.update(job.trial.name, state="running", started=time.time())
        self.running.append(job)
        return True

    def _end(self, job: Job) -> None:
        run = job.run
        assert run is not None
        name, out = job.trial.name, self._out(job)
        rec = self.state.trials[name]
        status = run.status
        fields: dict[str, Any] = {"ended": time.time(), **latest(out),
                                  "cost_wall_s": rec.get("cost_wall_s", 0.0)
                                  + time.time() - rec.get("started", time.time())}
        if status == "finished":
            summary = run.summary
            fields.update({k: summary.get(k) for k in (
                "env_steps", "wall_s", "env_steps_per_s", "eval_return_mean",
                "eval_return_std", "final_episode_return_mean", "best_eval_return_mean",
                "task_compute_s", "iterations")})
            fields.update(_compute_cost(rec, summary.get("task_compute_s")))
            state = "paused" if job.pause_at is not None else "finished"
        elif status == "stopped":
            state = "pruned" if job.pruned else "stopped"
            if job.pruned:  # it will not train again: what it cost is in its checkpoint
                ckpt = load_latest(out / "checkpoints") or {}
                fields.update(_compute_cost(rec, ckpt.get("counters", {}).get("task_compute_s")))
        else:
            state = "failed"
            fields["error"] = _one_line(run.error)
            self.errors.append(f"trial {name}: {fields['error']}")
            print(f"daskrl: trial {name} failed: {fields['error']}", file=sys.stderr)
        self.state.update(name, state=state, **fields)
        counted = ("finished", "failed", "pruned", "paused") if self.mode == "pbt" else (
            "finished", "failed", "pruned")  # PBT's bar counts member-rounds
        if self.bar is not None and state in counted:
            self.bar.update(1)
            best = _best(self.state.trials)
            self.bar.set_postfix(running=len(self.running), best=f"{best:.1f}")

    def _board(self, force: bool = False) -> None:
        """Send the trial table to the dashboard every ``BOARD_S`` seconds."""
        now = time.monotonic()
        if not force and now - self.board_at < BOARD_S:
            return
        self.board_at = now
        live = {job.trial.name for job in self.running}
        trials = []
        for name, rec in self.state.trials.items():
            seen = latest(self.state.out / name) if name in live else rec
            trials.append({"name": name, "state": rec["state"],
                           "env_steps": seen.get("env_steps") or 0, "steps": self.launch.steps,
                           "return": seen.get("episode_return_mean"),
                           "eval_return": rec.get("eval_return_mean"), "run": None})
        meta = {"name": self.state.out.name, "out": str(self.state.out.resolve()),
                "mode": self.mode}
        try:
            self.client.log_event(TOPIC, sweep_message(str(self.state.out.resolve()), meta,
                                                       trials))
        except Exception:  # noqa: BLE001 - the page is an aid: a sweep never stops for it
            pass


def _compute_cost(rec: Mapping[str, Any], total: Any) -> dict[str, float]:
    """A trial's CPU-seconds so far (``cost_compute_s``) from its run's cumulative
    ``task_compute_s``: what was added since the checkpoint this job started from
    (``compute_at_checkpoint``; a PBT copy starts from its donor's)."""
    if not isinstance(total, (int, float)) or not math.isfinite(total):
        return {}
    spent = max(0.0, total - rec.get("compute_at_checkpoint", 0.0))
    return {"cost_compute_s": rec.get("cost_compute_s", 0.0) + spent,
            "compute_at_checkpoint": float(total)}


def _columns(out: Path) -> dict[str, list[float]]:
    """A trial's ``metrics.csv`` columns so far (:func:`~daskrl.observe.plot.read_metrics`);
    empty before its first row."""
    try:
        return read_metrics(out)
    except (FileNotFoundError, ValueError):
        return {}


def latest(out: Path) -> dict[str, Any]:
    """A trial's latest ``env_steps`` and training return, from its ``metrics.csv``."""
    cols = _columns(out)
    rows = [i for i, v in enumerate(cols.get("iteration", [])) if math.isfinite(v)]
    if not rows:
        return {}
    last = rows[-1]
    return {"env_steps": int(cols["env_steps"][last]),
            "episode_return_mean": _number(cols.get("episode_return_mean", [math.nan] * (
                last + 1))[last])}


def eval_rows(out: Path) -> list[tuple[int, float]]:
    """A trial's periodic evaluations so far: ``(iteration, greedy return)``."""
    cols = _columns(out)
    pairs = zip(cols.get("eval_iteration", []), cols.get("eval_return_mean", []), strict=True)
    return [(int(it), value) for it, value in pairs if math.isfinite(it) and math.isfinite(value)]


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _best(trials: Mapping[str, Mapping[str, Any]]) -> float:
    values = [r["eval_return_mean"] for r in trials.values()
              if isinstance(r.get("eval_return_mean"), (int, float))]
    return max(values, default=math.nan)


def _one_line(error: BaseException | None) -> str:
    text = str(error) if error is not None else "unknown error"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"{type(error).__name__}: {first}" if error is not None else first


def _bar(progress: bool, total: int, done: int) -> Any:
    if not progress or total <= 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, unit="trial", desc="sweep", dynamic_ncols=True)
