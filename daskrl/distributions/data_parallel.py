"""``data-parallel``: K fused actor+learner replicas whose gradients are averaged every step.

Each replica (``num_actors`` of them) owns its envs and a full learner. Every iteration it
rolls out, then runs its usual update; after every backward pass its gradients are
averaged over all replicas, so every optimiser step applies the same gradient everywhere
and the replicas stay bit-identical (checked each iteration: ``replicas_identical``).

Averaging (``allreduce=``):

- ``dask`` (default): each gradient computation ends a task. Every replica iterates the
  same plan of its learner (:class:`~daskrl.core.algorithm.GradientLearner`: ``minibatches``, then
  ``compute_gradients`` / ``apply_gradients`` per minibatch, see :class:`ReplicaUpdate`);
  task ``replica-<r>-it<k>-s<j>`` applies the average of step ``j - 1`` and returns the
  gradients of step ``j``; ``allreduce-0-it<k>-s<j>`` averages the K of them (a tree of
  4-way sums above 4 replicas). A learner whose ``update_plan()`` declares batch
  statistics (MAPPO's value normalisers) averages them first, in a round of their own.
  PPO's 4 epochs x 4 minibatches make 16 sync rounds per iteration, all visible in the
  dashboard. Averaging
  per minibatch (not per epoch) is what keeps this exactly synchronous SGD on the union of
  the replicas' minibatches, i.e. PPO with a K times larger batch; per-epoch parameter
  averaging would be cheaper but is a different algorithm (local SGD).
- ``torch``: one task per replica; ``torch.distributed`` (gloo on CPU, NCCL on GPU) started
  on the replicas' workers all-reduces the statistics and gradients between the same steps.
  Needs the K replicas on K different workers, all running at once.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
from dask.delayed import Delayed

from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.keys import step_key
from daskrl.core.placement import Placement, task
from daskrl.core.resources import Resources
from daskrl.core.roles import (
    TaskContext,
    merge_stats,
    snapshots,
)
from daskrl.core.worker_state import worker_name
from daskrl.distributions.base import (
    Distribution,
    IterationInputs,
    Unsupported,
    pinned,
)
from daskrl.distributions.replica import (
    ReplicaUpdate,
    finish_replica,
    round_split,
    start_replica,
    sync_rounds,
)

_NONE = Resources()
"""Averaging is cheap: it needs no resource slot and runs anywhere."""


def replica_first(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput) -> torch.Tensor:
    """Role ``replica`` (``allreduce=dask``): roll out, start the update, return the first
    tensor to average (see :class:`ReplicaUpdate`)."""
    holder, learner, batch = start_replica(ctx, algo, learner_in)
    holder["update"] = ReplicaUpdate(learner, [batch], ctx.progress())
    return holder["update"].start()


def replica_step(ctx: TaskContext, avg: torch.Tensor, step: int, steps: int) -> Any:
    """Role ``replica``: apply the average of round ``step - 1``; return round ``step``'s
    gradients. After the last round (``step == steps``) it returns the replica's output."""
    from daskrl.core.worker_state import resident

    def lost() -> Any:
        raise RuntimeError(f"data-parallel: replica {ctx.replica}'s update is not on worker "
                           f"{worker_name()!r} (its worker was lost mid-update); resume the "
                           "run from its last checkpoint with --resume")

    holder = resident((ctx.run, "replica", ctx.replica), lost)[0]
    update: ReplicaUpdate = holder["update"]
    flat = update.step(avg)
    if (flat is None) != (step == steps):
        raise RuntimeError(
            f"data-parallel: replica {ctx.replica}'s plan {'ended' if flat is None else 'went on'}"
            f" at sync round {step} of {steps}: its minibatches differ from the declared "
            "update_plan() (a batch smaller than num_minibatches?); raise --num-steps or lower "
            "--num-minibatches")
    if flat is not None:
        return flat
    del holder["update"]
    return finish_replica(ctx, holder, update)


def mean_of(*parts: torch.Tensor, count: int) -> torch.Tensor:
    """Role ``allreduce``: the sum of ``parts`` divided by ``count`` (``count=1``: a partial sum).

    Examples
    --------
    >>> mean_of(torch.ones(2), torch.zeros(2), count=2)
    tensor([0.5000, 0.5000])
    """
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total / count if count != 1 else total


def gather(ctx: TaskContext, learner_in: LearnerOutput, *outs: dict[str, Any]) -> LearnerOutput:
    """Role ``learner``: replica 0's weights and state, every replica's stats, identity check."""
    metrics = dict(outs[0]["metrics"])
    metrics.update(merge_stats([o["stats"] for o in outs]))
    digests = [o["digest"] for o in outs]
    metrics.update(round_split([o["phases"] for o in outs]))
    metrics.update(replicas_identical=len(set(digests)) == 1, replica_digests=";".join(digests),
                   learner_worker=";".join(o["worker"] for o in outs),
                   learner_built=any(o["built"] for o in outs),
                   learn_t_start=max(o["stats"]["t_end"] for o in outs), learn_t_end=time.time())
    return LearnerOutput(learner_in.version + 1, outs[0]["state"], outs[0]["weights"], metrics,
                         snapshots([o["stats"] for o in outs]))


def tree_mean(grads: list[Delayed], key: Any, fan_in: int = 4) -> Delayed:
    """Average ``grads`` by a tree of ``fan_in``-way sums (one task when K <= fan_in)."""
    level, depth = list(grads), 0
    while len(level) > fan_in:
        level = [pinned(partial(mean_of, count=1), *level[i : i + fan_in],
                        key=key(f"{depth}.{i}"), resources=_NONE, worker=None)
                 for i in range(0, len(level), fan_in)]
        depth += 1
    return pinned(partial(mean_of, count=len(grads)), *level, key=key(""), resources=_NONE,
                  worker=None)


class DataParallel(Distribution):
    """K fused actor+learner replicas with gradients averaged every step (MSRL's DP-C).

    Parameters
    ----------
    allreduce : {"dask", "torch"}
        Average by Dask tasks (visible in the dashboard) or by ``torch.distributed``.

    Examples
    --------
    >>> DataParallel(allreduce="torch").allreduce
    'torch'
    """

    name = "data-parallel"
    requires = frozenset({"gradients"})

    def __init__(self, allreduce: str = "dask") -> None:
        if allreduce not in ("dask", "torch"):
            raise ValueError(f"option allreduce={allreduce!r}: choose dask or torch")
        self.allreduce = allreduce
        self.steps: tuple[Algorithm, int] | None = None
        """Per-run state: the algorithm of this run and its backward passes per update."""

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``gradients``: replicas average them before every optimiser step."""
        return {"gradients": "pick actors-learner or single, which need no gradient exchange"}

    def check(self, algo: Algorithm) -> None:
        """The capability check, then the learner's own plan: one whose replicas could step
        different numbers of times (PPO with ``target_kl``) is refused here, in one line."""
        super().check(algo)
        try:
            self.gradient_steps(algo)
        except ValueError as exc:
            raise Unsupported(f"the 'data-parallel' distribution cannot serve "
                              f"{algo.name!r}: {exc}") from None

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """K replicas with the learner's resources (each replica is a learner)."""
        return [Fragment(replica_first, "replica", algo.resources_for("learner"),
                         algo.num_actors),
                Fragment(gather, "learner", algo.resources_for("learner"))]

    def check_placement(self, placement: Placement, algo: Algorithm) -> None:
        """Raise ``ValueError`` when ``allreduce=torch`` replicas would share a worker (they
        all run at once, one process-group rank each). The driver calls it when it places
        the fragments, so after a lost worker it waits for a replacement."""
        workers = [placement.worker("replica", r) for r in range(algo.num_actors)]
        if self.allreduce == "torch" and len(set(workers)) < len(workers):
            raise ValueError(
                f"data-parallel:allreduce=torch needs {algo.num_actors} replicas on "
                f"different workers, got {workers}: start more workers offering "
                f"{placement.resources['replica']} or lower --num-actors")

    def task_floor_s(self, algo: Algorithm, hop_s: float) -> float:
        """``allreduce=dask``: a ``replica`` task and an ``allreduce`` task per sync round
        (:meth:`gradient_steps`), chained; ``torch``: none (one task per replica)."""
        return 0.0 if self.allreduce == "torch" else 2 * self.gradient_steps(algo) * hop_s

    def gradient_steps(self, algo: Algorithm) -> int:
        """All-reduce rounds per update (:func:`sync_rounds`), asked of a learner built on
        the driver once per run."""
        if self.steps is None or self.steps[0] is not algo:
            self.steps = (algo, sync_rounds(algo.make_learner(0, "cpu")))
        return self.steps[1]

    def replicas(self, inputs: IterationInputs) -> list[Delayed]:
        """Each replica's final output (its chain of sync steps, or one torch task)."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        res = place.resources["replica"]
        workers = [place.worker("replica", r) for r in range(algo.num_actors)]
        ctxs = [inputs.context("replica", r) for r in range(algo.num_actors)]
        if self.allreduce == "torch":
            from daskrl.distributions.torch_allreduce import replica_torch

            self.check_placement(place, algo)
            return [task(replica_torch, ctxs[r], algo, inputs.learner_in, tuple(workers),
                         role="replica", replica=r, iteration=k, run=run, resources=res,
                         worker=workers[r]) for r in range(algo.num_actors)]
        steps = self.gradient_steps(algo)
        grads = [pinned(replica_first, ctxs[r], algo, inputs.learner_in,
                        key=step_key("replica", r, k, 0, run), resources=res, worker=workers[r])
                 for r in range(algo.num_actors)]
        for s in range(1, steps + 1):
            avg = tree_mean(grads, lambda sub, s=s: step_key("allreduce", sub or 0, k, s - 1, run))
            grads = [pinned(replica_step, ctxs[r], avg, s, steps,
                            key=step_key("replica", r, k, s, run), resources=res,
                            worker=workers[r]) for r in range(algo.num_actors)]
        return grads

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """Replica chains joined by allreduce tasks, gathered by one learner task."""
        place = inputs.placement
        return task(gather, inputs.context("learner", 0), inputs.learner_in,
                    *self.replicas(inputs), role="learner", replica=0,
                    iteration=inputs.iteration, run=inputs.run,
                    resources=place.resources["learner"], worker=place.worker("replica", 0))
