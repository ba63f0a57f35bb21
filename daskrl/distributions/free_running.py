"""The machinery of ``impala``'s free-running actors (:mod:`daskrl.distributions.impala`):
the rollout task, the weights' publication by version, and the learner task's loop.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed import Future, Variable, as_completed, get_client, get_worker, worker_client

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput, Weights
from daskrl.core.roles import TaskContext, merge_stats, resident_learner
from daskrl.core.worker_state import resident, worker_name
from daskrl.distributions.async_grads import on_worker
from daskrl.distributions.base import step_key

ActorSpec = tuple[str | None, dict[str, float]]
"""An actor's worker name and the Dask resources of its rollouts."""

POLL_S = 0.002
"""How often a learner waiting for a batch looks whether one landed."""
ROLLOUT_PRIORITY = -(10**9)
"""Rollouts yield a worker's next free thread to the learner's next task (whose priority is
minus its iteration): on a worker shared with an actor, that task waits for at most the
rollout running there."""
MEMBERSHIP_S = 0.5
"""How often the learner asks the scheduler whether an actor's worker left or came back."""


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


def newest_weights(run: str) -> tuple[int, Weights]:
    """The newest ``(version, weights)`` the learner of ``run`` published, fetched only when
    this worker does not hold that version yet (a look-up of the version otherwise)."""
    client = get_client()
    version = Variable(channel_name(run, "version"), client=client).get(timeout=60)
    cache, _ = resident((run, "impala", "weights"), dict)
    if cache.get("version") != version:
        value = Variable(channel_name(run), client=client).get(timeout=60).result(timeout=60)
        cache.update(version=value[0], value=value)
    return cache["value"]


def free_rollout(ctx: TaskContext, algo: Algorithm, fallback: LearnerOutput | None = None
                 ) -> Batch:
    """Role ``rollout``: one rollout of actor ``ctx.replica`` with the newest published
    weights (``fallback``'s outside a Dask worker). One actor's rollouts run one at a time
    on a worker, whatever its thread count: they step the same envs."""
    if fallback is None:
        version, weights = newest_weights(ctx.run)
        fallback = LearnerOutput(version, {}, weights)
    lock, _ = resident((ctx.run, "impala", "lock", ctx.replica), threading.Lock)
    with lock:
        return roles.rollout(ctx, algo, fallback, algo.num_steps)


class Publisher:
    """Publishes a learner's newest weights from a thread of its own, so that an update does
    not wait on the scheduler: :meth:`offer` hands over ``(version, weights)`` and returns;
    the thread scatters the newest one offered (older ones it had no time for are skipped)
    to the learner's worker and sets the run's variables to it."""

    def __init__(self, client: Any, run: str, address: str) -> None:
        self.client, self.address = client, address
        self.weights = Variable(channel_name(run), client=client)
        self.version = Variable(channel_name(run, "version"), client=client)
        self.cond = threading.Condition()
        self.latest: tuple[int, Weights] | None = None
        self.published: Future | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=f"impala-publish-{run}",
                                       daemon=True)
        self.thread.start()

    def publish_now(self, version: int, weights: Weights) -> None:
        """Publish in this thread (the first weights, before any rollout asks for them)."""
        # one future for the pair (scatter would split a bare tuple into two)
        future = self.client.scatter([(version, weights)], workers=[self.address],
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
        """Stop the thread and delete the run's variables (the run ends)."""
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(timeout=30)
        for var in (self.weights, self.version):
            try:
                var.delete()
            except Exception:  # noqa: BLE001 - the scheduler may be going away
                pass


@dataclasses.dataclass
class Pipeline:
    """The learner's side of a run's free-running actors, resident on the learner's worker
    across learner tasks: the rollouts in flight and the published weights."""

    where: dict[int, str | None] = dataclasses.field(default_factory=dict)
    """Actor -> the worker its next rollouts are pinned to."""
    pending: dict[str, tuple[int, Future]] = dataclasses.field(default_factory=dict)
    rounds: dict[int, int] = dataclasses.field(default_factory=dict)
    publisher: Publisher | None = None
    last_end: float | None = None
    seen: dict[str, str] = dataclasses.field(default_factory=dict)
    """Worker name -> the address it had at the last look: the scheduler turns a rollout's
    pin by name into that address, so a worker back under its name (a nanny's restart) at
    another address does not receive the rollouts pinned to its lost process."""

    def in_flight(self, actor: int) -> int:
        """Rollouts of ``actor`` submitted and not yet consumed."""
        return sum(1 for a, _ in self.pending.values() if a == actor)

    def cancel(self, client: Any) -> None:
        """Let go of every rollout in flight and stop publishing (the run ends)."""
        futures = [f for _, f in self.pending.values()]
        if futures:
            client.cancel(futures)
        self.pending.clear()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None


class _Iteration:
    """What one iteration of the learner records: its batches, lags, waits and metrics."""

    def __init__(self, begin: float) -> None:
        self.begin, self.wait_s, self.publish_s, self.update_s = begin, 0.0, 0.0, 0.0
        self.stats: list[dict[str, Any]] = []
        self.lags: list[str] = []
        self.lag_values: list[int] = []
        self.dropped = 0
        self.metrics: dict[str, Any] = {}

    def finish(self, updates: int, num_actors: int) -> dict[str, Any]:
        end = time.time()
        wall = max(end - self.begin, 1e-9)
        # busy: updating and handing the weights over; the rest of the wall time the learner
        # waited for a batch, or for its next task to start (a worker thread, the driver)
        busy = min(wall, self.update_s + self.publish_s)
        out = dict(self.metrics)
        out.update(merge_stats(self.stats))
        rollout_s = float(np.mean([s["t_end"] - s["t_start"] for s in self.stats]))
        per_update = busy / len(self.stats)
        out.update(
            policy_lag=float(np.mean(self.lag_values)), policy_lag_max=int(max(self.lag_values)),
            policy_lags=" ".join(self.lags), batches_dropped=self.dropped, weights_version=updates,
            learner_busy=busy / wall, learner_wait_s=self.wait_s,
            learner_idle_s=max(0.0, wall - busy - self.wait_s), learner_worker=worker_name(),
            learner_update_s=self.update_s, learner_publish_s=self.publish_s,
            # each actor, on a core of its own, lands a batch per rollout: this many keep an
            # update's worth of batches coming
            actors_for_busy=max(1, int(np.ceil(rollout_s / max(per_update, 1e-9)))),
            learn_t_start=end - busy, learn_t_end=end, rollout_s=rollout_s)
        return out


def impala_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                 actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None,
                 count: int = 1) -> LearnerOutput:
    """Role ``learner``: ``count`` iterations of ``len(actors)`` updates, each on one batch
    as it lands, keeping ``in_flight`` rollouts per actor submitted.

    Outside a Dask worker (``--scheduler sync``) the actors take turns in this process, each
    acting with the newest weights (lag 0).
    """
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    n = len(actors)
    updates = learner_in.version * n  # weights versions count updates
    history: list[dict[str, Any]] = []

    def progress(j: int, used: int) -> float:
        return min(1.0, ctx.progress(ctx.iteration + j + used / n))

    def actor_ctx(a: int, j: int) -> TaskContext:
        return dataclasses.replace(ctx, replica=a, iteration=ctx.iteration + j, gpu=0.0)

    if not on_worker():
        for j in range(count):
            it = _Iteration(time.time())
            for a in range(n):
                current = LearnerOutput(updates, {}, learner.weights())
                t0 = time.time()  # the learner waits while the actor steps, in this thread
                batch = free_rollout(actor_ctx(a, j), algo, current)
                t1 = time.time()
                it.wait_s += t1 - t0
                it.metrics = learner.update([batch], progress(j, a))
                it.update_s += time.time() - t1
                updates += 1
                it.stats.append(batch["stats"])
                it.lags.append(f"{a}:0")
                it.lag_values.append(0)
            history.append(it.finish(updates, n))
    else:
        with worker_client() as client:
            history = _free_running(client, ctx, algo, learner, actors, in_flight, max_lag,
                                    count, updates, progress, actor_ctx)
    holder["version"] = learner_in.version + count
    metrics = history[-1]
    metrics["learner_built"] = built
    return LearnerOutput(learner_in.version + count, learner.state_dict(), learner.weights(),
                         metrics, history=history[:-1])


def _free_running(client: Any, ctx: TaskContext, algo: Algorithm, learner: Any,
                  actors: Sequence[ActorSpec], in_flight: int, max_lag: int | None, count: int,
                  updates: int, progress: Any, actor_ctx: Any) -> list[dict[str, Any]]:
    """The learner task's loop on a Dask worker (see :func:`impala_learn`)."""
    pipes, _ = resident(("impala", "pipelines"), dict)
    pipe = pipes.get(ctx.run)
    if pipe is None:  # a new run or attempt: let go of what an earlier attempt left here
        for old in pipes.values():
            old.cancel(client)
        pipes.clear()
        pipe = pipes[ctx.run] = Pipeline(where={a: w for a, (w, _) in enumerate(actors)})
    me = get_worker()
    homes = {a: w for a, (w, _) in enumerate(actors)}
    if pipe.publisher is None:  # the run's first learner task here: publish before acting
        pipe.publisher = Publisher(client, ctx.run, me.address)
        pipe.publisher.publish_now(updates, learner.weights())
    publisher = pipe.publisher  # later tasks: the last update was offered already

    def submit(a: int, j: int) -> Future:
        worker = pipe.where.get(a)
        r = pipe.rounds.get(a, 0)
        pipe.rounds[a] = r + 1
        fut = client.submit(free_rollout, actor_ctx(a, j), algo, pure=False,
                            resources=actors[a][1], workers=[worker] if worker else None,
                            priority=ROLLOUT_PRIORITY,
                            key=step_key("rollout", a, ctx.iteration + j, r, ctx.run))
        pipe.pending[fut.key] = (a, fut)
        return fut

    def rehome(j: int) -> bool:
        """Move actors whose worker left to a live one (back home once it is back); their
        rollouts pinned to the lost worker are submitted again. True when any moved."""
        info = client.scheduler_info(n_workers=-1)["workers"]
        live = {str(w["name"]) for w in info.values()}
        addresses = {str(w["name"]): a for a, w in info.items()}
        restarted = {n for n, a in pipe.seen.items() if n in live and addresses[n] != a}
        pipe.seen = addresses
        moved = False
        for a, home in homes.items():
            if home is None:
                continue
            now = pipe.where.get(a)
            want = home if home in live else (now if now in live else None)
            if want is None:
                others = sorted({w for w in homes.values() if w in live} - {str(me.name)})
                others = others or sorted(live - {str(me.name)})
                want = min(others, key=lambda w: list(pipe.where.values()).count(w),
                           default=None)
            if want == now and now not in restarted:
                continue
            pipe.where[a] = want
            if now not in live or now in restarted:  # its rollouts wait for a lost process
                lost = [k for k, (b, _) in pipe.pending.items() if b == a]
                client.cancel([pipe.pending.pop(k)[1] for k in lost])
                for _ in lost:
                    submit(a, j)
                moved = True
        return moved

    rehome(0)  # where every worker is now (a first task: the addresses its pins become)
    for a in range(len(actors)):
        while pipe.in_flight(a) < in_flight:
            submit(a, 0)
    arrivals = as_completed([f for _, f in pipe.pending.values()], with_results=True)
    checked = time.time()
    history = []
    for j in range(count):
        it = _Iteration(pipe.last_end if pipe.last_end is not None else time.time())
        used = 0
        while used < len(actors):
            t0 = time.time()
            while True:  # wait for a batch; look for lost actor workers now and then
                if time.time() - checked > MEMBERSHIP_S:
                    if rehome(j):
                        arrivals = as_completed([f for _, f in pipe.pending.values()],
                                                with_results=True)
                    checked = time.time()
                if arrivals.has_ready():
                    break
                time.sleep(POLL_S)
            fut, batch = next(arrivals)
            it.wait_s += time.time() - t0
            a, _ = pipe.pending.pop(fut.key)
            arrivals.add(submit(a, j))  # the actor's next rollout, before this update
            lag = updates - int(batch["stats"]["policy_version"])
            if max_lag is not None and lag > max_lag:
                it.dropped += 1
                continue
            t1 = time.time()
            it.metrics = learner.update([batch], progress(j, used))
            updates += 1
            t2 = time.time()
            publisher.offer(updates, learner.weights())
            it.update_s += t2 - t1
            it.publish_s += time.time() - t2
            used += 1
            it.stats.append(batch["stats"])
            it.lags.append(f"{a}:{lag}")
            it.lag_values.append(lag)
        history.append(it.finish(updates, len(actors)))
        pipe.last_end = time.time()
    if ctx.iteration + count >= ctx.num_iterations:  # the run's last: stop the actors
        pipe.cancel(client)
        pipes.pop(ctx.run, None)
    return history
