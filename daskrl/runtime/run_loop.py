"""The run loop: submit iteration graphs ahead, record them in order, recover lost workers.

:func:`daskrl.runtime.driver.train` sets a run up and hands its iterations to a :class:`RunLoop`,
a small state machine (:class:`Phase`):

``SUBMITTING``
    Fill the look-ahead window with iteration graphs, each taking the previous one's
    learner output as a future, so the scheduler never waits for the driver.
``WAITING``
    Wait for the oldest graph in flight and record its iterations (metrics, checkpoint).
    A worker it needed leaving (reported by the scheduler, see
    :class:`~daskrl.runtime.backend.MembershipPlugin`) or a lost task leads to ``RECOVERING``.
``RECOVERING``
    Let go of everything in flight, place the fragments again on the workers there are
    and submit again from the last finished iteration, under new task keys.
``DONE``
    Every iteration is recorded.
"""

from __future__ import annotations

import enum
import math
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
from dask.delayed import Delayed, delayed
from distributed.client import FutureCancelledError
from distributed.scheduler import KilledWorker, NoValidWorkerError, NoWorkerError

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.failures import Call, PeerLost, RunStopped
from daskrl.core.fragment import Fragment
from daskrl.core.placement import Placement, plan_placement, task_key
from daskrl.distributions import Distribution, IterationInputs
from daskrl.runtime.backend import Backend, Handle
from daskrl.runtime.checkpoint import best_score, list_checkpoints, save_best, save_checkpoint
from daskrl.runtime.recorder import Recorder
from daskrl.runtime.settings import RunSettings
from daskrl.runtime.watchdog import Watchdog


class WorkersLost(RuntimeError):
    """A worker that replicas are pinned to has left the cluster."""


class ClusterLost(ValueError):
    """No worker that can host the fragments came back in time (``--max-restarts`` starts
    a new embedded cluster; otherwise the run stops with this one line)."""


class WorkerHung(RuntimeError):
    """The watchdog found a task past its bound or a silent worker, and restarted it."""


_LOST = (CancelledError, FutureCancelledError, KilledWorker, NoValidWorkerError, NoWorkerError,
         PeerLost, WorkersLost, WorkerHung)
"""What a lost worker looks like to the driver: the iteration is submitted again."""


def place(backend: Backend, algo: Algorithm, distribution: Distribution) -> Placement:
    """Check every fragment's resources against the workers and pin replicas to names.

    Raises ``ValueError`` when the workers cannot host the fragments, or when the
    distribution's own conditions (``check_placement``) refuse the placement.

    Examples
    --------
    >>> from daskrl.runtime.backend import SyncBackend
    >>> from daskrl.distributions import get_distribution
    >>> algo = Algorithm("a", print, print, print, num_steps=8, num_envs=4)
    >>> place(SyncBackend(), algo, get_distribution("single")).worker("learner", 0)
    'local'
    """
    fragments = distribution.fragments(algo)
    if "evaluate" not in {f.role for f in fragments}:
        fragments.append(Fragment(roles.evaluate, "evaluate", algo.resources_for("evaluate")))
    placement = plan_placement(fragments, backend.workers(fragments))
    distribution.check_placement(placement, algo)
    return placement


class Phase(enum.Enum):
    """Where a :class:`RunLoop` is; each phase is one of its methods."""

    SUBMITTING = "submitting"
    WAITING = "waiting"
    RECOVERING = "recovering"
    DONE = "done"


@dataclass(frozen=True)
class InFlight:
    """A submitted graph: iterations ``first`` to ``first + count - 1``."""

    first: int
    count: int
    handle: Handle


@dataclass(frozen=True)
class Attempt:
    """One placement of the run's fragments and the task keys submitted under it.

    After a lost worker the run goes on as a new attempt: new task keys, because a key
    reused right after its cancellation can be cancelled by the scheduler's late notice,
    and fresh worker state, because what the lost attempt left half-way through an
    iteration must not be used.
    """

    run: str
    """The id that ends every task key (and names worker state) of this attempt."""
    placement: Placement
    pins: dict[str, str]
    """Worker name -> its address at placement. The scheduler resolves a name pin to an
    address, so a worker restarted under its name is lost to the tasks pinned before."""
    since: int
    """The backend's membership cursor when the pins were taken."""
    cap: int
    """The most iterations one task may run under this placement."""

    @classmethod
    def begin(cls, backend: Backend, algo: Algorithm, distribution: Distribution,
              placement: Placement, settings: RunSettings) -> Attempt:
        """Pin ``placement``'s workers as they are now, under a new run id."""
        since = backend.membership.cursor()  # before the snapshot: no departure slips by
        now = backend.identities()
        names = {name for role, names in placement.workers.items()
                 if role not in distribution.replaceable for name in names}
        cap = 1
        if settings.task_s > 0:
            probe = IterationInputs(algo, placement, "", settings.seed, 0, 1, None,
                                    settings.deterministic, settings.env_retries)
            cap = max(1, int(distribution.iterations_per_task(probe)))
        return cls(uuid.uuid4().hex[:8], placement, {name: now.get(name, "") for name in names},
                   since, cap)

    def lost_workers(self, backend: Backend) -> list[str]:
        """Names of the pinned workers that left since the pins were taken."""
        left = backend.membership.left_since(self.since)
        return sorted(name for name, addr in self.pins.items() if not addr or addr in left)


@dataclass(frozen=True)
class PendingEval:
    """A periodic evaluation in flight: the weights of iteration ``iteration``."""

    iteration: int
    output: LearnerOutput
    counters: dict[str, float]
    handle: Handle


EVAL_PRIORITY = -(2**31)
"""Periodic evaluations run after every iteration task that is ready: they never delay the
learner on a worker they share."""


class TaskSize:
    """How many iterations go into one task.

    One until a task has been timed (and then one task in flight, since the next ones are
    sized from it); after that, about ``task_s`` seconds of work, at most ``cap``.

    Examples
    --------
    >>> size = TaskSize(cap=8, task_s=0.5)
    >>> size.count, size.window(4)
    (1, 1)
    >>> size.observe(0.125)
    >>> size.count, size.window(4)
    (4, 4)
    """

    def __init__(self, cap: int, task_s: float) -> None:
        self.cap, self.task_s = cap, task_s
        self.count = 1
        self.timed = cap <= 1

    def window(self, depth: int) -> int:
        """How many tasks may be in flight."""
        return depth if self.timed else 1

    def observe(self, per_iteration: float) -> None:
        """Size the next tasks from the seconds an iteration took."""
        if self.cap > 1 and per_iteration > 0:
            self.count = max(1, min(self.cap, int(self.task_s / per_iteration)))
            self.timed = True


class RunLoop:
    """Submits iterations ahead, records them in order, and recovers from lost workers.

    Parameters
    ----------
    backend, algo, distribution, settings
        What runs, where and how long.
    attempt : Attempt
        The first placement, pinned.
    recorder : Recorder
        Turns each finished iteration into a metrics row.
    start : LearnerOutput
        The input of iteration ``first`` (a fresh learner, or a checkpoint on resume).
    first, total : int
        The iteration to start from and the number of iterations of the whole run.

    :meth:`run` steps through the phases until ``DONE`` and returns the last output. After
    an exception (Ctrl-C included) :meth:`release` lets go of what is still in flight and
    :meth:`checkpoint` keeps :attr:`last_done`, the last finished iteration.
    """

    def __init__(self, backend: Backend, algo: Algorithm, distribution: Distribution,
                 settings: RunSettings, attempt: Attempt, recorder: Recorder,
                 start: LearnerOutput, first: int, total: int) -> None:
        self.backend, self.algo, self.distribution = backend, algo, distribution
        self.settings, self.recorder = settings, recorder
        self.attempt = attempt
        self.earlier: list[str] = []  # run ids of attempts lost with a worker
        self.size = TaskSize(attempt.cap, settings.task_s)
        self.phase = Phase.SUBMITTING
        self.first, self.total = first, total
        self.next = first  # the next iteration to submit
        self.last_done = start
        self.inflight: deque[InFlight] = deque()
        self.learner_in: Any = None  # what the next graph takes as its learner input
        self.linked = 0  # graphs chained on futures since the chain last restarted
        self.unchecked: Delayed | None = None  # the first graph, whose annotations must hold
        self.recoveries = 0  # in all
        self.in_a_row = 0  # since an iteration last finished
        self.lost: BaseException | None = None  # why the head of the window was lost
        self.watchdog = Watchdog(backend, settings.task_timeout)
        self.evals: deque[PendingEval] = deque()
        self.best = (best_score(settings.out / "checkpoints") if settings.eval_every else None)

    def run(self) -> LearnerOutput:
        """Step until every iteration is recorded; return the last output."""
        steps = {Phase.SUBMITTING: self.submit, Phase.WAITING: self.wait,
                 Phase.RECOVERING: self.recover}
        while self.phase is not Phase.DONE:
            self.phase = steps[self.phase]()
        self._collect_evals(block=True)
        self.recorder.flush()
        return self.last_done

    # ------------------------------------------------------------------ SUBMITTING

    def submit(self) -> Phase:
        """Fill the look-ahead window; then wait for its oldest graph, or finish."""
        while self._room():
            self._submit_next()
        if self.unchecked is not None:  # after the first window is queued: the workers go on
            self.backend.check_annotations(self.unchecked)
            self.unchecked = None
        return Phase.WAITING if self.inflight else Phase.DONE

    def _room(self) -> bool:
        """Whether another graph may go in flight now."""
        depth = max(1, self.settings.lookahead)
        if self.next >= self.total or len(self.inflight) >= self.size.window(depth):
            return False
        # A chain at its length waits to drain, then restarts from the driver's copy.
        return not self.inflight or self.linked < max(depth, self.settings.chain)

    def _submit_next(self) -> None:
        """Submit the graph of the next iterations, chained on the one before."""
        if not self.inflight:  # restart the chain from data: no lineage behind it
            learner = self.attempt.placement.worker("learner", 0)
            self.learner_in = self.backend.scatter(self.last_done, learner)
            self.linked = 0
        count = min(self.size.count, self.total - self.next)
        graph = self.distribution.iteration(self._inputs(self.next, count))
        handle = self.backend.submit(graph)
        if self.next == self.first:
            self.unchecked = graph
        self.learner_in = self.backend.as_input(handle)
        self.inflight.append(InFlight(self.next, count, handle))
        self.linked += 1
        self.next += count

    def _inputs(self, iteration: int, count: int) -> IterationInputs:
        s = self.settings
        return IterationInputs(self.algo, self.attempt.placement, self.attempt.run, s.seed,
                               iteration, self.total, self.learner_in, s.deterministic,
                               s.env_retries, count, schedule=s.schedule,
                               checkpoint=(iteration + count) // s.checkpoint_every
                               > iteration // s.checkpoint_every or iteration + count >= self.total)

    # ------------------------------------------------------------------ WAITING

    def wait(self) -> Phase:
        """Wait for the oldest graph in flight and record it."""
        head = self.inflight[0]
        try:
            output = self._result(head.handle)
        except _LOST as exc:
            self.lost = exc
            return Phase.RECOVERING
        self.inflight.popleft()
        self._record(head, output)
        self.in_a_row = 0  # progress: --max-recoveries counts losses in a row
        return Phase.SUBMITTING

    def _result(self, handle: Handle) -> LearnerOutput:
        """``handle``'s value; :class:`WorkersLost` if a pinned worker leaves meanwhile.

        Fetching the result is bounded too: when the worker holding it dies, Dask waits for
        a recomputation that a task pinned there never gets.
        """
        fetch = 2.0
        while True:
            while not self.backend.done(handle, timeout=1.0):
                self._check_pins()
            try:
                return handle.result(timeout=fetch)
            except TimeoutError:
                if handle.status == "error":
                    raise  # the task's own TimeoutError
                self._check_pins()
                fetch = min(2 * fetch, 60.0)  # large data on a slow link: wait longer each time

    def _check_pins(self) -> None:
        gone = self.attempt.lost_workers(self.backend)
        if gone:
            raise WorkersLost(f"worker(s) {', '.join(gone)} left the cluster")
        hangs = self.watchdog.check(self.attempts(), self.attempt.pins)
        if hangs:
            raise WorkerHung(self.watchdog.handle(hangs))

    def _record(self, done: InFlight, output: LearnerOutput) -> None:
        """Record a finished graph's iterations; checkpoint when one is due."""
        _check_finite(done.first, output, self.settings.out, self.last_done)
        self.last_done = output
        self._collect_evals(block=False)  # a finished one goes into this row
        self.size.observe(self.recorder.record(done.first, output))
        every = self.settings.checkpoint_every
        if (done.first + done.count) // every > done.first // every:
            _checkpoint(self.settings, output, self.recorder.counters)
        every = self.settings.eval_every
        if every and (done.first + done.count) // every > done.first // every:
            self._submit_eval(output)

    # ------------------------------------------------------------------ periodic evaluation

    def _submit_eval(self, output: LearnerOutput) -> None:
        """Evaluate ``output``'s weights in a task of the evaluate role, not waited for."""
        placement, run = self.attempt.placement, self.attempt.run
        inputs = IterationInputs(self.algo, placement, run, self.settings.seed,
                                 output.version, self.total, None, self.settings.deterministic)
        key = task_key("evaluate", 0, output.version, run)
        notes: dict[str, Any] = {"resources": placement.resources["evaluate"].to_dask(),
                                 "priority": EVAL_PRIORITY}
        worker = placement.worker("evaluate", 0)
        if worker is not None:
            notes["workers"] = [worker]
        with dask.annotate(**notes):
            graph = delayed(Call(roles.evaluate, key), pure=False)(
                inputs.context("evaluate", 0), self.algo, output, dask_key_name=key)
        self.evals.append(PendingEval(output.version, output, dict(self.recorder.counters),
                                      self.backend.submit(graph)))

    def _collect_evals(self, block: bool) -> None:
        """Record the evaluations that finished, oldest first (all of them with ``block``)."""
        while self.evals:
            pending = self.evals[0]
            if not block and not self.backend.done(pending.handle, timeout=0):
                return
            self.evals.popleft()
            try:
                metrics = self._result(pending.handle)
            except _LOST as exc:
                print(f"daskrl: the evaluation of iteration {pending.iteration} was lost "
                      f"({exc}); skipped", file=sys.stderr)
                pending.handle.release()
                continue
            self._record_eval(pending, metrics)

    def _record_eval(self, pending: PendingEval, metrics: dict[str, Any]) -> None:
        """Its columns into the next row; ``best.pt`` when it beats every earlier one."""
        mean = float(metrics["eval_return_mean"])
        self.recorder.attach({"eval_return_mean": mean,
                              "eval_return_std": metrics.get("eval_return_std", float("nan")),
                              "eval_iteration": pending.iteration})
        if math.isfinite(mean) and (self.best is None or mean > self.best):
            self.best = mean
            payload = _payload(self.settings, pending.output, pending.counters)
            payload["eval"] = {"eval_return_mean": mean, "iteration": pending.iteration}
            with _writing(self.settings.out / "checkpoints"):
                save_best(self.settings.out / "checkpoints", payload)

    # ------------------------------------------------------------------ RECOVERING

    def recover(self) -> Phase:
        """Drop what is in flight, place again, resubmit from the last finished iteration."""
        lost_at = self.inflight[0].first
        self.recoveries += 1
        self.in_a_row += 1
        why = " ".join(str(self.lost).split())  # Dask's cancellation reasons span lines
        if self.in_a_row > self.settings.max_recoveries:
            raise RunStopped(
                f"iteration {lost_at + 1} was lost {self.in_a_row} times (last: {why}); "
                f"giving up after --max-recoveries {self.settings.max_recoveries} - "
                f"{kept_checkpoint(self.settings.out, self.last_done)}; check the workers' logs"
            ) from self.lost
        print(f"daskrl: iteration {lost_at + 1} lost ({why}); placing the fragments "
              "again and resubmitting from the last finished iteration", file=sys.stderr)
        self.release(evaluations=False)  # they finish, or fail as lost and are skipped
        self.learner_in = None
        self.next = lost_at
        self.earlier.append(self.attempt.run)
        placement = self._place_again()
        self.attempt = Attempt.begin(self.backend, self.algo, self.distribution, placement,
                                     self.settings)
        self.size = TaskSize(self.attempt.cap, self.settings.task_s)
        if self.recorder.timeline is not None:
            self.recorder.timeline.run = self.attempt.run
        return Phase.SUBMITTING

    def _place_again(self) -> Placement:
        """Place on the workers there are now, waiting a while for replacements to join."""
        membership = self.backend.membership
        deadline = time.monotonic() + self.settings.replan_timeout
        while True:
            cursor = membership.cursor()
            try:
                return place(self.backend, self.algo, self.distribution)
            except ValueError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterLost(
                        f"the cluster lost the workers this run needs: {exc}") from None
                # A worker that joins is reported; the cap on the wait covers one that
                # only becomes usable later (its resources, a distribution's conditions).
                membership.wait(cursor, timeout=min(left, 1.0))

    def release(self, evaluations: bool = True) -> None:
        """Let go of every graph in flight (and of the periodic evaluations).

        Release, not cancel: the scheduler's cancel walks into the next iteration's tasks,
        which no client holds, fails an assertion and drops this client.
        """
        for pending in self.inflight:
            pending.handle.release()
        self.inflight.clear()
        if evaluations:
            for evaluation in self.evals:
                evaluation.handle.release()
            self.evals.clear()

    def checkpoint(self) -> None:
        """Checkpoint the last finished iteration (nothing when none finished yet)."""
        _checkpoint(self.settings, self.last_done, self.recorder.counters)

    def attempts(self) -> list[str]:
        """Run ids of every attempt, the current one last."""
        return [*self.earlier, self.attempt.run]


def kept_checkpoint(out: Path, last_done: LearnerOutput) -> str:
    """What a stopped run keeps, truly: the last finished iteration (checkpointed on the
    way out), an earlier checkpoint, or nothing.

    Examples
    --------
    >>> import tempfile
    >>> kept_checkpoint(Path(tempfile.mkdtemp()), LearnerOutput(0, {}, {}, {}))
    'no iteration finished, so no checkpoint was written'
    """
    if last_done.metrics:
        return (f"iteration {last_done.version} is checkpointed in "
                f"{out / 'checkpoints'}; continue with --resume")
    found = list_checkpoints(out / "checkpoints")
    if found:
        return f"the last checkpoint is {found[-1]}; continue with --resume"
    return "no iteration finished, so no checkpoint was written"


def _check_finite(it: int, output: LearnerOutput, out: Path, last_done: LearnerOutput) -> None:
    """Stop on a NaN/inf loss before it reaches a checkpoint."""
    for j, metrics in enumerate([*output.history, output.metrics]):
        bad = {k: v for k, v in metrics.items()
               if k.startswith("losses/") and isinstance(v, float) and not math.isfinite(v)
               and k != "losses/explained_variance"}
        if bad:
            raise FloatingPointError(
                f"iteration {it + j + 1}: non-finite loss {bad}; training stopped - "
                f"{kept_checkpoint(out, last_done)} - lower --learning-rate or "
                "--max-grad-norm, or check the env's rewards for NaN/inf")


def _checkpoint(settings: RunSettings, output: LearnerOutput, counters: dict[str, float]) -> None:
    """Checkpoint a finished iteration (the learner's version counts iterations)."""
    if not output.metrics:
        return  # nothing trained since the start or the resume
    with _writing(settings.out / "checkpoints"):
        save_checkpoint(settings.out / "checkpoints", output.version,
                        _payload(settings, output, counters), keep=settings.keep_checkpoints)


@contextmanager
def _writing(directory: Path) -> Iterator[None]:
    """A checkpoint that cannot be written (disk full, read-only folder) stops the run in one
    line naming the last good one (the atomic write left it as it was)."""
    try:
        yield
    except OSError as exc:
        found = list_checkpoints(directory)
        kept = (f"the last good checkpoint is {found[-1]}" if found else
                "no checkpoint was written")
        raise RunStopped(f"cannot write a checkpoint in {directory} ({exc.strerror or exc}): "
                         f"the run stopped; {kept}; free space or fix the folder's "
                         "permissions, then continue with --resume") from exc


def _payload(settings: RunSettings, output: LearnerOutput, counters: dict[str, float]
             ) -> dict[str, Any]:
    """A checkpoint's content (the learner's version counts iterations)."""
    return {"version": output.version, "iteration": output.version, "learner": output.state,
            "actors": output.actors, "counters": counters, "meta": settings.meta}
