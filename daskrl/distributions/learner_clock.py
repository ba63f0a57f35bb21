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

from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.roles import TaskContext, pick_device, resident_learner
from daskrl.core.worker_state import drop_key, resident
from daskrl.distributions.async_grads import on_worker
from daskrl.distributions.clock_feeder import PREFETCH, Feeder
from daskrl.distributions.free_running import (
    ActorSpec,
    IterationRecord,
    Publisher,
    free_rollout,
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
    actors, in_flight, max_lag, batch
        As :func:`impala_learn`.
    """

    def __init__(self, client: Any, ctx: TaskContext, algo: Algorithm, learner: Any,
                 version: int, actors: Sequence[ActorSpec], in_flight: int,
                 max_lag: int | None, batch: int = 1) -> None:
        self.client, self.ctx, self.algo, self.learner = client, ctx, algo, learner
        self.max_lag, self.batch = max_lag, batch
        self.n = len(actors)
        self.iteration = ctx.iteration  # the next iteration the learner runs
        self.delivered = (ctx.iteration, version)  # where the next task must start
        self.base = (ctx.iteration, version)
        self.updates = version * (self.n // batch)  # weights versions count updates
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
        self.feeder = Feeder(self, client, ctx, algo, actors, in_flight, self.channel,
                             str(self.me.name), pick_device(ctx.gpu))
        self.pipe = self.feeder.pipe
        self.pipe.publisher = Publisher(client, self.channel, self.me.address)
        self.pipe.publisher.publish_now(self.updates, learner.weights())
        self.threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True,
                                         name=f"impala-{name}-{ctx.run}")
                        for name, fn in (("feed", self.feeder.run), ("learn", self._learn))]
        for thread in self.threads:
            thread.start()

    # ------------------------------------------------------------ the task's side
    def matches(self, ctx: TaskContext, learner_in: LearnerOutput, batch: int) -> bool:
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

    def _next_batch(self) -> tuple[int, Staged]:
        while True:
            if self.closed:
                raise ClockClosed("closed")
            if self.error is not None:
                raise self.error
            try:
                return self.feeder.staged.get(timeout=0.1)
            except queue.Empty:
                continue

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
            used = 0
            while used < n:
                group: list[tuple[int, dict[str, Any], int]] = []
                while len(group) < self.batch:  # the update's batches, as they land
                    t0 = time.time()
                    a, staged = self._next_batch()
                    batch = staged.ready()
                    rec.wait_s += time.time() - t0
                    lag = self.updates - int(batch["stats"]["policy_version"])
                    if self.max_lag is not None and lag > self.max_lag:
                        rec.dropped += 1
                        continue
                    group.append((a, batch, lag))
                t1 = time.time()
                rec.metrics = learner.update([b for _, b, _ in group],
                                             min(1.0, ctx.progress(it + used / n)))
                self.updates += 1
                t2 = time.time()
                publisher.offer(self.updates, learner.weights())
                rec.update_s += t2 - t1
                rec.publish_s += time.time() - t2
                used += len(group)
                for a, batch, lag in group:
                    rec.record(batch["stats"], a, lag)
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


def _clock(client: Any, ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
           actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None, batch: int
           ) -> tuple[LearnerClock, bool]:
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
                         in_flight, max_lag, batch)
    clocks[ctx.run] = clock
    key = (ctx.run, "impala", "clock")
    if resident(key, lambda: clock)[0] is not clock:  # an earlier attempt's, closed above
        drop_key(key)
        resident(key, lambda: clock)  # drop_run closes it
    return clock, built


def impala_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                 actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None,
                 count: int = 1, batch: int = 1) -> LearnerOutput:
    """Role ``learner``: ``count`` iterations of ``len(actors) / batch`` updates, each on
    ``batch`` batches as they land, run by the run's :class:`LearnerClock` on this worker.

    Outside a Dask worker (``--scheduler sync``) the actors take turns in this process,
    each acting with the newest weights (lag 0).
    """
    if not on_worker():
        return _in_turn(ctx, algo, learner_in, len(actors), count, batch)
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


def _in_turn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, n: int,
             count: int, batch: int = 1) -> LearnerOutput:
    """The actors in turn, in this thread (no Dask worker); an update after every
    ``batch`` of them."""
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    updates = learner_in.version * (n // batch)
    history: list[dict[str, Any]] = []
    for j in range(count):
        rec = IterationRecord(time.time())
        for first in range(0, n, batch):
            current = LearnerOutput(updates, {}, learner.weights())
            t0 = time.time()  # the learner waits while the actors step, in this thread
            batches = [free_rollout(dataclasses.replace(ctx, replica=a, gpu=0.0,
                                                        iteration=ctx.iteration + j),
                                    algo, current) for a in range(first, first + batch)]
            t1 = time.time()
            rec.wait_s += t1 - t0
            rec.metrics = learner.update(
                batches, min(1.0, ctx.progress(ctx.iteration + j + first / n)))
            rec.update_s += time.time() - t1
            updates += 1
            for a, b in zip(range(first, first + batch), batches, strict=True):
                rec.record(b["stats"], a, 0)
        history.append(rec.finish(updates, n))
    holder["version"] = learner_in.version + count
    metrics = history[-1]
    metrics["learner_built"] = built
    return LearnerOutput(learner_in.version + count, learner.state_dict(), learner.weights(),
                         metrics, history=history[:-1])
