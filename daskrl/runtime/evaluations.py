"""Periodic evaluation during a run (``--eval-every``): a task of the evaluate role on each
due iteration's weights, not waited for; its return goes into a later metrics row, and the
best one so far into ``best.pt``."""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
from dask.delayed import delayed

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.failures import Call
from daskrl.core.keys import task_key
from daskrl.distributions import IterationInputs
from daskrl.runtime.attempt import LOST, Attempt
from daskrl.runtime.checkpoint import best_eval, save_best
from daskrl.runtime.engine import Backend, Handle
from daskrl.runtime.recorder import Recorder
from daskrl.runtime.run_checkpoints import payload, writing
from daskrl.runtime.settings import RunSettings

EVAL_PRIORITY = -(2**31)
"""Periodic evaluations run after every iteration task that is ready: they never delay the
learner on a worker they share."""


@dataclass(frozen=True)
class PendingEval:
    """A periodic evaluation in flight: the weights of iteration ``iteration``."""

    iteration: int
    output: LearnerOutput
    counters: dict[str, float]
    handle: Handle


class PeriodicEvals:
    """The periodic evaluations of one run, oldest first.

    Parameters
    ----------
    backend, algo, settings, recorder
        Where the tasks run, what is evaluated, the run's settings, and the recorder whose
        next row takes each evaluation's columns.
    result : callable
        Waits for a handle's value; raises one of :data:`~daskrl.runtime.attempt.LOST` when
        a worker it needs is lost (the run loop's own wait, which watches its pins).
    """

    def __init__(self, backend: Backend, algo: Algorithm, settings: RunSettings,
                 recorder: Recorder, result: Callable[[Handle], Any]) -> None:
        self.backend, self.algo, self.settings, self.recorder = backend, algo, settings, recorder
        self.result = result
        self.pending: deque[PendingEval] = deque()
        self.best = best_eval(settings.out / "checkpoints") if settings.eval_every else None
        """``best.pt``'s evaluation (``eval_return_mean``, ``iteration``), None before one."""

    def due(self, first: int, count: int) -> bool:
        """Whether iterations ``first`` to ``first + count - 1`` cross an evaluation."""
        every = self.settings.eval_every
        return bool(every) and (first + count) // every > first // every

    def submit(self, output: LearnerOutput, attempt: Attempt, total: int) -> None:
        """Evaluate ``output``'s weights in a task of the evaluate role, not waited for."""
        placement, run = attempt.placement, attempt.run
        inputs = IterationInputs(self.algo, placement, run, self.settings.seed,
                                 output.version, total, None, self.settings.deterministic)
        key = task_key("evaluate", 0, output.version, run)
        notes: dict[str, Any] = {"resources": placement.resources["evaluate"].to_dask(),
                                 "priority": EVAL_PRIORITY}
        worker = placement.worker("evaluate", 0)
        if worker is not None:
            notes["workers"] = [worker]
        with dask.annotate(**notes):
            graph = delayed(Call(roles.evaluate, key), pure=False)(
                inputs.context("evaluate", 0), self.algo, output, dask_key_name=key)
        self.pending.append(PendingEval(output.version, output, dict(self.recorder.counters),
                                        self.backend.submit(graph)))

    def collect(self, block: bool) -> None:
        """Record the evaluations that finished, oldest first (all of them with ``block``)."""
        while self.pending:
            pending = self.pending[0]
            if not block and not self.backend.done(pending.handle, timeout=0):
                return
            self.pending.popleft()
            try:
                metrics = self.result(pending.handle)
            except LOST as exc:
                print(f"daskrl: the evaluation of iteration {pending.iteration} was lost "
                      f"({exc}); skipped", file=sys.stderr)
                pending.handle.release()
                continue
            self._record(pending, metrics)

    def _record(self, pending: PendingEval, metrics: dict[str, Any]) -> None:
        """Its columns into the next row; ``best.pt`` when it beats every earlier one."""
        mean = float(metrics["eval_return_mean"])
        self.recorder.attach({"eval_return_mean": mean,
                              "eval_return_std": metrics.get("eval_return_std", float("nan")),
                              "eval_iteration": pending.iteration})
        if math.isfinite(mean) and (self.best is None or mean > self.best["eval_return_mean"]):
            self.best = {"eval_return_mean": mean, "iteration": pending.iteration}
            kept = payload(self.settings, pending.output, pending.counters)
            kept["eval"] = dict(self.best)
            with writing(self.settings.out / "checkpoints"):
                save_best(self.settings.out / "checkpoints", kept)

    def forgetting(self, final: float) -> dict[str, Any]:
        """What ``summary.json`` says of the best periodic evaluation (nothing without
        periodic evaluations); :func:`forgetting_note` on stderr when the ``final``
        evaluation is worse."""
        if self.best is None:
            return {}
        best, at = self.best["eval_return_mean"], self.best["iteration"]
        note = forgetting_note(final, best, at, self.settings.out)
        if note:
            print(note, file=sys.stderr)
        return {"best_eval_return_mean": best, "best_eval_iteration": at}

    def release(self) -> None:
        """Let go of every evaluation in flight."""
        for evaluation in self.pending:
            evaluation.handle.release()
        self.pending.clear()


def forgetting_note(final: float, best: float, iteration: int, out: Path) -> str | None:
    """The line a run prints when its final policy evaluates worse than the best periodic
    evaluation: it forgot what it had learned, and ``best.pt`` keeps the better policy.

    Examples
    --------
    >>> forgetting_note(500.0, 500.0, 40, Path("runs/dqn-1")) is None
    True
    >>> forgetting_note(21.7, 500.0, 40, Path("runs/dqn-1"))
    'daskrl: the final policy evaluates at 21.7, below the best periodic evaluation (500 at iteration 40): the run forgot what it had learned; runs/dqn-1/checkpoints/best.pt keeps that policy (daskrl eval runs/dqn-1 --best)'
    """  # noqa: E501
    if not (math.isfinite(final) and final < best):
        return None
    return (f"daskrl: the final policy evaluates at {final:.6g}, below the best periodic "
            f"evaluation ({best:.6g} at iteration {iteration}): the run forgot what it had "
            f"learned; {out}/checkpoints/best.pt keeps that policy (daskrl eval {out} --best)")
