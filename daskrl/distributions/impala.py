"""``impala``: free-running actors and a learner that updates on each batch as it lands.

Each actor keeps ``in_flight`` rollout tasks submitted (K, default 2), so that when one ends
the next is already queued on its worker: actors never wait for the learner. A rollout reads
the newest weights the learner has published when it starts, not when it was submitted: the
learner publishes each update's ``(version, weights)`` as a Dask future (data on the learner's
worker) in a :class:`distributed.Variable`; a rollout looks the variable up (one scheduler
round trip) and fetches the weights only when their key changed since its worker last
fetched them, so large weights travel by version, on request.

The learner consumes batches with :func:`distributed.as_completed` rather than a Dask
``Queue``: rollout results are task outputs, so a rollout lost with its worker is recomputed
elsewhere by the scheduler (a batch in a ``Queue`` would go through the scheduler as data and
be lost with nothing to recompute it), and ``as_completed(with_results=True)`` fetches each
finished batch to the learner's worker in the background while the learner is still
updating on the previous one (the host-side prefetch), so an update starts on data already
there. Each arrival gets the actor's next rollout submitted before the update runs.

One iteration is ``num_actors`` updates, each on one rollout's batch as it arrives (the same
env steps per iteration as under ``actors-learner``); a learner task runs one or several
iterations (``iterations_per_task``), and the rollouts in flight outlive it: they are kept
in worker-resident state on the learner's worker and taken up by the next learner task, so
the pipeline does not drain between tasks. Only the run's last iteration cancels them.

V-trace corrects for the lag, which the metrics record per batch: ``policy_lags`` (in
arrival order, ``<actor>:<lag>``, the lag being the learner's weights version minus the
version that acted, in updates), ``policy_lag`` (mean) and ``policy_lag_max``. With
``max_lag`` set, a batch more than that many updates old is dropped (``batches_dropped``)
and its actor rolls out again. ``learner_busy`` is the share of an iteration's wall time
(from the previous iteration's end) the learner spent outside waiting for a batch;
``learner_wait_s`` the rest. ``actors_for_busy`` estimates the actors that would keep the
learner busy (:mod:`daskrl.observe.profile` suggests adding them).

A lost actor worker does not stop the run: rollouts are pinned to their actor's worker by
name, and the learner asks the scheduler every :data:`MEMBERSHIP_S` which workers there are;
an actor whose worker left gets its rollouts submitted again on another actor worker (which
rebuilds its envs), and goes back to its own worker's name once a replacement joins under
it. The driver does not treat that loss as a lost pin
(:attr:`~daskrl.distributions.base.Distribution.replaceable`): the learner goes on, and
loses only the time of the rollouts that were in flight there. The learner holds its CPU
slot when it has a worker of its own, so no rollout runs on its core.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.delayed import Delayed
from distributed import Future, Variable, as_completed, get_client, get_worker, worker_client

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput, Weights
from daskrl.core.fragment import Fragment
from daskrl.core.placement import task
from daskrl.core.resources import Resources
from daskrl.core.roles import TaskContext, merge_stats, resident_learner
from daskrl.core.worker_state import resident, worker_name
from daskrl.distributions.async_grads import on_worker, waiting
from daskrl.distributions.base import (
    Distribution,
    IterationInputs,
    pinned,
    step_key,
    to_bool,
    to_int,
)

ActorSpec = tuple[str | None, dict[str, float]]
"""An actor's worker name and the Dask resources of its rollouts."""

POLL_S = 0.002
"""How often a learner waiting for a batch looks whether one landed."""
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
        busy = max(0.0, wall - self.wait_s)
        out = dict(self.metrics)
        out.update(merge_stats(self.stats))
        rollout_s = float(np.mean([s["t_end"] - s["t_start"] for s in self.stats]))
        per_update = busy / len(self.stats)
        out.update(
            policy_lag=float(np.mean(self.lag_values)), policy_lag_max=int(max(self.lag_values)),
            policy_lags=" ".join(self.lags), batches_dropped=self.dropped, weights_version=updates,
            learner_busy=busy / wall, learner_wait_s=self.wait_s, learner_worker=worker_name(),
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
                it.wait_s += time.time() - t0
                it.metrics = learner.update([batch], progress(j, a))
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
    if pipe.publisher is None:
        pipe.publisher = Publisher(client, ctx.run, me.address)
    publisher = pipe.publisher

    def submit(a: int, j: int) -> Future:
        worker = pipe.where.get(a)
        r = pipe.rounds.get(a, 0)
        pipe.rounds[a] = r + 1
        fut = client.submit(free_rollout, actor_ctx(a, j), algo, pure=False,
                            resources=actors[a][1], workers=[worker] if worker else None,
                            key=step_key("rollout", a, ctx.iteration + j, r, ctx.run))
        pipe.pending[fut.key] = (a, fut)
        return fut

    def rehome(j: int) -> bool:
        """Move actors whose worker left to a live one (back home once it is back); their
        rollouts pinned to the lost worker are submitted again. True when any moved."""
        info = client.scheduler_info(n_workers=-1)["workers"]
        live = {str(w["name"]) for w in info.values()}
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
            if want == now:
                continue
            pipe.where[a] = want
            if now not in live:  # its rollouts wait for a worker that is gone
                lost = [k for k, (b, _) in pipe.pending.items() if b == a]
                client.cancel([pipe.pending.pop(k)[1] for k in lost])
                for _ in lost:
                    submit(a, j)
                moved = True
        return moved

    publisher.publish_now(updates, learner.weights())
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


class Impala(Distribution):
    """Free-running actors, a learner on its own clock, V-trace for the lag (IMPALA).

    Parameters
    ----------
    in_flight : int
        Rollouts each actor keeps submitted (default 2: one running, one queued behind it).
    max_lag : int or ``"none"``
        Drop batches whose acting weights are more than this many updates older than the
        learner's (default: keep every batch; V-trace corrects them).
    iterations_per_task : int
        The most iterations one learner task runs (the driver sizes tasks to about
        ``RunSettings.task_s``); the rollouts in flight carry over between tasks.
    apart : bool
        Keep the actors off the learner's worker when others fit (it then holds its CPU
        slot, so its core is its own). Default False: actors are spread over every worker,
        the learner's too, and the learner holds no CPU slot (on few cores the envs get
        them all, and the learner's work interleaves with theirs).

    Examples
    --------
    >>> d = Impala(in_flight="3", max_lag="8")
    >>> d.in_flight, d.max_lag
    (3, 8)
    >>> Impala(max_lag="-1")
    Traceback (most recent call last):
    ...
    ValueError: option max_lag='-1' must be >= 0
    """

    name = "impala"
    requires = frozenset({"vtrace"})
    deterministic = False  # batches are consumed in the order they land
    dynamic = True
    replaceable = frozenset({"rollout"})

    def __init__(self, in_flight: int | str = 2, max_lag: int | str | None = None,
                 iterations_per_task: int | str = 16, apart: bool | str = False) -> None:
        self.apart = to_bool("apart", apart)
        self.in_flight = to_int("in_flight", in_flight)
        self.max_lag = (None if max_lag is None or str(max_lag).lower() == "none"
                        else to_int("max_lag", max_lag, minimum=0))
        self.max_count = to_int("iterations_per_task", iterations_per_task)

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``vtrace``: batches carry sequences and the acting version; a value head."""
        return {"vtrace": "use graphs/impala.py, or graphs/ppo.py --vtrace (an algorithm "
                          "with a value head whose actor records sequences)"}

    def workers_wanted(self, algo: Algorithm) -> int:
        """One worker per actor, plus the learner's when ``apart``."""
        return algo.num_actors + int(self.apart)

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """The learner and the actors. ``apart``: the learner first, the actors avoid its
        worker when others fit; else the actors first, spread over the workers, and the
        learner on a worker without one when there is one."""
        learner = Fragment(impala_learn, "learner", algo.resources_for("learner"),
                           apart_from=() if self.apart else ("rollout",))
        actors = Fragment(free_rollout, "rollout", algo.resources_for("rollout"),
                          algo.num_actors, apart_from=("learner",) if self.apart else ())
        return [learner, actors] if self.apart else [actors, learner]

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        """``iterations_per_task``: rollouts carry over between learner tasks."""
        return self.max_count

    def _actors(self, inputs: IterationInputs) -> tuple[ActorSpec, ...]:
        place = inputs.placement
        return tuple((place.worker("rollout", a), place.resources["rollout"].to_dask())
                     for a in range(inputs.algo.num_actors))

    def _learner_resources(self, inputs: IterationInputs) -> Resources:
        """The learner's resources when it has a worker of its own: holding them keeps
        rollouts (which the scheduler may move off a busy worker) away from its core. Else
        none but its GPU (it secedes while it waits), so the actors there can run."""
        place = inputs.placement
        learner = place.worker("learner", 0)
        shared = any(place.worker("rollout", a) == learner
                     for a in range(inputs.algo.num_actors))
        res = place.resources["learner"]
        return waiting(res) if shared or learner is None else res

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """One learner task that keeps the actors' rollouts in flight itself."""
        place = inputs.placement
        return task(impala_learn, inputs.context("learner", 0), inputs.algo, inputs.learner_in,
                    self._actors(inputs), self.in_flight, self.max_lag, inputs.count,
                    role="learner", replica=0, iteration=inputs.iteration, run=inputs.run,
                    resources=self._learner_resources(inputs),
                    worker=place.worker("learner", 0))

    def sketch(self, inputs: IterationInputs) -> Delayed:
        """A static picture of the pipeline, for :mod:`daskrl.observe.render`.

        Each actor starts with ``in_flight`` rollouts on the published weights; batches are
        drawn landing round-robin, each feeding one ``update``; each arrival submits that
        actor's next rollout, which acts with the weights the update before it published.
        """
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        roll_res, learn_res = place.resources["rollout"], self._learner_resources(inputs)
        learner = place.worker("learner", 0)
        published: Any = pinned(_placeholder, inputs.learner_in, resources=learn_res,
                                key=f"publish-v0-it{k}-{run}", worker=learner)
        queue: list[tuple[int, Any]] = []
        rounds = dict.fromkeys(range(algo.num_actors), 0)

        def rollout(a: int, weights: Any) -> None:
            queue.append((a, pinned(_placeholder, weights, resources=roll_res,
                                    key=step_key("rollout", a, k, rounds[a], run),
                                    worker=place.worker("rollout", a), strict=False)))
            rounds[a] += 1

        for _ in range(self.in_flight):
            for a in range(algo.num_actors):
                rollout(a, published)
        update: Any = published
        for v in range(1, algo.num_actors + 1):
            a, batch = queue.pop(0)
            rollout(a, published)
            update = pinned(_placeholder, update, batch, resources=learn_res,
                            key=f"update-v{v}-it{k}-{run}", worker=learner)
            published = pinned(_placeholder, update, resources=learn_res,
                               key=f"publish-v{v}-it{k}-{run}", worker=learner)
        return task(_placeholder, published, *(d for _, d in queue), role="learner", replica=0,
                    iteration=k, run=run, resources=learn_res, worker=learner)


def _placeholder(*_: Any) -> None:
    return None
