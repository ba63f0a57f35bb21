"""``async`` (A3C): actors compute gradients on their own rollouts; the learner applies each
as it arrives.

One iteration is one ``learner`` task. It secedes from its worker's thread pool
(``worker_client``), submits one ``grad`` task per actor with the current weights, and
applies gradients in completion order (``distributed.as_completed``): each application makes
a new weights version, and the actor whose gradient was applied gets a new ``grad`` task
with those weights at once, while the other actors are still rolling out with older ones.
An actor stops once it has taken ``num_steps`` steps per env this iteration, so an iteration
takes ``algo.steps_per_iteration`` env steps as under the other distributions. Metrics:
``grads_applied``, ``weights_version``, ``staleness_mean``/``staleness_max`` (versions
between the weights a gradient was computed with and those it was applied to) and
``grad_order`` (``<actor>.<round>@<version used>``, in application order).

The learner task holds no CPU slot while it waits (its GPU, if any, stays reserved), so an
actor placed on the learner's worker can still run.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any, cast

import numpy as np
import torch
from dask.delayed import Delayed
from distributed import as_completed, get_worker, worker_client

from daskrl.core.algorithm import Algorithm, GradientActor, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.keys import step_key, version_key
from daskrl.core.placement import task
from daskrl.core.resources import Resources
from daskrl.core.roles import TaskContext, merge_stats, resident_actor, resident_learner
from daskrl.core.worker_state import worker_name
from daskrl.distributions.base import Distribution, IterationInputs, Unsupported, pinned


def gradient(ctx: TaskContext, algo: Algorithm, weights: dict[str, torch.Tensor], version: int
             ) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Role ``grad``: this actor's gradient on a fresh rollout with weights ``version``."""
    actor, built = resident_actor(ctx, algo)
    actor.set_weights(weights, version)
    grads, stats = actor.gradients()  # type: ignore[attr-defined]  # declared: gradient-actor
    stats.update(worker=worker_name(), built=built, replica=ctx.replica, weights_version=version)
    return grads, stats


class _Applier:
    """The learner's side of one async iteration: applies gradients, counts versions."""

    def __init__(self, learner: Any, version: int, ctx: TaskContext, algo: Algorithm,
                 num_actors: int) -> None:
        self.learner, self.version, self.ctx, self.algo = learner, version, ctx, algo
        self.weights = learner.weights()
        self.steps = [0] * num_actors
        self.rounds = [0] * num_actors
        self.staleness: list[int] = []
        self.order: list[str] = []
        self.stats: list[dict[str, Any]] = []
        self.metrics: dict[str, Any] = {}

    def actor_ctx(self, a: int) -> TaskContext:
        # the learner's context as actor ``a``'s: same run, seed and settings; its own
        # replica, and a CPU actor (the learner's GPU grant is not the actor's)
        return dataclasses.replace(self.ctx, replica=a, gpu=0.0)

    def apply(self, a: int, used: int, grads: list[torch.Tensor], stats: dict[str, Any]
              ) -> bool:
        """Apply actor ``a``'s gradient (computed with version ``used``); True: send it more."""
        ctx, per_iter = self.ctx, len(self.steps) * self.algo.num_steps
        progress = min(1.0, ctx.progress(ctx.iteration + sum(self.steps) / per_iter))
        self.metrics = dict(self.learner.schedule(progress))
        self.learner.apply_gradients(grads)
        self.staleness.append(self.version - used)
        self.order.append(f"{a}.{self.rounds[a] - 1}@{used}")
        self.version += 1
        self.weights = self.learner.weights()
        self.stats.append(stats)
        self.steps[a] += int(stats["rollout_steps"])
        return self.steps[a] < self.algo.num_steps


def async_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                actors: tuple[tuple[str | None, dict[str, float]], ...]) -> LearnerOutput:
    """Role ``learner``: apply the actors' gradients as they arrive, for one iteration.

    ``actors`` holds each actor's preferred worker and Dask resources. Outside a Dask
    worker (``--scheduler sync``) the actors take turns in this process (staleness 0).
    """
    t0 = time.time()
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    app = _Applier(learner, holder.get("weights_version", 0), ctx, algo, len(actors))
    if not on_worker():
        turns = deque(range(len(actors)))
        while turns:
            a = turns.popleft()
            app.rounds[a] += 1
            used = app.version
            if app.apply(a, used, *gradient(app.actor_ctx(a), algo, app.weights, used)):
                turns.append(a)
    else:
        with worker_client() as client:
            pending: dict[str, tuple[int, int]] = {}

            def submit(a: int) -> Any:
                worker, resources = actors[a]
                fut = client.submit(
                    gradient, app.actor_ctx(a), algo, app.weights, app.version, pure=False,
                    resources=resources, workers=[worker] if worker else None,
                    allow_other_workers=True,
                    key=step_key("grad", a, ctx.iteration, app.rounds[a], ctx.run))
                pending[fut.key] = (a, app.version)
                app.rounds[a] += 1
                return fut

            arrivals = as_completed([submit(a) for a in range(len(actors))], with_results=True)
            for fut, (grads, stats) in arrivals:
                a, used = pending.pop(fut.key)
                if app.apply(a, used, grads, stats):
                    arrivals.add(submit(a))
    holder["weights_version"] = app.version
    holder["version"] = learner_in.version + 1
    metrics = app.metrics
    metrics.update(merge_stats(app.stats))
    for part in ("policy_loss", "value_loss", "entropy"):
        metrics[f"losses/{part}"] = float(np.mean([s[f"losses/{part}"] for s in app.stats]))
    end = time.time()
    metrics.update(
        grads_applied=len(app.staleness), weights_version=app.version,
        staleness_mean=float(np.mean(app.staleness)), staleness_max=int(max(app.staleness)),
        grad_order=" ".join(app.order), learner_worker=worker_name(), learner_built=built,
        rollout_s=end - t0, learn_t_start=end, learn_t_end=end)
    return LearnerOutput(learner_in.version + 1, learner.state_dict(), app.weights, metrics)


def on_worker() -> bool:
    """Whether this runs in a task on a Dask worker (which can submit more tasks), not in
    the driver's process under ``--scheduler sync``.

    Examples
    --------
    >>> on_worker()
    False
    """
    try:
        get_worker()
    except ValueError:
        return False
    return True


def _placeholder(*_: Any) -> None:
    return None


def waiting(res: Resources) -> Resources:
    """``res`` without its CPU slot: what a learner that mostly waits should hold.

    Examples
    --------
    >>> waiting(Resources(cpu=1, gpu=1)).to_dask()
    {'GPU': 1}
    """
    return Resources(cpu=0, gpu=res.gpu, custom=res.custom)


class AsyncGradients(Distribution):
    """Asynchronous gradients, applied as they arrive (A3C).

    Examples
    --------
    >>> AsyncGradients().name
    'async'
    """

    name = "async"
    requires = frozenset({"gradient-actor"})
    deterministic = False  # gradients are applied in the order they arrive
    learner_receives = "gradients"
    dynamic = True

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``gradient-actor``: actors send gradients, the learner applies them."""
        return {"gradient-actor": "pick a synchronous distribution (actors-learner, single), "
                                  "or write the actor like graphs/a3c.py's A2CActor"}

    def check(self, algo: Algorithm) -> None:
        """Also refuse fewer than 2 actors (nothing would be asynchronous)."""
        super().check(algo)
        if algo.num_actors < 2:
            raise Unsupported(f"the async distribution needs >= 2 actors, got num_actors="
                              f"{algo.num_actors}; pass --num-actors 2")

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """Gradient actors with the rollout resources, and one learner."""
        self.check(algo)
        return [Fragment(gradient, "rollout", algo.resources_for("rollout"), algo.num_actors),
                Fragment(async_learn, "learner", algo.resources_for("learner"))]

    def sketch(self, inputs: IterationInputs) -> Delayed:
        """A static picture of one iteration's dynamic tasks, for :mod:`daskrl.observe.render`.

        Gradients are drawn arriving round-robin: ``grad-<a>-..-s<j>`` is actor ``a``'s
        ``j``-th gradient, computed with the weights made by the ``apply`` it hangs from.
        """
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        actor = cast(GradientActor, algo.make_actor(0))  # declared: gradient-actor
        rounds = algo.num_steps // max(1, actor.rollout_steps)
        grad_res, learn_res = place.resources["rollout"], waiting(place.resources["learner"])
        learner = place.worker("learner", 0)
        made: list[Any] = [inputs.learner_in]  # made[v]: what produced weights version v
        used = {a: 0 for a in range(algo.num_actors)}
        for j in range(rounds):
            for a in range(algo.num_actors):
                grad = pinned(_placeholder, made[used[a]], key=step_key("grad", a, k, j, run),
                              resources=grad_res, worker=place.worker("rollout", a), strict=False)
                made.append(pinned(_placeholder, made[-1], grad, resources=learn_res,
                                   key=version_key("apply", len(made), k, run), worker=learner))
                used[a] = len(made) - 1
        return task(_placeholder, made[-1], role="learner", replica=0, iteration=k, run=run,
                    resources=learn_res, worker=learner)

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """One learner task that drives the actors' gradient tasks itself."""
        algo, place = inputs.algo, inputs.placement
        actors = tuple((place.worker("rollout", a), place.resources["rollout"].to_dask())
                       for a in range(algo.num_actors))
        return task(async_learn, inputs.context("learner", 0), algo, inputs.learner_in, actors,
                    role="learner", replica=0, iteration=inputs.iteration, run=inputs.run,
                    resources=waiting(place.resources["learner"]),
                    worker=place.worker("learner", 0))
