"""``single``: the whole loop fused on one worker (the Anakin/WarpDrive baseline).

One task per iteration steps every env of every replica as one vector env (one forward
pass per step over ``num_actors * num_envs`` envs), then updates the learner in the same
process: nothing moves between workers. ``iterations_per_task=m`` runs ``m`` rollout +
update rounds per task to amortise the Dask overhead of small iterations.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from dask.delayed import Delayed

from ..algorithm import Algorithm, LearnerOutput
from ..fragment import Fragment
from ..graph import task
from ..roles import (
    TaskContext,
    keep_snapshot,
    merge_stats,
    resident_actor,
    resident_learner,
    snapshots,
)
from ..state import worker_name
from .base import IterationInputs, to_int


def fused_iterations(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                     rounds: int = 1, threads: int = 0) -> LearnerOutput:
    """Roles ``rollout`` + ``learner`` fused: ``rounds`` rollouts and updates on this worker.

    ``threads > 0`` sets torch's intra-op threads of this worker process first (a lone
    worker on an idle machine may use every core for the update).

    Examples
    --------
    >>> from daskrl.algos.actor_critic import ActorCriticLearner, VecEnvActor
    >>> algo = Algorithm("t", lambda s: VecEnvActor("CartPole-v1", 2, s),
    ...                  lambda s, d: ActorCriticLearner(4, 2, s), print, num_steps=8,
    ...                  num_envs=2, num_actors=2)
    >>> learner = ActorCriticLearner(4, 2, 0)
    >>> start = LearnerOutput(0, learner.state_dict(), learner.weights())
    >>> ctx = TaskContext("doc", 1, 0, 0, 1)
    >>> out = fused_iterations(ctx, algo, start, rounds=2)
    >>> out.version, out.metrics["rounds"], out.metrics["env_steps"] <= 64
    (1, 2, True)
    """
    t0 = time.time()
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    replicas = tuple(range(algo.num_actors))
    actor, actor_built = resident_actor(ctx, algo, replicas, role="single",
                                        saved=learner_in.actors)
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    weights, stats, metrics = learner_in.weights, [], {}
    rollout_s = learn_s = 0.0
    for j in range(rounds):
        actor.set_weights(weights, learner_in.version * rounds + j)
        t1 = time.time()
        batch = actor.rollout(algo.num_steps)
        t2 = time.time()
        stats.append(batch["stats"])
        progress = (ctx.iteration * rounds + j) / (ctx.num_iterations * rounds)
        metrics = learner.update([batch], progress)
        weights = learner.weights()
        rollout_s, learn_s = rollout_s + t2 - t1, learn_s + time.time() - t2
    holder["version"] = learner_in.version + 1
    for s in stats:
        s.update(worker=worker_name(), built=actor_built, replica="all")
    keep_snapshot(ctx, actor, "single", replicas if len(replicas) > 1 else 0, stats[-1])
    metrics.update(merge_stats(stats))
    end = time.time()
    extra: dict[str, Any] = {"rounds": rounds, "rollout_s": rollout_s, "rollout_t_start": t0,
                             "learner_worker": worker_name(), "learner_built": built,
                             "learn_t_start": end - learn_s, "learn_t_end": end}
    metrics.update(extra)
    return LearnerOutput(learner_in.version + 1, learner.state_dict(), weights, metrics,
                         snapshots(stats))


class Single:
    """Everything on one worker: fused envs, inference and update (no communication).

    Parameters
    ----------
    iterations_per_task : int
        Rollout + update rounds per task (default 1); one driver iteration then takes
        ``iterations_per_task * algo.steps_per_iteration`` env steps.
    threads : int
        Torch threads of the worker for the update (default 0: leave the worker's setting,
        one thread under a nanny).

    Examples
    --------
    >>> Single(iterations_per_task="4").rounds
    4
    """

    name = "single"

    def __init__(self, iterations_per_task: int | str = 1, threads: int | str = 0) -> None:
        self.rounds = to_int("iterations_per_task", iterations_per_task)
        self.threads = to_int("threads", threads, minimum=0)

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """One fused fragment with the learner's resources (a GPU when offered)."""
        return [Fragment(fused_iterations, "learner", algo.resources_for("learner"))]

    def steps_per_iteration(self, algo: Algorithm) -> int:
        """Env steps per task: ``iterations_per_task`` rounds of every replica's envs."""
        return self.rounds * algo.steps_per_iteration

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """One fused task."""
        place = inputs.placement
        return task(fused_iterations, inputs.context("learner", 0), inputs.algo,
                    inputs.learner_in, self.rounds, self.threads, role="learner", replica=0,
                    iteration=inputs.iteration, run=inputs.run,
                    resources=place.resources["learner"], worker=place.worker("learner", 0))
