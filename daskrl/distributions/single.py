"""``single``: the whole loop fused on one worker (the Anakin/WarpDrive baseline).

One task per iteration steps every env of every replica as one vector env (one forward
pass per step over ``num_actors * num_envs`` envs), then updates the learner in the same
process: nothing moves between workers. The driver puts up to ``iterations_per_task``
(default 64) short iterations in one task to amortise Dask's per-task cost.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from dask.delayed import Delayed

from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.learner_threads import learner_threads
from daskrl.core.placement import task
from daskrl.core.roles import (
    TaskContext,
    keep_snapshot,
    merge_stats,
    resident_actor,
    resident_learner,
    snapshots,
)
from daskrl.core.worker_state import worker_name
from daskrl.distributions.base import Distribution, IterationInputs, chained, to_int


def fused_iterations(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                     count: int = 1, threads: int = 0) -> LearnerOutput:
    """Roles ``rollout`` + ``learner`` fused: ``count`` iterations of rollout and update on
    this worker (see :func:`~daskrl.distributions.base.chained`).

    ``threads > 0`` sets torch's intra-op threads of this worker process first (a lone
    worker on an idle machine may use every core for the update); 0 leaves the task's grant,
    and each update takes the cores the rollout leaves idle while it works when timing shows
    that faster (:mod:`daskrl.core.learner_threads`).

    Examples
    --------
    >>> from daskrl.algos.actor_critic import ActorCriticLearner, VecEnvActor
    >>> algo = Algorithm("t", lambda s: VecEnvActor("CartPole-v1", 2, s),
    ...                  lambda s, d: ActorCriticLearner(4, 2, s), print, num_steps=8,
    ...                  num_envs=2, num_actors=2)
    >>> learner = ActorCriticLearner(4, 2, 0)
    >>> start = LearnerOutput(0, learner.state_dict(), learner.weights())
    >>> ctx = TaskContext("doc", 1, 0, 0, 4)
    >>> out = fused_iterations(ctx, algo, start, count=2)
    >>> out.version, len(out.history), out.metrics["env_steps"] >= 32
    (2, 1, True)
    """
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    # the rollout waits for the update: it works alone unless threads were fixed
    ctx = dataclasses.replace(ctx, learner_alone=threads == 0)
    last = ctx.iteration + count - 1
    return chained(ctx, learner_in, count,
                   lambda c, cur: _one_iteration(c, algo, cur, final=c.iteration == last))


def _one_iteration(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                   final: bool = True) -> LearnerOutput:
    """One iteration; only the task's ``final`` one returns the learner's state: the ones
    before it hand over to the resident learner, and a state can be costly (a replay's
    contents are copied)."""
    t0 = time.time()
    replicas = tuple(range(algo.num_actors))
    actor, actor_built = resident_actor(ctx, algo, replicas, role="single",
                                        saved=learner_in.actors)
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    actor.set_weights(learner_in.weights, learner_in.version)
    t1, cpu = time.time(), time.process_time()
    batch = actor.rollout(algo.num_steps)
    t2, cpu2 = time.time(), time.process_time()
    stats = batch["stats"]
    stats["cpu_s"] = cpu2 - cpu
    with learner_threads(holder, ctx.learner_alone and not ctx.deterministic) as timed:
        metrics = learner.update([batch], ctx.progress())
        timed.skip_unless_trained(metrics)
    metrics.update(learner_threads=timed.threads, learner_cpu_s=time.process_time() - cpu2)
    holder["version"] = learner_in.version + 1
    stats.update(worker=worker_name(), built=actor_built, replica="all")
    keep_snapshot(ctx, actor, "single", replicas if len(replicas) > 1 else 0, stats)
    metrics.update(merge_stats([stats]))
    end = time.time()
    extra: dict[str, Any] = {"rollout_s": t2 - t1, "rollout_t_start": t0,
                             "learner_worker": worker_name(), "learner_built": built,
                             "learn_t_start": t2, "learn_t_end": end}
    metrics.update(extra)
    return LearnerOutput(learner_in.version + 1, learner.state_dict() if final else {},
                         learner.weights(), metrics, snapshots([stats]))


class Single(Distribution):
    """Everything on one worker: fused envs, inference and update (no communication).

    Parameters
    ----------
    iterations_per_task : int
        The most iterations one task runs (default 64; the driver sizes tasks to about
        ``RunSettings.task_s``). 1 keeps one task per iteration.
    threads : int
        Torch threads of the worker, rollout and update (default 0: the task's CPU grant,
        and for each update the cores the rollout leaves idle when timing shows that
        faster, :mod:`daskrl.core.learner_threads`). N > 0 fixes N.

    Examples
    --------
    >>> Single(iterations_per_task="4").max_count
    4
    """

    name = "single"
    serves_coordinator = True

    def __init__(self, iterations_per_task: int | str = 64, threads: int | str = 0) -> None:
        self.max_count = to_int("iterations_per_task", iterations_per_task)
        self.threads = to_int("threads", threads, minimum=0)

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``resizable-actor`` when there are several replicas (they run as one actor)."""
        if algo.num_actors == 1:
            return {}
        return {"resizable-actor": "pass --num-actors 1, or pick another --distribution"}

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """One fused fragment with the learner's resources (a GPU when offered)."""
        return [Fragment(fused_iterations, "learner", algo.resources_for("learner"))]

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        """``iterations_per_task``, or 1 in deterministic mode (tasks then match iterations)."""
        return 1 if inputs.deterministic else self.max_count

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """One fused task."""
        place = inputs.placement
        return task(fused_iterations, inputs.context("learner", 0), inputs.algo,
                    inputs.learner_in, inputs.count, self.threads, role="learner", replica=0,
                    iteration=inputs.iteration, run=inputs.run,
                    resources=place.resources["learner"], worker=place.worker("learner", 0))
