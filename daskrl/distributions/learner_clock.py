"""``impala``'s learner on its own clock: a resident learner loop that no task boundary stops.

The learner task of :mod:`daskrl.distributions.impala` does not run the updates itself. The
first one starts a :class:`LearnerClock` in its worker's resident state; the clock runs two
threads of its own for the whole run, and every learner task (the first included) only asks
it for iterations ``[i, i + count)`` and waits for them seceded
(:func:`distributed.secede`), holding no thread slot of the worker:

- the *feeder* (:class:`~daskrl.distributions.clock_feeder.Feeder`) keeps every actor's
  ``in_flight`` rollouts submitted, takes batches as they land and stages each on the
  learner's device (:mod:`daskrl.distributions.prefetch`: pinned memory and a non-blocking
  copy on CUDA) into a queue of depth :data:`PREFETCH`;
- the *learner* takes staged batches and updates on each, publishing every new weights
  version (:class:`~daskrl.distributions.free_running.Publisher`).

Why a resident loop rather than a learner task that secedes and loops over batches (the
previous design): a task that secedes must still *start*, and each learner task starts on a
worker thread that a rollout may hold (one thread per worker, actors on the learner's
worker), after the driver has seen the previous task end, so the learner stood still at
every task boundary (``learner_idle_s``: about a rollout's time per task with a 1 ms/step
env). The resident loop keeps updating while the next task waits for a thread: the clock
may run up to one task's worth of iterations (at least :data:`AHEAD`) beyond the last task
asked for (so a late task finds its iterations done: ``learner_ahead`` in the metrics counts
them) and no further (a stopped driver does not leave it training). A ``distributed.Queue``
between feeder and learner was not used: the batches would pass through the scheduler (one
more hop, and no recomputation of a batch lost with a worker); futures fetched by
``as_completed`` go worker to worker.

The driver's contract is kept: a task returns ``LearnerOutput(learner_in.version + count,
state, weights, metrics, history)``, the state being the learner's as it was after
iteration ``i + count - 1`` (the clock snapshots it there, also when it has run beyond). When
the learner has run the run's last iteration the actors stop, and the clock stays open until
the task that takes that iteration has it. A task whose ``learner_in`` is not where the
clock delivered last (a resume, a retry from an earlier output, a new run) closes the clock
and starts a fresh one from ``learner_in``. The clock closes when the run's last iteration is
delivered, when the run is dropped from the worker (``drop_run`` closes resident objects), or
after :data:`IDLE_S` without a task.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from distributed import get_client, get_worker, secede

from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput
from daskrl.core.roles import TaskContext, pick_device, resident_learner
from daskrl.core.worker_state import drop_key, resident
from daskrl.distributions.async_grads import on_worker
from daskrl.distributions.clock_feeder import PREFETCH, Feeder
from daskrl.distributions.free_running import (
    ActorSpec,
    Arrival,
    IterationRecord,
    Publisher,
    free_rollout,
    stream_label,
)
from daskrl.distributions.prefetch import Staged

__all__ = ["AHEAD", "IDLE_S", "PREFETCH", "ClockClosed", "Feeder", "LearnerClock",
           "impala_learn"]

AHEAD = 4
"""The least iterations the clock may run past the end of the last task asked for (one task's
worth when tasks are longer): the driver sizes tasks to ``RunSettings.task_s``, and with
tasks of one or two iterations the next task, waiting for a worker thread and the driver,
would often find the learner stopped at a bound of one task."""
IDLE_S = 600.0
"""A clock that no task asked anything of for this long closes (its driver is gone)."""


class ClockClosed(RuntimeError):
    """The clock was closed while a task waited on it."""


class LearnerClock:
    """A run's learner loop on the learner's worker (see the module docstring).

    Parameters
    ----------
    client
        The worker's client (the feeder and the publisher submit and publish with it).
    ctx : TaskContext
        The first learner task's context (run, seed, schedule; ``iteration`` = where the
        clock starts).
    algo : Algorithm
    learner
        The resident learner, in step with ``version``.
    version : int
        The ``LearnerOutput`` version the clock starts from.
    updates : int
        The weights version it starts from (:func:`weights_version`).
    actors, in_flight, max_lag, batch
        As :func:`impala_learn`.
    """

    def __init__(self, client: Any, ctx: TaskContext, algo: Algorithm, learner: Any,
                 version: int, actors: Sequence[ActorSpec], in_flight: int,
                 max_lag: int | None, batch: int | None = 1, updates: int = 0) -> None:
        self.client, self.ctx, self.algo, self.learner = client, ctx, algo, learner
        self.max_lag, self.batch = max_lag, batch
        self.n = algo.num_actors  # actors' rollouts per iteration
        self.iteration = ctx.iteration  # the next iteration the learner runs
        self.delivered = (ctx.iteration, version)  # where the next task must start
        self.base = (ctx.iteration, version)
        self.updates = updates  # weights versions count updates
        self.horizon = ctx.iteration  # the learner runs iterations below this
        self.wanted = ctx.iteration  # the end of the latest task's iterations
        self.records: dict[int, dict[str, Any]] = {}
        self.snapshots: dict[int, dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.closed = False
        self.finished = False  # the run's last iteration is run: the actors stop
        self.error: BaseException | None = None
        self.asked = time.monotonic()
        self.me = get_worker()
        # a channel of its own: a closed clock's variables are emptied by a request that may
        # reach the scheduler after this one set them. The run stays last: rollout keys end
        # in the channel, and the watchdog and the timeline know a run's tasks by "-<run>"
        self.channel = f"{uuid.uuid4().hex[:8]}-{ctx.run}"
        # batch=auto takes every batch that has landed: stage them all
        staging = PREFETCH if batch else max(PREFETCH, len(actors) * in_flight)
        self.feeder = Feeder(self, client, ctx, algo, actors, in_flight, self.channel,
                             str(self.me.name), pick_device(ctx.gpu), staging)
        self.pipe = self.feeder.pipe
        self.pipe.publisher = Publisher(client, self.channel, self.me.address)
        self.pipe.publisher.publish_now(self.updates, learner.weights())
        self.threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True,
                                         name=f"impala-{name}-{ctx.run}")
                        for name, fn in (("feed", self.feeder.run), ("learn", self._learn))]
        for thread in self.threads:
            thread.start()

    # ------------------------------------------------------------ the task's side
    def matches(self, ctx: TaskContext, learner_in: LearnerOutput, batch: int | None) -> bool:
        """True when a task from ``learner_in`` at ``ctx.iteration`` continues this clock."""
        return (not self.closed and self.error is None and batch == self.batch
                and self.delivered == (ctx.iteration, learner_in.version))

    def ask(self, ctx: TaskContext, count: int, actors: Sequence[ActorSpec]
            ) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """Wait for iterations ``[ctx.iteration, ctx.iteration + count)``; return their
        metrics, the learner's state after them and how many of them the clock had
        finished before it was asked."""
        end = ctx.iteration + count
        with self.cond:
            self.feeder.actors = tuple(actors)  # the placement of this task (a resize moves them)
            self.asked = time.monotonic()
            ahead = min(count, self.iteration - ctx.iteration)
            self.wanted = end
            self.horizon = min(ctx.num_iterations, end + max(count, AHEAD))
            self.cond.notify_all()
            while self.iteration < end or end not in self.snapshots:
                if self.error is not None:
                    raise self.error
                if self.closed:
                    raise ClockClosed(f"the learner clock of run {ctx.run} was closed")
                self.cond.wait(timeout=1.0)
            history = [self.records.pop(i) for i in range(ctx.iteration, end)]
            state = self.snapshots.pop(end)
            for i in [i for i in self.snapshots if i < end]:
                del self.snapshots[i]
            self.delivered = (end, self.delivered[1] + count)
        return history, state, max(0, ahead)

    def close(self, wait: bool = False) -> None:
        """Stop both threads; the feeder cancels the rollouts in flight and stops publishing
        as it ends. ``wait``: until it has (not from the worker's event loop, where
        ``drop_run`` calls this: the cancelling needs that loop)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if wait:
            for thread in self.threads:
                if thread is not threading.current_thread():
                    thread.join(timeout=60)

    # ------------------------------------------------------------ the threads
    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - raised in the task that waits
            with self.cond:
                if not self.closed:
                    self.error = exc
                self.closed = True  # the other thread stops too
                self.cond.notify_all()
        finally:
            if fn == self.feeder.run:  # the rollouts in flight and the publisher end with it
                self.feeder.cancel()

    def _next_batch(self, wait: bool = True) -> tuple[Arrival, Staged] | None:
        """The next staged batch (waiting for one; ``wait=False``: None when none is)."""
        while True:
            if self.closed:
                raise ClockClosed("closed")
            if self.error is not None:
                raise self.error
            try:
                return self.feeder.staged.get(timeout=0.1) if wait else \
                    self.feeder.staged.get_nowait()
            except queue.Empty:
                if not wait:
                    return None

    def _take(self, group: list[tuple[Arrival, dict[str, Any], int]], rec: IterationRecord,
              item: tuple[Arrival, Staged] | None) -> int:
        """Add a staged batch to the update's ``group`` unless it is more than ``max_lag``
        updates old (then it is dropped); the actors' rollouts it adds."""
        assert item is not None
        landed, staged = item
        batch = staged.ready()
        lag = self.updates - int(batch["stats"]["policy_version"])
        if self.max_lag is not None and lag > self.max_lag:
            rec.dropped += 1
            return 0
        group.append((landed, batch, lag))
        return landed.actors

    def _learn(self) -> None:
        """Run iterations while below the horizon; snapshot where a task may end."""
        n, ctx, learner = self.n, self.ctx, self.learner
        publisher = self.pipe.publisher
        assert publisher is not None
        last_end = time.time()
        while True:
            with self.cond:
                while self.iteration >= self.horizon and not self.closed:
                    if time.monotonic() - self.asked > IDLE_S:
                        self.closed = True  # nobody asks any more: the driver is gone
                        self.cond.notify_all()
                        break
                    self.cond.wait(timeout=1.0)
                if self.closed:
                    break
                it = self.iteration
            rec = IterationRecord(last_end)
            used = 0  # actors' rollouts this iteration has used
            while used < n:
                group: list[tuple[Arrival, dict[str, Any], int]] = []
                covered = 0
                while covered < (self.batch or 1):  # the update's batches, as they land
                    t0 = time.time()
                    covered += self._take(group, rec, self._next_batch())
                    rec.wait_s += time.time() - t0
                while self.batch is None and used + covered < n:  # auto: all that landed
                    item = self._next_batch(wait=False)
                    if item is None:
                        break
                    covered += self._take(group, rec, item)
                t1 = time.time()
                rec.metrics = learner.update([b for _, b, _ in group],
                                             min(1.0, ctx.progress(it + used / n)))
                self.updates += 1
                t2 = time.time()
                publisher.offer(self.updates, learner.weights())
                rec.update_s += t2 - t1
                rec.publish_s += time.time() - t2
                used += covered
                for landed, batch, lag in group:
                    rec.record(batch["stats"], landed.label, lag)
            metrics = rec.finish(self.updates, n, worker=str(self.me.name))
            metrics["learner_clock"] = self.channel  # a run's clocks: one unless restarted
            last_end = time.time()
            snapshot = learner.state_dict() if it + 1 >= self.wanted else None
            with self.cond:
                self.records[it] = metrics
                if snapshot is not None:
                    self.snapshots[it + 1] = snapshot
                self.iteration = it + 1
                self.cond.notify_all()
            if it + 1 >= ctx.num_iterations:  # the run's last: stop the actors
                # ... but stay open for the tasks not yet asked (the clock may run ahead to
                # the end of the run): the task that takes the last iteration closes it, and
                # this thread waits at the horizon above until then (or IDLE_S)
                with self.cond:
                    self.finished = True
                    self.cond.notify_all()


def weights_version(learner_in: LearnerOutput, algo: Algorithm, batch: int | None) -> int:
    """The updates the learner has made by ``learner_in``: as its last iteration recorded
    them, else (a checkpoint without metrics) ``num_actors / batch`` per iteration.

    Fused groups and ``batch=auto`` make a varying number of updates per iteration, so the
    count travels with the output rather than being derived from its iterations.

    Examples
    --------
    >>> algo = Algorithm("a", print, print, print, num_steps=1, num_actors=4)
    >>> weights_version(LearnerOutput(3, {}, {}, {"weights_version": 7}), algo, 1)
    7
    >>> weights_version(LearnerOutput(3, {}, {}), algo, 2)
    6
    """
    recorded = learner_in.metrics.get("weights_version")
    if recorded is not None:
        return int(recorded)
    return learner_in.version * (algo.num_actors // (batch or 1))


def _clock(client: Any, ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
           actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None,
           batch: int | None) -> tuple[LearnerClock, bool]:
    """The run's clock on this worker, continuing or (re)started from ``learner_in``."""
    clocks, _ = resident(("impala", "clocks"), dict)
    clock = clocks.get(ctx.run)
    if clock is not None and clock.matches(ctx, learner_in, batch):
        return clock, False
    for old in list(clocks.values()):  # an earlier run or attempt: let go of what it left
        old.close(wait=True)  # before this run's publisher sets its variables again
    clocks.clear()
    holder, built = resident_learner(ctx, algo, learner_in)
    holder["version"] = None  # the clock moves it on: a later resident_learner reloads
    clock = LearnerClock(client, ctx, algo, holder["learner"], learner_in.version, actors,
                         in_flight, max_lag, batch, weights_version(learner_in, algo, batch))
    clocks[ctx.run] = clock
    key = (ctx.run, "impala", "clock")
    if resident(key, lambda: clock)[0] is not clock:  # an earlier attempt's, closed above
        drop_key(key)
        resident(key, lambda: clock)  # drop_run closes it
    return clock, built


def impala_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                 actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None,
                 count: int = 1, batch: int | None = 1) -> LearnerOutput:
    """Role ``learner``: ``count`` iterations of ``num_actors`` actors' rollouts, an update
    on each ``batch`` of them as they land (``None``: on every batch that has landed),
    run by the run's :class:`LearnerClock` on this worker; ``actors`` are the rollout
    streams (an actor each, or fused groups of co-located actors).

    Outside a Dask worker (``--scheduler sync``) the actors take turns in this process,
    each acting with the newest weights (lag 0).
    """
    if not on_worker():
        return _in_turn(ctx, algo, learner_in, actors, count, batch)
    client = get_client()
    secede()  # wait without holding a worker thread: rollouts may use it
    clock, built = _clock(client, ctx, algo, learner_in, actors, in_flight, max_lag, batch)
    history, state, ahead = clock.ask(ctx, count, actors)
    if ctx.iteration + count >= ctx.num_iterations:
        clock.close()
    metrics = history[-1]
    metrics.update(learner_built=built, learner_ahead=ahead)
    return LearnerOutput(learner_in.version + count, state, state["model"], metrics,
                         history=history[:-1])


def _in_turn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
             streams: Sequence[ActorSpec], count: int, batch: int | None = 1) -> LearnerOutput:
    """The actors' streams in turn, in this thread (no Dask worker); an update after every
    ``batch`` actors' rollouts (``None``, auto: after each stream's, all that has landed)."""
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    n = algo.num_actors
    updates = weights_version(learner_in, algo, batch)
    history: list[dict[str, Any]] = []
    for j in range(count):
        rec = IterationRecord(time.time())
        waiting, used = list(streams), 0
        while waiting:
            current = LearnerOutput(updates, {}, learner.weights())
            t0 = time.time()  # the learner waits while the actors step, in this thread
            taken: list[tuple[ActorSpec, Batch]] = []
            while waiting and sum(len(s.replicas) for s, _ in taken) < (batch or 1):
                stream = waiting.pop(0)
                fused = stream.replicas if len(stream.replicas) > 1 else ()
                actor_ctx = dataclasses.replace(ctx, replica=stream.replicas[0], gpu=0.0,
                                                iteration=ctx.iteration + j)
                taken.append((stream, free_rollout(actor_ctx, algo, current, None, fused)))
            t1 = time.time()
            rec.wait_s += t1 - t0
            rec.metrics = learner.update([b for _, b in taken],
                                         min(1.0, ctx.progress(ctx.iteration + j + used / n)))
            rec.update_s += time.time() - t1
            updates += 1
            for stream, b in taken:
                used += len(stream.replicas)
                rec.record(b["stats"], stream_label(stream.replicas), 0)
        history.append(rec.finish(updates, n))
    holder["version"] = learner_in.version + count
    metrics = history[-1]
    metrics["learner_built"] = built
    return LearnerOutput(learner_in.version + count, learner.state_dict(), learner.weights(),
                         metrics, history=history[:-1])
