"""The feeder of ``impala``'s learner clock (:mod:`daskrl.distributions.learner_clock`).

A :class:`Feeder` runs in a thread of its own on the learner's worker for the whole run. It
keeps every actor's ``in_flight`` rollouts submitted, takes batches as they land
(:func:`distributed.as_completed`, which fetches and deserialises each in the background),
submits that actor's next rollout before the batch is used (so the actor never waits for the
update), and stages the batch on the learner's device (:mod:`daskrl.distributions.prefetch`)
into a queue of depth :data:`PREFETCH` that the clock's learner thread takes from. It also
moves actors whose worker left to a live one and back (:meth:`Feeder.rehome`).

Why a thread apart from the learner's: the fetch, the deserialisation and the host-to-device
copy of the next batches then overlap the update on the current one, so the learner finds
its next batch ready whenever the actors keep up.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Sequence
from typing import Any, Protocol

from distributed import Future, as_completed

from daskrl.core.algorithm import Algorithm
from daskrl.core.keys import step_key
from daskrl.core.roles import TaskContext
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.distributions.free_running import (
    MEMBERSHIP_S,
    POLL_S,
    ROLLOUT_PRIORITY,
    ActorSpec,
    Arrival,
    Pipeline,
    free_rollout,
    stream_label,
)
from daskrl.distributions.prefetch import DeviceStager, Staged

PREFETCH = 2
"""Batches staged on the learner's device ahead of its update."""


class FeederOwner(Protocol):
    """What a :class:`Feeder` reads of the clock it feeds."""

    closed: bool
    """True once the clock stops: the feeder ends."""
    finished: bool
    """True once the learner has run the run's last iteration: the feeder ends."""
    iteration: int
    """The next iteration the learner runs (a new rollout's context names it)."""


class Feeder:
    """One run's rollouts in flight and the batches staged for its learner.

    Parameters
    ----------
    owner : FeederOwner
        The clock: when to stop, and the iteration new rollouts are submitted for.
    client
        The worker's client.
    ctx : TaskContext
        The learner task's context (run, seed, schedule).
    algo : Algorithm
    actors : sequence of ActorSpec
        Each stream's home worker, rollout resources and actors (one, or a fused group);
        the clock replaces :attr:`actors` when a task places them anew.
    in_flight : int
        Rollouts each actor keeps submitted.
    channel : str
        The publisher's channel the rollouts read their weights from.
    me : str
        The learner's worker name (an actor whose worker left avoids it when others live).
    device : str
        Where batches are staged.
    staging : int
        Batches staged ahead of the learner at most (:data:`PREFETCH`; more when the
        learner takes every batch that has landed).
    """

    def __init__(self, owner: FeederOwner, client: Any, ctx: TaskContext, algo: Algorithm,
                 actors: Sequence[ActorSpec], in_flight: int, channel: str, me: str,
                 device: str, staging: int = PREFETCH) -> None:
        self.owner, self.client, self.ctx, self.algo = owner, client, ctx, algo
        self.actors, self.in_flight, self.channel, self.me = tuple(actors), in_flight, channel, me
        self.pipe = Pipeline(where={a: s.worker for a, s in enumerate(self.actors)})
        self.staged: queue.Queue[tuple[Arrival, Staged]] = queue.Queue(maxsize=staging)
        self.stager = DeviceStager(device)

    def cancel(self) -> None:
        """Cancel the rollouts in flight and stop the publisher (the feeder's end)."""
        self.pipe.cancel(self.client)

    def submit(self, a: int) -> Future:
        """Submit stream ``a``'s next rollout, pinned to its worker."""
        pipe, stream = self.pipe, self.actors[a]
        worker = pipe.where.get(a)
        r = pipe.rounds.get(a, 0)
        pipe.rounds[a] = r + 1
        iteration = self.owner.iteration
        actor_ctx = dataclasses.replace(self.ctx, replica=stream.replicas[0],
                                        iteration=iteration, gpu=0.0)
        fused = stream.replicas if len(stream.replicas) > 1 else ()
        fut = self.client.submit(
            free_rollout, actor_ctx, self.algo, None, self.channel, fused, pure=False,
            resources=stream.resources, workers=[worker] if worker else None,
            # the channel names this clock: a clock started again from the same iteration
            # (a retry) must not reuse the keys of the rollouts its predecessor cancelled
            priority=ROLLOUT_PRIORITY, key=step_key("rollout", a, iteration, r, self.channel))
        pipe.pending[fut.key] = (Arrival(a, len(stream.replicas), stream_label(stream.replicas)),
                                 fut)
        return fut

    def rehome(self) -> bool:
        """Move actors whose worker left to a live one (back home once it is back); their
        rollouts pinned to the lost worker are submitted again. True when any moved."""
        pipe, me = self.pipe, self.me
        try:
            info = scheduler_workers(self.client)
        except OSError:  # a slow answer: nothing moves now, the next pass asks again
            return False
        live = {str(w["name"]) for w in info.values()}
        addresses = {str(w["name"]): a for a, w in info.items()}
        restarted = {n for n, a in pipe.seen.items() if n in live and addresses[n] != a}
        pipe.seen = addresses
        homes = {a: s.worker for a, s in enumerate(self.actors)}
        moved = False
        for a, home in homes.items():
            if home is None:
                continue
            now = pipe.where.get(a)
            want = home if home in live else (now if now in live else None)
            if want is None:
                others = sorted({w for w in homes.values() if w in live} - {me})
                others = others or sorted(live - {me})
                want = min(others, key=lambda w: list(pipe.where.values()).count(w),
                           default=None)
            if want == now and now not in restarted:
                continue
            pipe.where[a] = want
            if now not in live or now in restarted:  # its rollouts wait for a lost process
                lost = [k for k, (arrival, _) in pipe.pending.items() if arrival.stream == a]
                self.client.cancel([pipe.pending.pop(k)[1] for k in lost])
                for _ in lost:
                    self.submit(a)
                moved = True
        return moved

    def run(self) -> None:
        """The feeder thread: keep the rollouts in flight; stage each batch that lands."""
        pipe = self.pipe
        self.rehome()  # where every worker is now (the addresses its pins become)
        for a in range(len(self.actors)):
            while pipe.in_flight(a) < self.in_flight:
                self.submit(a)
        arrivals = as_completed([f for _, f in pipe.pending.values()], with_results=True)
        checked = time.monotonic()
        while not (self.owner.closed or self.owner.finished):
            if time.monotonic() - checked > MEMBERSHIP_S:
                if self.rehome():
                    arrivals = as_completed([f for _, f in pipe.pending.values()],
                                            with_results=True)
                checked = time.monotonic()
            if not arrivals.has_ready():
                time.sleep(POLL_S)
                continue
            fut, batch = next(arrivals)
            if fut.key not in pipe.pending:  # cancelled by a rehome meanwhile
                continue
            landed, _ = pipe.pending.pop(fut.key)
            arrivals.add(self.submit(landed.stream))  # its next rollout, before this update
            staged = self.stager(batch)
            while not (self.owner.closed or self.owner.finished):
                try:
                    self.staged.put((landed, staged), timeout=0.1)
                    break
                except queue.Full:
                    continue
