"""``impala``: free-running actors and a learner that updates on each batch as it lands.

Each actor keeps ``in_flight`` rollout tasks submitted (K, default 2), so that when one ends
the next is already queued on its worker: actors never wait for the learner. A rollout reads
the newest weights the learner has published when it starts, not when it was submitted: the
learner publishes each update's ``(version, weights)`` as a Dask future (data on the learner's
worker) in a :class:`distributed.Variable`; a rollout looks the variable up (one scheduler
round trip) and fetches the weights only when their version changed since its worker last
fetched them, so large weights travel by version, on request. The learner publishes from a
thread of its own: an update does not wait on the scheduler.

The learner consumes batches with :func:`distributed.as_completed` rather than a Dask
``Queue``: rollout results are task outputs, so a rollout lost with its worker is recomputed
elsewhere by the scheduler (a batch in a ``Queue`` would go through the scheduler as data and
be lost with nothing to recompute it), and ``as_completed(with_results=True)`` fetches each
finished batch to the learner's worker in the background while the learner is still
updating on the previous one (the host-side prefetch), so an update starts on data already
there. Each arrival gets the actor's next rollout submitted before the update runs.

One iteration is ``num_actors`` updates, each on one rollout's batch as it arrives (the same
env steps per iteration as under ``actors-learner``). The learner runs on its own clock
(:mod:`daskrl.distributions.learner_clock`): a loop resident on the learner's worker updates
on batches staged on its device ahead of use (:mod:`daskrl.distributions.prefetch`), and
learner tasks (one or several iterations each, ``iterations_per_task``) only collect its
iterations, seceded from the worker's thread pool: the learner does not stop at task
boundaries, nor wait for a rollout to free a worker thread. The rollouts in flight outlive
every task; only the run's last iteration cancels them.

V-trace corrects for the lag, which the metrics record per batch: ``policy_lags`` (in
arrival order, ``<actor>:<lag>``, the lag being the learner's weights version minus the
version that acted, in updates), ``policy_lag`` (mean) and ``policy_lag_max``. With
``max_lag`` set, a batch more than that many updates old is dropped (``batches_dropped``)
and its actor rolls out again. ``learner_busy`` is the share of an iteration's wall time
(from the previous iteration's end) the learner spent updating (and handing the weights to
its publisher); ``learner_wait_s`` is the time it waited for a batch, ``learner_idle_s`` the
rest (the clock's bookkeeping, or its wait for a task when it ran a task's worth ahead);
``learner_ahead`` how many of a task's iterations the clock had finished before the task
came, and ``learner_clock`` the clock that ran the iteration (one per run, unless a retry or
a lost worker started another). ``actors_for_busy`` estimates the actors that would keep the
learner busy (:mod:`daskrl.observe.profile` suggests adding them).

At many actors two options keep the scheduler and the learner off the critical path
(``benchmarks/scale_actors.md`` measures them): ``group=K`` fuses up to K actors placed on
one worker into one rollout stream (one task a rollout and one batched forward pass a step
for all of them, instead of one each), and ``batch=auto`` lets each update take every batch
that has landed since the last one, so the learner's fixed cost per update is paid once for
all of them and it never waits while batches are there.

The machinery (rollout task, publisher, rollouts in flight) is in
:mod:`daskrl.distributions.free_running`, the learner's loop in
:mod:`daskrl.distributions.learner_clock`.

A lost actor worker does not stop the run: rollouts are pinned to their actor's worker by
name, and the learner asks the scheduler every
:data:`~daskrl.distributions.free_running.MEMBERSHIP_S` which workers there are;
an actor whose worker left gets its rollouts submitted again on another actor worker (which
rebuilds its envs), and goes back to its own worker's name once a replacement joins under
it. The driver does not treat that loss as a lost pin
(:attr:`~daskrl.distributions.base.Distribution.replaceable`): the learner goes on, and
loses only the time of the rollouts that were in flight there. The learner holds its CPU
slot when it has a worker of its own, so no rollout runs on its core.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from dask.delayed import Delayed

from daskrl.core.algorithm import Algorithm
from daskrl.core.fragment import Fragment
from daskrl.core.keys import step_key, version_key
from daskrl.core.placement import Placement, task
from daskrl.core.resources import Resources
from daskrl.distributions.actors_learner import colocated
from daskrl.distributions.async_grads import waiting
from daskrl.distributions.base import (
    Distribution,
    IterationInputs,
    Unsupported,
    pinned,
    to_bool,
    to_int,
)
from daskrl.distributions.free_running import ActorSpec, free_rollout
from daskrl.distributions.learner_clock import impala_learn

__all__ = ["Impala", "free_rollout", "impala_learn"]


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
    batch : int or ``"auto"``
        Actors' rollouts per learner update (IMPALA's batch size, in unrolls): the learner
        takes this many as they land and makes one gradient step on them together.
        Default 1 (an update per batch). With ``batch = num_actors`` the learner makes as
        many updates per env step as lockstep ``actors-learner``, on the same batch size;
        it must divide ``--num-actors`` (an iteration is ``num_actors`` rollouts).
        ``auto``: each update takes every batch that has landed since the last one (at
        least one, at most the rest of the iteration), so the learner never waits while
        batches are there and its updates grow with what the actors deliver: with many
        actors it makes fewer, larger updates per env step than ``batch=1``.
    group : int
        Fuse up to this many actors placed on the same worker into one batched actor: one
        rollout task and one forward pass per step for all their envs (each actor keeps its
        own envs and seeds). The scheduler then sees a task per group rather than per actor,
        and the forward passes run batched (default 1: every actor its own task).

    Examples
    --------
    >>> d = Impala(in_flight="3", max_lag="8", batch="2", group="16")
    >>> d.in_flight, d.max_lag, d.batch, d.group
    (3, 8, 2, 16)
    >>> Impala(batch="auto").batch is None
    True
    >>> Impala(max_lag="-1")
    Traceback (most recent call last):
    ...
    ValueError: option max_lag='-1' must be >= 0
    """

    name = "impala"
    headline = ("learner_busy", "policy_lag", "learner_wait_s")
    requires = frozenset({"vtrace"})
    deterministic = False  # batches are consumed in the order they land
    dynamic = True
    replaceable = frozenset({"rollout"})

    def __init__(self, in_flight: int | str = 2, max_lag: int | str | None = None,
                 iterations_per_task: int | str = 16, apart: bool | str = False,
                 batch: int | str | None = 1, group: int | str = 1) -> None:
        self.apart = to_bool("apart", apart)
        self.batch = None if batch is None or str(batch).lower() == "auto" \
            else to_int("batch", batch)
        """Actors' rollouts per update; None: every batch that has landed (``auto``)."""
        self.group = to_int("group", group)
        self.in_flight = to_int("in_flight", in_flight)
        self.max_lag = (None if max_lag is None or str(max_lag).lower() == "none"
                        else to_int("max_lag", max_lag, minimum=0))
        self.max_count = to_int("iterations_per_task", iterations_per_task)

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``vtrace``: batches carry sequences and the acting version; a value head.
        ``resizable-actor`` too with ``group`` > 1 (fused actors)."""
        need = {"vtrace": "use graphs/impala.py, or graphs/ppo.py --vtrace (an algorithm "
                          "with a value head whose actor records sequences)"}
        if self.group > 1:
            need["resizable-actor"] = "drop group= (keep one task per actor)"
        return need

    def check(self, algo: Algorithm) -> None:
        """The capability check, then ``batch`` against the actors (before any worker
        starts).

        Examples
        --------
        >>> algo = Algorithm("a", print, print, print, num_steps=8, num_envs=4, num_actors=3,
        ...                  capabilities=frozenset({"vtrace"}))
        >>> Impala(batch=2).check(algo)
        Traceback (most recent call last):
        ...
        daskrl.distributions.base.Unsupported: impala:batch=2 must divide --num-actors 3 (an iteration is one batch per actor): use batch=1 or 3, or --num-actors 4
        """  # noqa: E501
        super().check(algo)
        n = algo.num_actors
        if self.batch is not None and n % self.batch:
            raise Unsupported(
                f"impala:batch={self.batch} must divide --num-actors {n} (an iteration is "
                f"one batch per actor): use batch=1 or {n}, or --num-actors "
                f"{n + self.batch - n % self.batch}")

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

    def check_capacity(self, placement: Placement, workers: Mapping[str, Mapping[str, float]],
                       algo: Algorithm) -> None:
        """Refuse more actors than the workers that may host them hold at once.

        A free-running actor holds its rollout resources all the time (its rollouts run back
        to back), so each worker holds as many actors as its advertised resources cover the
        actors' needs (``CPU=1`` by default: one per CPU); actors beyond that would only
        queue behind others, adding lag and no env steps. Actors meant to share a CPU say
        so with a fraction (``--resources rollout=CPU:0.5``). Workers that advertise none of
        the needed resources (Dask then runs a task per thread) are not counted.

        Examples
        --------
        >>> from daskrl.core.placement import plan_placement
        >>> from daskrl.core.fragment import Fragment
        >>> algo = Algorithm("a", print, print, print, num_steps=8, num_envs=4, num_actors=4)
        >>> workers = {"w0": {"CPU": 1}, "w1": {"CPU": 1}}
        >>> d = Impala()
        >>> d.check_capacity(plan_placement(d.fragments(algo), workers), workers, algo)
        Traceback (most recent call last):
        ...
        ValueError: --num-actors 4: the workers that may host actors (w0, w1) hold 2 at once, each actor needing {'CPU': 1}: lower --num-actors to 2, start 2 more workers like them, or let actors share a CPU (--resources rollout=CPU:0.5)
        """  # noqa: E501
        need = placement.resources["rollout"].to_dask()
        hosts = sorted(set(placement.workers.get("rollout", ())))
        if not need or not hosts:
            return
        each = {w: min(math.floor(workers[w].get(k, 0.0) / v + 1e-9) for k, v in need.items())
                for w in hosts}
        held = sum(each.values())
        if algo.num_actors <= held:
            return
        if self.group > 1:  # a fused group holds one actor's resources
            tasks = Counter(s.worker for s in streams(placement, algo.num_actors, self.group))
            if all(n <= each.get(str(w), 0) for w, n in tasks.items()):
                return
        per = max(1, min(each.values()))
        more = math.ceil((algo.num_actors - held) / per)
        share = f"{min(need.get('CPU', 1.0), held * need.get('CPU', 1.0) / algo.num_actors):g}"
        raise ValueError(
            f"--num-actors {algo.num_actors}: the workers that may host actors "
            f"({', '.join(hosts)}) hold {held} at once, each actor needing {need}: lower "
            f"--num-actors to {held}, start {more} more worker{'s' * (more > 1)} like them, "
            f"or let actors "
            f"share a CPU (--resources rollout=CPU:{share})")

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        """``iterations_per_task``: rollouts carry over between learner tasks."""
        return self.max_count

    def _actors(self, inputs: IterationInputs) -> tuple[ActorSpec, ...]:
        """The rollout streams: each actor its own, or (``group``) chunks of the actors
        placed on one worker, in replica order."""
        return streams(inputs.placement, inputs.algo.num_actors, self.group)

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
                    self.batch,
                    role="learner", replica=0, iteration=inputs.iteration, run=inputs.run,
                    resources=self._learner_resources(inputs),
                    worker=place.worker("learner", 0))

    def sketch(self, inputs: IterationInputs) -> Delayed:
        """A static picture of the pipeline, for :mod:`daskrl.observe.render`.

        Each actor starts with ``in_flight`` rollouts on the published weights; batches are
        drawn landing round-robin, every ``batch`` of them feeding one ``update``; each
        arrival submits that actor's next rollout, which acts with the weights the update
        before it published.
        """
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        roll_res, learn_res = place.resources["rollout"], self._learner_resources(inputs)
        learner = place.worker("learner", 0)
        published: Any = pinned(_placeholder, inputs.learner_in, resources=learn_res,
                                key=version_key("publish", 0, k, run), worker=learner)
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
        per = self.batch or 1  # auto: drawn as one batch an update
        for v in range(1, algo.num_actors // per + 1):
            batches = []
            for _ in range(per):  # an update takes `batch` batches as they land
                a, batch = queue.pop(0)
                rollout(a, published)
                batches.append(batch)
            update = pinned(_placeholder, update, *batches, resources=learn_res,
                            key=version_key("update", v, k, run), worker=learner)
            published = pinned(_placeholder, update, resources=learn_res,
                               key=version_key("publish", v, k, run), worker=learner)
        return task(_placeholder, published, *(d for _, d in queue), role="learner", replica=0,
                    iteration=k, run=run, resources=learn_res, worker=learner)


def streams(placement: Placement, num_actors: int, group: int = 1) -> tuple[ActorSpec, ...]:
    """The rollout streams of ``num_actors`` actors: each actor its own, or chunks of at most
    ``group`` of the actors placed on one worker (in replica order), fused into one.

    Examples
    --------
    >>> p = Placement({"rollout": Resources(cpu=1)}, {"rollout": ("a", "b", "a", "a")})
    >>> [s.replicas for s in streams(p, 4)]
    [(0,), (1,), (2,), (3,)]
    >>> [(s.worker, s.replicas) for s in streams(p, 4, group=2)]
    [('a', (0, 2)), ('a', (3,)), ('b', (1,))]
    """
    res = placement.resources["rollout"].to_dask()
    if group <= 1:
        return tuple(ActorSpec(placement.worker("rollout", a), res, (a,))
                     for a in range(num_actors))
    chunks = [g[i:i + group] for g in colocated(placement, "rollout", num_actors)
              for i in range(0, len(g), group)]
    return tuple(ActorSpec(placement.worker("rollout", c[0]), res, tuple(c)) for c in chunks)


def _placeholder(*_: Any) -> None:
    return None
