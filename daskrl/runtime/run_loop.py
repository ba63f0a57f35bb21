"""The run loop: submit iteration graphs ahead, record them in order, recover lost workers.

:func:`daskrl.runtime.driver.train` sets a run up and hands its iterations to a :class:`RunLoop`,
a small state machine (:class:`Phase`):

``SUBMITTING``
    Fill the look-ahead window with iteration graphs, each taking the previous one's
    learner output as a future, so the scheduler never waits for the driver. A chain
    starts from the driver's copy of the last output, sent to the learner's worker; that
    worker found dead on the way leads to ``RECOVERING``.
``WAITING``
    Wait for the oldest graph in flight and record its iterations (metrics, checkpoint).
    A worker it needed leaving (reported by the scheduler, see
    :class:`~daskrl.runtime.membership.MembershipPlugin`) or a lost task leads to ``RECOVERING``.
``RECOVERING``
    Let go of everything in flight, place the fragments again on the workers there are
    and submit again from the last finished iteration, under new task keys.
``DONE``
    Every iteration is recorded.

Between them, a worker that joins is put to use at an iteration boundary when placing the
fragments again would give it a replica (:meth:`RunLoop._notice_joins`): after the iteration
whose record shows the join, the graphs after it are let go and the run goes on from it
under a new placement (or, where the learner's full state travels only in a checkpoint's
output, or actors run free, after one more iteration that carries it). Each re-plan is a
``replan`` cell in ``metrics.csv`` and an entry of ``summary.json``'s ``replans``.

What the phases use lives beside it: placements and what losing one looks like
(:mod:`daskrl.runtime.attempt`), when to re-plan and the record of each
(:mod:`daskrl.runtime.replan`; under ``--distribution auto`` also to switch distribution,
:mod:`daskrl.runtime.redecide`), periodic evaluations (:mod:`daskrl.runtime.evaluations`)
and checkpoints on the way (:mod:`daskrl.runtime.run_checkpoints`).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import time
from collections import deque
from typing import Any

from dask.delayed import Delayed

from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.failures import RunStopped
from daskrl.core.placement import Placement
from daskrl.core.roles import without_coordinator_state
from daskrl.core.worker_state import drop_run
from daskrl.distributions import Distribution, IterationInputs, get_distribution
from daskrl.distributions.base import coordinated, lightened
from daskrl.runtime.attempt import (
    LOST,
    Attempt,
    ClusterLost,
    InFlight,
    TaskSize,
    WorkerHung,
    WorkersLost,
    place,
)
from daskrl.runtime.engine import Backend, Handle
from daskrl.runtime.evaluations import PeriodicEvals
from daskrl.runtime.recorder import Recorder
from daskrl.runtime.replan import Replans, placement_moves, with_meta
from daskrl.runtime.run_checkpoints import check_finite, checkpoint_iteration, kept_checkpoint
from daskrl.runtime.settings import RunSettings
from daskrl.runtime.watchdog import Watchdog

__all__ = ["Attempt", "ClusterLost", "Phase", "RunLoop", "WorkerHung", "WorkersLost",
           "kept_checkpoint", "place"]


class Phase(enum.Enum):
    """Where a :class:`RunLoop` is; each phase is one of its methods."""

    SUBMITTING = "submitting"
    WAITING = "waiting"
    RECOVERING = "recovering"
    DONE = "done"


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
        self.token = str(settings.out.resolve())  # its claim on workers (runtime.occupancy)
        self.attempt = attempt
        self.earlier: list[str] = []  # run ids of attempts lost with a worker
        self.size = TaskSize(attempt.cap, settings.task_s)
        self.phase = Phase.SUBMITTING
        self.first, self.total = first, total
        self.next = first  # the next iteration to submit
        self.last_done = start
        self.inflight: deque[InFlight] = deque()
        self.learner_in: Any = None  # what the next graph takes as its learner input
        self.coordinator_in: Any = None  # with a coordinator: the last output, its state whole
        self.league = start.coordinator  # the newest coordinator state the driver holds
        self.last_full: Handle | None = None  # last_done with the coordinator's state, there
        self.linked = 0  # graphs chained on futures since the chain last restarted
        self.unchecked: Delayed | None = None  # the first graph, whose annotations must hold
        self.recoveries = 0  # in all
        self.in_a_row = 0  # since an iteration last finished
        self.lost: BaseException | None = None  # why the head of the window was lost
        self.watchdog = Watchdog(backend, settings.task_timeout)
        self.evals = PeriodicEvals(backend, algo, settings, recorder, self._result)
        self.first_done_at: float | None = None  # when the first graph was recorded
        self.closing = False  # the graph carrying the full state before a re-plan is out
        self.replans = Replans(settings, attempt.since)  # why to re-plan, and each made

    def run(self) -> LearnerOutput:
        """Step until every iteration is recorded; return the last output."""
        steps = {Phase.SUBMITTING: self.submit, Phase.WAITING: self.wait,
                 Phase.RECOVERING: self.recover}
        while self.phase is not Phase.DONE:
            self.phase = steps[self.phase]()
        self.evals.collect(block=True)
        self.recorder.flush()
        return self.last_done

    # ------------------------------------------------------------------ SUBMITTING

    def submit(self) -> Phase:
        """Fill the look-ahead window; then wait for its oldest graph, or finish."""
        if self.closing and not self.inflight:  # drained, with the full state: place again
            self._replan()
        while self._room():
            if not self.inflight:  # restart the chain from data: no lineage behind it
                learner = self.attempt.placement.worker("learner", 0)
                try:
                    if self.algo.make_coordinator is None:
                        self.learner_in = self.backend.scatter(self.last_done, learner)
                    else:  # the coordinator's state to its worker only
                        self.learner_in = self.backend.scatter(
                            without_coordinator_state(self.last_done), learner)
                        self.coordinator_in = self.backend.scatter(
                            self._whole(self.last_done),
                            self.attempt.placement.worker("coordinator", 0))
                except LOST as exc:  # the learner's worker died as its input was sent
                    self.lost = exc
                    return Phase.RECOVERING
                self.linked = 0
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
        if self._time_is_up() or self.next >= self._pause():
            self.total = self.next  # a shorter run: it ends with the graphs in flight
            return False
        if self.closing:  # a re-plan waits for the graphs in flight
            return False
        # A chain at its length waits to drain, then restarts from the driver's copy.
        return not self.inflight or self.linked < max(depth, self.settings.chain)

    def _pause(self) -> int:
        """The iteration the run pauses after (``pause_at``), or its last."""
        pause = self.settings.pause_at
        return self.total if pause is None else min(self.total, pause)

    def _time_is_up(self) -> bool:
        """Whether ``stop_after_s`` has passed since the first graph was recorded."""
        limit = self.settings.stop_after_s
        return (limit is not None and self.first_done_at is not None
                and time.monotonic() - self.first_done_at >= limit)

    def _submit_next(self) -> None:
        """Submit the graph of the next iterations, chained on the one before; before a
        re-plan, one iteration whose output carries the learner's full state (an off-policy
        learner's replay too), as a checkpoint's does."""
        self.closing = self.replans.reason is not None  # only when it drains to re-plan
        count = 1 if self.closing else min(self.size.count, self._pause() - self.next)
        inputs = self._inputs(self.next, count)
        if self.closing:
            inputs = dataclasses.replace(inputs, checkpoint=True)
        graph = self.distribution.iteration(inputs)
        full = None
        if self.algo.make_coordinator is not None:  # one iteration per graph (Attempt.cap)
            graph = coordinated(inputs, graph, self.coordinator_in)
        handle = self.backend.submit(graph)
        if self.next == self.first:
            self.unchecked = graph
        if self.algo.make_coordinator is not None:
            # The coordinator's state stays on its worker: the next coordinator task takes
            # it whole; the next graph, and the driver, take the output without it, except
            # the driver for an iteration it checkpoints (and the run's last).
            self.coordinator_in = self.backend.as_input(handle)
            full = handle
            handle = self.backend.submit(lightened(inputs, self.coordinator_in))
        self.learner_in = self.backend.as_input(handle)
        self.inflight.append(InFlight(self.next, count, handle, full, inputs.checkpoint))
        self.linked += 1
        self.next += count

    def _inputs(self, iteration: int, count: int) -> IterationInputs:
        s = self.settings
        last = iteration + count >= self._pause()  # its output carries the full state
        return IterationInputs(self.algo, self.attempt.placement, self.attempt.run, s.seed,
                               iteration, self.total, self.learner_in, s.deterministic,
                               s.env_retries, count, schedule=s.schedule,
                               checkpoint=(iteration + count) // s.checkpoint_every
                               > iteration // s.checkpoint_every or last)

    # ------------------------------------------------------------------ WAITING

    def wait(self) -> Phase:
        """Wait for the oldest graph in flight and record it."""
        head = self.inflight[0]
        try:
            whole = head.full if head.full is not None and head.fetch_full else None
            output = self._result(whole if whole is not None else head.handle)
        except LOST as exc:
            self.lost = exc
            return Phase.RECOVERING
        self.inflight.popleft()
        if self.last_full is not None:
            self.last_full.release()
        self.last_full = head.full  # fetched when the chain restarts from last_done
        self._record(head, output)
        if self.first_done_at is None:
            self.first_done_at = time.monotonic()
        self._notice_joins()
        if not self.closing:
            self.replans.observe(self.recorder.last_rows,
                                 self._pause() - (head.first + head.count))
            self.settings = with_meta(self.settings, self.replans.settled_meta(self.settings.meta))
        if self.replans.reason is not None and not self._drains_to_replan():
            # the output just recorded carries the learner's full state: let the graphs
            # after it go (at most the next one has started) and go on from it, placed anew
            if self.inflight:
                self.next = self.inflight[0].first
            self.release(evaluations=False)
            self.learner_in = None
            self._replan(drop_old=False)
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
                return self.backend.fetch(handle, fetch)
            except (TimeoutError, UnboundLocalError):
                # UnboundLocalError: on an event loop too busy to answer in time (many thread
                # workers' upkeep), distributed.utils.sync lets the wait's CancelledError pass
                # and returns a result it never set; the task itself is fine: ask again
                if handle.status == "error":  # the task failed: raise its error, not ours
                    own = handle.exception(timeout=fetch)
                    if own is not None:
                        raise own from None
                    raise
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
        check_finite(done.first, output, self.settings.out, self.last_done)
        self.last_done = output
        if output.coordinator:
            self.league = output.coordinator
        self.evals.collect(block=False)  # a finished one goes into this row
        self.size.observe(self.recorder.record(done.first, output))
        for observer in self.settings.observers:
            observer(self.recorder.last_rows[-1], self.attempt.placement)
        every = self.settings.checkpoint_every
        if (done.first + done.count) // every > done.first // every:
            checkpoint_iteration(self.settings, output, self.recorder.counters)
        if self.evals.due(done.first, done.count):
            self.evals.submit(output, self.attempt, self.total)

    # ------------------------------------------------------------------ RE-PLANNING

    def _notice_joins(self) -> None:
        """Workers that joined: a re-plan at the next iteration boundary where placing the
        fragments again would use them (:meth:`Replans.notice_joins`). Not under
        ``--deterministic``: a re-plan restarts the envs, which the same run without the
        join would not."""
        if self.settings.deterministic or self.next >= self.total:
            return
        self.replans.notice_joins(
            self.backend, self.attempt.placement,
            lambda: place(self.backend, self.algo, self.distribution, self.token))

    def _drains_to_replan(self) -> bool:
        """Whether a re-plan waits for the graphs in flight and one more whose output
        carries the full state (an off-policy learner's replay travels only in such
        outputs; free-running actors stop only when their run is dropped), rather than
        letting them go at once."""
        return self.distribution.dynamic or "light-state" in self.algo.capabilities

    def _replan(self, drop_old: bool = True) -> None:
        """Place the fragments again on the workers there are now and go on from the last
        finished iteration, whose output carries the learner's full state: weights,
        optimiser, normalisation and replay carry over exactly, as through a checkpoint.
        Every replica starts its envs afresh (new episodes), under a new run id.
        ``drop_old``: nothing of the old run runs any more (it drained), so its resident
        objects go at once; otherwise with the run's end, as a lost attempt's."""
        (reason, switch), self.closing = self.replans.take(), False
        attempted = switch
        if self.next >= self.total:
            return
        redecider = self.replans.redecider
        before = self.distribution
        if switch is not None:  # a new instance: a distribution may keep its run's state
            self.distribution = get_distribution(switch)
        try:
            placement: Placement | None = place(self.backend, self.algo, self.distribution,
                                                self.token)
        except ValueError as exc:  # a worker left meanwhile: the loss is handled where it
            placement = None  # is seen; a switch that cannot be placed is not made
            if switch is not None and redecider is not None:
                redecider.refused(switch, " ".join(str(exc).split()))
                self.distribution, switch = before, None
        moves = placement_moves(self.attempt.placement, placement) if placement else []
        if switch is not None:
            moves.insert(0, f"--distribution {before.name} -> {switch}")
        if not moves:
            if drop_old:  # nothing was let go: the attempt goes on as it was
                return
            # graphs were let go: their iterations run again, under a new run id
            placement = placement or self.attempt.placement
        old_run = self.attempt.run
        self.earlier.append(old_run)
        self.attempt = Attempt.begin(self.backend, self.algo, self.distribution, placement,
                                     self.settings)
        self.replans.joins_seen = self.attempt.since
        self.size = TaskSize(self.attempt.cap, self.settings.task_s)
        if self.recorder.timeline is not None:
            self.recorder.timeline.run = self.attempt.run
        if drop_old:
            self.backend.run_everywhere(drop_run, old_run)
        self.learner_in = None  # the chain restarts from the driver's copy of the output
        self.replans.made(self.next, reason, moves, placement)
        said = "; ".join(moves) or "the same placement"
        self.recorder.attach({"replan": f"{reason}: {said}"})
        print(f"daskrl: {reason}; placed again from iteration {self.next + 1}: {said}",
              file=sys.stderr)
        if redecider is None:
            return
        workers = len(self.backend.identities())
        if switch is not None:  # timed from its second graph
            redecider.switched(switch, workers)
            self.settings = with_meta(self.settings, self.replans.settled_meta(self.settings.meta))
        elif attempted is None:  # workers joined
            redecider.cluster_changed(reason or "the cluster changed", workers)

    # ------------------------------------------------------------------ RECOVERING

    def recover(self) -> Phase:
        """Drop what is in flight, place again, resubmit from the last finished iteration."""
        lost_at = self.inflight[0].first if self.inflight else self.next
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
        if self.last_full is not None:  # it may have been on the lost worker: the league
            self.last_full.release()  # goes on from its last checkpoint (self.league)
            self.last_full = None
        self.next = lost_at
        self.earlier.append(self.attempt.run)
        placement = self._place_again()
        self.attempt = Attempt.begin(self.backend, self.algo, self.distribution, placement,
                                     self.settings)
        self.size = TaskSize(self.attempt.cap, self.settings.task_s)
        if self.recorder.timeline is not None:
            self.recorder.timeline.run = self.attempt.run
        # placed on the workers there are now: a re-plan owed has nothing left to do, and
        # under --distribution auto another distribution may be faster there
        self.closing = False
        self.replans.cluster_changed(f"iteration {lost_at + 1} lost ({why[:80]})",
                                     self.backend)
        return Phase.SUBMITTING

    def _place_again(self) -> Placement:
        """Place on the workers there are now, waiting a while for replacements to join."""
        membership = self.backend.membership
        deadline = time.monotonic() + self.settings.replan_timeout
        while True:
            cursor = membership.cursor()
            try:
                return place(self.backend, self.algo, self.distribution, self.token)
            except ValueError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterLost(
                        f"the cluster lost the workers this run needs: {exc}; none came "
                        f"back within {self.settings.replan_timeout:g} s (--replan-timeout)"
                    ) from None
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
            if pending.full is not None:
                pending.full.release()
        self.inflight.clear()
        if evaluations:
            self.evals.release()

    def checkpoint(self) -> None:
        """Checkpoint the last finished iteration (nothing when none finished yet)."""
        checkpoint_iteration(self.settings, self._whole(self.last_done), self.recorder.counters)

    def _whole(self, output: LearnerOutput) -> LearnerOutput:
        """``output`` (:attr:`last_done`) with the coordinator's state when it came without
        one: fetched from the coordinator's worker (a chain that restarts, a re-plan, the
        checkpoint at a stop); after a lost worker, the state of the last checkpointed
        iteration, so the run goes on with the league as checkpointed and the learner as it
        last finished."""
        if self.algo.make_coordinator is None or output.coordinator:
            return output
        if self.last_full is not None:
            try:
                whole = self.backend.fetch(self.last_full, 60.0)
            except (*LOST, TimeoutError, OSError):  # OSError: the cluster is gone
                self.last_full = None
            else:
                self.league = whole.coordinator
                return whole
        return dataclasses.replace(output, coordinator=self.league)

    def attempts(self) -> list[str]:
        """Run ids of every attempt, the current one last."""
        return [*self.earlier, self.attempt.run]

