"""The machinery of ``impala``'s free-running actors (:mod:`daskrl.distributions.impala`):
the rollout task, the weights' publication by version, the rollouts in flight and what an
iteration records. The learner's loop is :mod:`daskrl.distributions.learner_clock`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, NamedTuple

import numpy as np
from distributed import Future, Variable, get_client
from distributed.client import ClosedClientError

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput, Weights
from daskrl.core.roles import TaskContext, merge_stats
from daskrl.core.tensor_pickle import from_bytes, to_bytes
from daskrl.core.worker_state import resident, worker_name


class ActorSpec(NamedTuple):
    """A stream of free-running rollouts: the worker its tasks are pinned to, their Dask
    resources, and the actors it steps: one, or several co-located actors fused into one
    batched actor (``impala:group=K``: one task and one forward pass per step for all of
    them)."""

    worker: str | None
    resources: dict[str, float]
    replicas: tuple[int, ...]


class Arrival(NamedTuple):
    """Where a rollout comes from: its stream, how many actors' rollouts it holds, and how
    the metrics name its stream (``policy_lags``). It travels with the batch to the
    learner; its future stays in :attr:`Pipeline.pending` (a batch waiting to be used must
    not keep the task alive on the scheduler once the run cancels its rollouts)."""

    stream: int
    actors: int
    label: str


def stream_label(replicas: tuple[int, ...]) -> str:
    """How ``policy_lags`` names a stream: its actor, or its fused actors' first and last.

    Examples
    --------
    >>> stream_label((3,)), stream_label((0, 2, 4))
    ('3', '0..4')
    """
    return str(replicas[0]) if len(replicas) == 1 else f"{replicas[0]}..{replicas[-1]}"


POLL_S = 0.002
"""How often a learner waiting for a batch looks whether one landed."""
ROLLOUT_PRIORITY = -(10**9)
"""Rollouts yield a worker's next free thread to the learner's next task (whose priority is
minus its iteration): on a worker shared with an actor, that task waits for at most the
rollout running there."""
MEMBERSHIP_S = 0.5
"""How often the learner asks the scheduler whether an actor's worker left or came back."""


class ChannelClosed(RuntimeError):
    """A rollout asked for weights after its learner stopped publishing (it was cancelled as
    the learner's clock closed, and nobody waits for its result)."""

    @classmethod
    def of(cls, run: str, channel: str) -> ChannelClosed:
        """The error for ``run``'s closed ``channel``."""
        return cls(f"the learner of run {run} closed its weights channel {channel}")


def channel_name(run: str, what: str = "weights") -> str:
    """The name of the :class:`distributed.Variable` that holds a run's newest weights
    (``what="weights"``: a future of ``(version, weights)``) or their version
    (``"version"``).

    Examples
    --------
    >>> channel_name("1a2b3c4d"), channel_name("1a2b3c4d", "version")
    ('impala-weights-1a2b3c4d', 'impala-version-1a2b3c4d')
    """
    return f"impala-{what}-{run}"


def newest_weights(run: str, channel: str | None = None) -> tuple[int, Weights]:
    """The newest ``(version, weights)`` the learner of ``run`` published on ``channel``
    (default: the run's id), fetched only when this worker does not hold that version yet (a
    look-up of the version otherwise)."""
    client = get_client()
    channel = channel or run
    version = Variable(channel_name(channel, "version"), client=client).get(timeout=60)
    if version is None:
        raise ChannelClosed.of(run, channel)
    cache, _ = resident((run, "impala", "weights", channel), dict)
    if cache.get("version") != version:
        future = Variable(channel_name(channel), client=client).get(timeout=60)
        if future is None:
            raise ChannelClosed.of(run, channel)
        got, payload = future.result(timeout=60)
        cache.update(version=got, value=(got, from_bytes(payload)))
    return cache["value"]


def free_rollout(ctx: TaskContext, algo: Algorithm, fallback: LearnerOutput | None = None,
                 channel: str | None = None, replicas: tuple[int, ...] = ()) -> Batch:
    """Role ``rollout``: one rollout of actor ``ctx.replica`` (or of the co-located
    ``replicas`` fused into one actor) with the newest weights published on ``channel``
    (:func:`newest_weights`; ``fallback``'s outside a Dask worker). One actor's rollouts run
    one at a time on a worker, whatever its thread count: they step the same envs."""
    if fallback is None:
        version, weights = newest_weights(ctx.run, channel)
        fallback = LearnerOutput(version, {}, weights)
    ident = replicas if len(replicas) > 1 else ctx.replica
    lock, _ = resident((ctx.run, "impala", "lock", ident), threading.Lock)
    with lock:
        return roles.rollout(ctx, algo, fallback, algo.num_steps, replicas)


class Publisher:
    """Publishes a learner's newest weights from a thread of its own, so that an update does
    not wait on the scheduler: :meth:`offer` hands over ``(version, weights)`` and returns;
    the thread scatters the newest one offered (older ones it had no time for are skipped)
    to the learner's worker and sets the run's variables to it."""

    def __init__(self, client: Any, channel: str, address: str) -> None:
        self.client, self.address = client, address
        self.weights = Variable(channel_name(channel), client=client)
        self.version = Variable(channel_name(channel, "version"), client=client)
        self.cond = threading.Condition()
        self.latest: tuple[int, Weights] | None = None
        self.published: Future | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=f"impala-publish-{channel}",
                                       daemon=True)
        self.thread.start()

    def publish_now(self, version: int, weights: Weights) -> None:
        """Publish in this thread (the first weights, before any rollout asks for them).

        The weights go out pickled once (:func:`~daskrl.core.tensor_pickle.to_bytes`): every
        actor's worker fetches each version, and Dask would serialise a dict of tensors anew
        for each fetch, on the learner's worker, whose event loop must also take the batches.
        """
        # one future for the pair (scatter would split a bare tuple into two)
        future = self.client.scatter([(version, to_bytes(weights))], workers=[self.address],
                                     hash=False)[0]
        self.weights.set(future)
        self.version.set(version)
        self.published = future  # the variable holds it too; this keeps it while replaced

    def offer(self, version: int, weights: Weights) -> None:
        """Publish ``(version, weights)`` soon, in the publishing thread."""
        if self.error is not None:
            raise self.error
        with self.cond:
            self.latest = (version, weights)
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.latest is not None or self.closed)
                if self.closed:
                    return
                item, self.latest = self.latest, None
            try:
                assert item is not None
                self.publish_now(*item)
            except BaseException as exc:  # noqa: BLE001 - raised by the next offer()
                self.error = exc
                return

    def close(self) -> None:
        """Stop the thread and empty the run's variables (the run ends): the scheduler lets
        go of the last weights once every rollout that read them has said so.

        Why the variables are set to ``None`` rather than deleted: ``Variable.delete`` is a
        message on this worker's client stream, and the scheduler handles it by waiting
        until every reader of the variable's future has confirmed it (Dask 2026.8,
        ``VariableExtension.release``). A rollout on this same worker confirms through that
        same stream, behind the delete, so the stream stalled for good: every later
        submission from this worker (a new clock's rollouts) never reached the scheduler.
        ``Variable.set`` is a request of its own, and the scheduler releases the old future
        in the background. What stays on the scheduler is the channel's two names, holding
        ``None`` (a few bytes per clock).
        """
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(timeout=30)
        for var in (self.version, self.weights):  # the version first: readers look at it
            try:
                var.set(None, timeout=10)
            except Exception:  # noqa: BLE001 - the scheduler may be going away
                pass


@dataclasses.dataclass
class Pipeline:
    """The learner's side of a run's free-running actors, resident on the learner's worker
    across learner tasks: the rollouts in flight and the published weights."""

    where: dict[int, str | None] = dataclasses.field(default_factory=dict)
    """Stream -> the worker its next rollouts are pinned to."""
    pending: dict[str, tuple[Arrival, Future]] = dataclasses.field(default_factory=dict)
    rounds: dict[int, int] = dataclasses.field(default_factory=dict)
    publisher: Publisher | None = None
    last_end: float | None = None
    seen: dict[str, str] = dataclasses.field(default_factory=dict)
    """Worker name -> the address it had at the last look: the scheduler turns a rollout's
    pin by name into that address, so a worker back under its name (a nanny's restart) at
    another address does not receive the rollouts pinned to its lost process."""

    def in_flight(self, stream: int) -> int:
        """Rollouts of ``stream`` submitted and not yet consumed."""
        return sum(1 for arrival, _ in self.pending.values() if arrival.stream == stream)

    def cancel(self, client: Any) -> None:
        """Let go of every rollout in flight and stop publishing (the run ends)."""
        futures = [f for _, f in self.pending.values()]
        self.pending.clear()
        try:
            if futures:
                client.cancel(futures)
        except (RuntimeError, ClosedClientError):
            pass  # the worker's client closed first (the cluster is going): they end with it
        finally:
            if self.publisher is not None:
                self.publisher.close()
                self.publisher = None


class IterationRecord:
    """What one iteration of the learner records: its batches, lags, waits and metrics."""

    def __init__(self, begin: float) -> None:
        self.begin, self.wait_s, self.publish_s, self.update_s = begin, 0.0, 0.0, 0.0
        self.stats: list[dict[str, Any]] = []
        self.lags: list[str] = []
        self.lag_values: list[int] = []
        self.dropped = 0
        self.metrics: dict[str, Any] = {}

    def record(self, stats: dict[str, Any], actor: int | str, lag: int) -> None:
        """One batch used: its stats, and its actor's (or stream's) lag in updates."""
        self.stats.append(stats)
        self.lags.append(f"{actor}:{lag}")
        self.lag_values.append(lag)

    def finish(self, updates: int, num_actors: int, worker: str | None = None
               ) -> dict[str, Any]:
        """The iteration's metrics (``worker``: the learner's worker name, default this
        task's)."""
        end = time.time()
        wall = max(end - self.begin, 1e-9)
        # busy: updating and handing the weights over; the rest of the wall time the learner
        # waited for a batch, or for a task to ask for more iterations
        busy = min(wall, self.update_s + self.publish_s)
        out = dict(self.metrics)
        out.update(merge_stats(self.stats))
        rollout_s = float(np.mean([s["t_end"] - s["t_start"] for s in self.stats]))
        per_update = busy / len(self.stats)
        out.update(
            policy_lag=float(np.mean(self.lag_values)), policy_lag_max=int(max(self.lag_values)),
            policy_lags=" ".join(self.lags), batches_dropped=self.dropped, weights_version=updates,
            learner_busy=busy / wall, learner_wait_s=self.wait_s,
            learner_idle_s=max(0.0, wall - busy - self.wait_s),
            learner_worker=worker if worker is not None else worker_name(),
            learner_update_s=self.update_s, learner_publish_s=self.publish_s,
            # each actor, on a core of its own, lands a batch per rollout: this many keep an
            # update's worth of batches coming
            actors_for_busy=max(1, int(np.ceil(rollout_s / max(per_update, 1e-9)))),
            learn_t_start=end - busy, learn_t_end=end, rollout_s=rollout_s)
        return out
