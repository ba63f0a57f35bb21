"""One data-parallel replica: its resident learner and actor, and an update stepped from
outside between all-reduces (by Dask tasks or by ``torch.distributed``)."""

from __future__ import annotations

from typing import Any

import torch

from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput
from daskrl.core.roles import TaskContext, keep_snapshot, resident_actor, resident_learner
from daskrl.core.weights import weights_sha256
from daskrl.core.worker_state import worker_name


class ReplicaUpdate:
    """One replica's update on its batches, stepped from outside between all-reduces.

    :meth:`start` returns the first tensor to average (the learner's batch statistics when
    its ``update_plan()`` declares them, else the gradients of the first minibatch); each
    :meth:`step` takes the average of the last tensor, applies it (statistics: begins the
    plan with them; gradients: ``apply_gradients``) and returns the next gradients, or None
    when the plan is done; :meth:`finish` returns the update's metrics.

    Examples
    --------
    >>> import numpy as np
    >>> from daskrl.algos.learner import ActorCriticLearner
    >>> from daskrl.algos.ppo import PPOHyper
    >>> learner = ActorCriticLearner(4, 2, 0, (8, 8), PPOHyper(1, 2))
    >>> z = np.zeros(8, np.float32)
    >>> batch = {"obs": np.zeros((8, 4), np.float32), "actions": z.astype(np.int64),
    ...          "logp": z - 0.7, "values": z, "advantages": z + 1, "returns": z + 1}
    >>> update, rounds = ReplicaUpdate(learner, [batch], 0.0), 1
    >>> flat = update.start()
    >>> while flat is not None:
    ...     flat, rounds = update.step(flat), rounds + 1
    >>> rounds, "losses/policy_loss" in update.finish()
    (3, True)
    """

    def __init__(self, learner: Any, batches: list[Batch], progress: float) -> None:
        self.learner, self.batches, self.progress = learner, batches, progress
        self.plan: list[Any] | None = None
        self.done: list[dict[str, float]] = []
        self.grads: list[torch.Tensor] = []

    def start(self) -> torch.Tensor:
        """The first flat tensor to average across the replicas."""
        if self.learner.update_plan().statistics:
            return self.learner.statistics(self.batches).reshape(-1).cpu()
        self.plan = self.learner.minibatches(self.batches, self.progress)
        return self._compute()

    def step(self, avg: torch.Tensor) -> torch.Tensor | None:
        """Apply the average of the last tensor; the next gradients, or None at the end."""
        if self.plan is None:
            self.plan = self.learner.minibatches(self.batches, self.progress, avg)
        else:
            unflatten_into(avg, self.grads)
            self.learner.apply_gradients(self.grads)
        return self._compute() if len(self.done) < len(self.plan) else None

    def _compute(self) -> torch.Tensor:
        assert self.plan is not None
        grads, metrics = self.learner.compute_gradients(self.plan[len(self.done)])
        self.done.append(metrics)
        self.grads = grads
        return flatten(grads)

    def finish(self) -> dict[str, float]:
        """The update's metrics (``finish_update`` of the learner)."""
        return self.learner.finish_update(self.done)


def sync_rounds(learner: Any) -> int:
    """All-reduce rounds of one update of ``learner``: its gradient steps, plus one for its
    batch statistics when it declares them.

    Examples
    --------
    >>> from daskrl.algos.learner import ActorCriticLearner
    >>> sync_rounds(ActorCriticLearner(4, 2, 0))
    16
    """
    plan = learner.update_plan()
    return int(plan.steps) + int(plan.statistics)


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
    """A short :func:`~daskrl.core.weights.weights_sha256` (equal iff bit-identical).

    Examples
    --------
    >>> digest({"w": torch.zeros(2)}) == digest({"w": torch.zeros(2)})
    True
    """
    return weights_sha256(weights)[:16]


def start_replica(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput
                  ) -> tuple[dict[str, Any], Any, Batch]:
    """Resident learner and actor of this replica, and this iteration's rollout."""
    holder, built = resident_learner(ctx, algo, learner_in, role="replica")
    learner = holder["learner"]
    actor, actor_built = resident_actor(ctx, algo, saved=learner_in.actors)
    actor.set_weights(learner_in.weights, learner_in.version)
    batch = actor.rollout(algo.num_steps)
    batch["stats"].update(worker=worker_name(), built=actor_built, replica=ctx.replica)
    keep_snapshot(ctx, actor, "rollout", ctx.replica, batch["stats"])
    holder.update(stats=batch["stats"], built=built)
    return holder, learner, batch


def finish_replica(ctx: TaskContext, holder: dict[str, Any], metrics: dict[str, Any]
                   ) -> dict[str, Any]:
    """The replica's output after its update: metrics, stats, weight digest (and replica
    0's weights and state)."""
    learner = holder["learner"]
    holder["version"] += 1
    weights = learner.weights()
    out = {"metrics": metrics, "stats": holder.pop("stats"), "digest": digest(weights),
           "worker": worker_name(), "built": holder.get("built", False)}
    if ctx.replica == 0:
        out.update(state=learner.state_dict(), weights=weights)
    return out
