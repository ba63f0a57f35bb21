"""A run's settings (how long and where to train, what to keep) and their check."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskrl.core.placement import Placement
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.redecide import RedecidePlan


@dataclass
class RunSettings:
    """How long and where to train, and what to keep."""

    out: Path
    """The run's folder: ``metrics.csv``, ``summary.json``, ``checkpoints/``."""
    steps: int = 500_000
    """Env steps to train for, rounded up to whole iterations."""
    seed: int = 1
    """Seeds the learner, every replica's envs and the evaluation."""
    resume: bool = False
    """Continue from the latest checkpoint under ``out``."""
    checkpoint_every: int = 10
    """Iterations between checkpoints (one is also kept at the end and on Ctrl-C)."""
    keep_checkpoints: int = 3
    """Checkpoints kept, newest first."""
    lookahead: int = 4
    """Graphs in flight at once, each chained on the one before."""
    chain: int = 64
    """Tasks chained on futures before the chain restarts from the driver's copy of the
    last result (bounds the lineage Dask keeps; each restart drains the pipeline)."""
    task_s: float = 0.5
    """Seconds of work per task the driver aims for when the distribution can run several
    iterations in one task (``iterations_per_task``): short iterations are grouped so that
    Dask's per-task cost is paid once per group. 0 keeps one iteration per task."""
    max_recoveries: int = 3
    """Lost workers (and hung tasks) survived in a row, with no iteration finished between,
    before the run stops."""
    task_timeout: float | None = None
    """Seconds a fragment task may run (or its worker stay silent) before the watchdog
    reports it with its stack and restarts the worker; None: max(10 x the median of the
    role's recent task durations, 60 s). Off under ``--scheduler sync``."""
    eval_every: int = 0
    """Evaluate the policy every this many iterations in a task of its own (0: never);
    the best one is kept as ``checkpoints/best.pt``."""
    max_restarts: int = 0
    """Times the embedded cluster is started again from the last checkpoint when its
    scheduler or every worker dies."""
    replan_timeout: float = 30.0
    """Seconds to wait for workers that can host the fragments again after a loss."""
    tensorboard: bool = True
    """Also write TensorBoard events."""
    eval: bool = True
    """Evaluate the final policy (its metrics go to the summary)."""
    deterministic: bool = False
    """Bit-identical runs whatever the workers (see ``IterationInputs.deterministic``)."""
    env_retries: int = 2
    """Times a rollout whose env raised is retried on rebuilt envs."""
    progress: bool = True
    """Show a progress bar."""
    stop_after_s: float | None = None
    """Seconds after the first iteration finishes past which no further iteration is
    submitted: the run ends, as a shorter run, once those in flight are recorded (None: it
    trains all its steps). ``--distribution auto`` bounds its probes with it."""
    pause_at: int | None = None
    """Iteration (counted from the run's start) after which the run pauses: it ends with a
    checkpoint of that iteration and its evaluation, its learning-rate schedule laid out for
    all ``steps``, so a resume with the same ``steps`` goes on as if it had not stopped
    (population-based training trains its members in such rounds). None: no pause."""
    schedule: tuple[int, float] = (0, 0.0)
    """``(iteration, progress)`` the learning-rate schedule goes on from; the driver sets it
    on a resume that changes the run's length (:func:`~daskrl.runtime.driver.schedule_start`),
    so the schedule continues from the value it had reached."""
    advice: bool = True
    """Say once, mid-run, what to change when one part of the iteration dominates a
    sustained window (:mod:`daskrl.observe.live_advice`; ``summary.json``'s ``advice``)."""
    observers: tuple[Callable[[Mapping[str, Any], Placement], None], ...] = ()
    """Called with each recorded iteration's ``metrics.csv`` row and the placement it ran
    under (``--adapt`` sizes the cluster from them); they must return quickly."""
    redecide: RedecidePlan | None = None
    """``--distribution auto``: the distributions the run may switch between while it goes
    on, and when it re-decides (:mod:`daskrl.runtime.redecide`). None: it keeps the one it
    starts under."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Copied into the summary and every checkpoint (the graph, its config)."""


def check_settings(settings: RunSettings) -> None:
    """Refuse settings that would fail later or lose an earlier run's checkpoints.

    Examples
    --------
    >>> import tempfile
    >>> check_settings(RunSettings(Path(tempfile.mkdtemp()), steps=0))
    Traceback (most recent call last):
    ...
    ValueError: --steps must be >= 1, got 0
    """
    if settings.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be >= 1, got {settings.checkpoint_every}")
    if settings.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {settings.steps}")
    if settings.pause_at is not None and settings.pause_at < 1:
        raise ValueError(f"pause_at must be >= 1 iteration, got {settings.pause_at}")
    if settings.env_retries < 0:
        raise ValueError(f"--env-retries must be >= 0, got {settings.env_retries}")
    if settings.task_timeout is not None and not settings.task_timeout > 0:
        raise ValueError(f"--task-timeout must be > 0 seconds, got {settings.task_timeout}")
    for flag, value in (("--eval-every", settings.eval_every),
                        ("--max-restarts", settings.max_restarts),
                        ("--max-recoveries", settings.max_recoveries)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    if not 0 <= settings.replan_timeout < math.inf:  # NaN too
        raise ValueError("--replan-timeout must be a finite number of seconds >= 0, got "
                         f"{settings.replan_timeout}")
    check_out(settings.out)
    has_ckpt = bool(list_checkpoints(settings.out / "checkpoints"))
    if settings.resume and not has_ckpt:
        raise ValueError(f"--resume: no checkpoints under {settings.out}; pass the --out of an "
                         "earlier run")
    if not settings.resume and has_ckpt:
        raise ValueError(f"{settings.out} already holds checkpoints of an earlier run: pass "
                         "--resume to continue it, or choose another --out")


def check_out(out: Path) -> None:
    """Refuse an output folder that names a regular file, or lies under one (making it would
    fail only after the cluster started).

    Examples
    --------
    >>> import tempfile
    >>> file = Path(tempfile.mkdtemp()) / "notes.txt"; _ = file.write_text("x")
    >>> check_out(file / "run")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --out .../notes.txt/run: .../notes.txt is a file, not a folder; choose another --out
    """
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise ValueError(f"--out {out}: {path} is a file, not a folder; choose another "
                             "--out")
