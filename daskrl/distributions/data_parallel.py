"""``data-parallel``: K fused actor+learner replicas whose gradients are averaged every step.

Each replica (``num_actors`` of them) owns its envs and a full learner. Every iteration it
rolls out, then runs its usual update; after every backward pass its gradients are
averaged over all replicas, so every optimiser step applies the same gradient everywhere
and the replicas stay bit-identical (checked each iteration: ``replicas_identical``).

Averaging (``allreduce=``):

- ``dask`` (default): each backward pass ends a task. The update of a replica runs in a
  thread that parks after each backward pass; task ``replica-<r>-it<k>-s<j>`` hands it the
  average of step ``j - 1`` and returns the gradients of step ``j``; ``allreduce-0-it<k>-s<j>``
  averages the K of them (a tree of 4-way sums above 4 replicas). PPO's 4 epochs x 4
  minibatches make 16 sync rounds per iteration, all visible in the dashboard. Averaging
  per minibatch (not per epoch) is what keeps this exactly synchronous SGD on the union of
  the replicas' minibatches, i.e. PPO with a K times larger batch; per-epoch parameter
  averaging would be cheaper but is a different algorithm (local SGD).
- ``torch``: one task per replica; ``torch.distributed`` (gloo on CPU, NCCL on GPU) started
  on the replicas' workers all-reduces the gradients inside the update. Needs the K replicas
  on K different workers, all running at once.
"""

from __future__ import annotations

import queue
import threading
import time
from functools import partial
from typing import Any

import torch
from dask.delayed import Delayed

from ..algorithm import Algorithm, Batch, LearnerOutput, require
from ..checkpoint import weights_sha256
from ..fragment import Fragment
from ..graph import Placement, task
from ..resources import Resources
from ..roles import (
    TaskContext,
    keep_snapshot,
    merge_stats,
    resident_actor,
    resident_learner,
    snapshots,
)
from ..state import worker_name
from .base import IterationInputs, pinned, step_key

WAIT_S = 600.0
"""How long a parked update waits for the next average before giving up."""

_NONE = Resources()
"""Averaging is cheap: it needs no resource slot and runs anywhere."""


class GradExchange:
    """Runs ``learner.update`` in a thread that parks after every backward pass.

    :meth:`next` returns ``("grads", flat)`` at each park or ``("done", metrics)``;
    :meth:`send` resumes the update with the averaged gradients.
    """

    def __init__(self, learner: Any, batches: list[Batch], progress: float) -> None:
        self.out_q: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.in_q: queue.Queue[torch.Tensor | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(learner, batches, progress),
                                       daemon=True, name="daskrl-grad-exchange")
        self.thread.start()

    def _run(self, learner: Any, batches: list[Batch], progress: float) -> None:
        try:
            self.out_q.put(("done", learner.update(batches, progress, grad_hook=self._hook)))
        except BaseException as exc:  # noqa: BLE001 - handed to the task that waits
            self.out_q.put(("error", exc))

    def _hook(self, grads: list[torch.Tensor]) -> None:
        self.out_q.put(("grads", flatten(grads)))
        avg = self.in_q.get(timeout=WAIT_S)
        if avg is None:
            raise RuntimeError("data-parallel update stopped")
        unflatten_into(avg, grads)

    def next(self) -> tuple[str, Any]:
        """Wait for the next park or the end of the update."""
        kind, value = self.out_q.get(timeout=WAIT_S)
        if kind == "error":
            raise value
        return kind, value

    def send(self, avg: torch.Tensor) -> None:
        """Resume the update with the averaged gradients of the last park."""
        self.in_q.put(avg)

    def close(self) -> None:
        """Stop a parked update (end of run)."""
        self.in_q.put(None)


def flatten(grads: list[torch.Tensor]) -> torch.Tensor:
    """All gradients as one flat CPU tensor (what travels between workers).

    Examples
    --------
    >>> flatten([torch.ones(2, 2), torch.zeros(3)]).shape
    torch.Size([7])
    """
    return torch.cat([g.detach().reshape(-1) for g in grads]).cpu()


def unflatten_into(flat: torch.Tensor, grads: list[torch.Tensor]) -> None:
    """Copy a flat tensor back into ``grads`` in place (their devices kept).

    Examples
    --------
    >>> g = [torch.zeros(2), torch.zeros(1)]; unflatten_into(torch.arange(3.0), g); g[1]
    tensor([2.])
    """
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def digest(weights: dict[str, torch.Tensor]) -> str:
    """A short :func:`~daskrl.checkpoint.weights_sha256` (equal iff bit-identical).

    Examples
    --------
    >>> digest({"w": torch.zeros(2)}) == digest({"w": torch.zeros(2)})
    True
    """
    return weights_sha256(weights)[:16]


def _start(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput
           ) -> tuple[dict[str, Any], Any, Batch]:
    """Resident learner and actor of this replica, and this iteration's rollout."""
    holder, built = resident_learner(ctx, algo, learner_in, role="replica")
    learner = holder["learner"]
    require(learner, "update", "data-parallel", "use a learner whose update takes grad_hook=")
    actor, actor_built = resident_actor(ctx, algo, saved=learner_in.actors)
    actor.set_weights(learner_in.weights, learner_in.version)
    batch = actor.rollout(algo.num_steps)
    batch["stats"].update(worker=worker_name(), built=actor_built, replica=ctx.replica)
    keep_snapshot(ctx, actor, "rollout", ctx.replica, batch["stats"])
    holder.update(stats=batch["stats"], built=built)
    return holder, learner, batch


def replica_first(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput) -> torch.Tensor:
    """Role ``replica`` (``allreduce=dask``): roll out, start the update, return step 0's grads."""
    holder, learner, batch = _start(ctx, algo, learner_in)
    old = holder.pop("exchange", None)
    if old is not None:
        old.close()
    holder["exchange"] = GradExchange(learner, [batch], ctx.iteration / ctx.num_iterations)
    return _expect(holder["exchange"].next(), "grads", ctx, 0)


def replica_step(ctx: TaskContext, avg: torch.Tensor, step: int, steps: int) -> Any:
    """Role ``replica``: apply the average of step ``step - 1``; return step ``step``'s grads.

    After the last step (``step == steps``) it returns the replica's output instead.
    """
    from ..state import resident

    def lost() -> Any:
        raise RuntimeError(f"data-parallel: replica {ctx.replica}'s update is not on worker "
                           f"{worker_name()!r} (its worker was lost mid-update); resume the "
                           "run from its last checkpoint with --resume")

    holder = resident((ctx.run, "replica", ctx.replica), lost)[0]
    exchange: GradExchange = holder["exchange"]
    exchange.send(avg)
    if step < steps:
        return _expect(exchange.next(), "grads", ctx, step)
    metrics = _expect(exchange.next(), "done", ctx, step)
    del holder["exchange"]
    return _finish(ctx, holder, metrics)


def _expect(got: tuple[str, Any], kind: str, ctx: TaskContext, step: int) -> Any:
    if got[0] != kind:
        raise RuntimeError(
            f"data-parallel: replica {ctx.replica} reached '{got[0]}' at sync step {step}, "
            f"expected '{kind}': replicas took different numbers of gradient steps (a batch "
            "smaller than num_minibatches**2?); raise --num-steps or lower --num-minibatches")
    return got[1]


def _finish(ctx: TaskContext, holder: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    learner = holder["learner"]
    holder["version"] += 1
    weights = learner.weights()
    out = {"metrics": metrics, "stats": holder.pop("stats"), "digest": digest(weights),
           "worker": worker_name(), "built": holder.get("built", False)}
    if ctx.replica == 0:
        out.update(state=learner.state_dict(), weights=weights)
    return out


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


class DataParallel:
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

    def __init__(self, allreduce: str = "dask") -> None:
        if allreduce not in ("dask", "torch"):
            raise ValueError(f"option allreduce={allreduce!r}: choose dask or torch")
        self.allreduce = allreduce
        self._steps: dict[int, int] = {}

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

    def gradient_steps(self, algo: Algorithm) -> int:
        """Backward passes per update, asked of a learner built once on the driver."""
        if id(algo) not in self._steps:
            learner = algo.make_learner(0, "cpu")
            require(learner, "gradient_steps", "data-parallel",
                    "give the learner gradient_steps() (see ActorCriticLearner)")
            self._steps = {id(algo): int(learner.gradient_steps())}
        return self._steps[id(algo)]

    def replicas(self, inputs: IterationInputs) -> list[Delayed]:
        """Each replica's final output (its chain of sync steps, or one torch task)."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        res = place.resources["replica"]
        workers = [place.worker("replica", r) for r in range(algo.num_actors)]
        ctxs = [inputs.context("replica", r) for r in range(algo.num_actors)]
        if self.allreduce == "torch":
            from .torch_allreduce import replica_torch

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
