"""``actors-learner:stale=1`` with several iterations per task: rollouts and learner piped.

When iterations are short, the driver gives each rollout worker one task and the learner one
task for a group of ``count`` iterations ``k .. k + count - 1``. The tasks run at once and
pass batches (rollout -> learner) and weights (learner -> rollouts) straight between their
workers over ``torch.distributed`` (gloo), so the scheduler is not involved per iteration.
Rollout ``i`` acts with the weights of update ``i - 2``, exactly as with one task per
iteration (same numbers, tested), so it overlaps update ``i - 1``:

==============  ==============================  ========================================
step            rollout task (rank r >= 1)      learner task (rank 0)
==============  ==============================  ========================================
k               act with w[k-2]; send           receive batch k; update -> w[k]
k + 1           act with w[k-1]; send           receive batch k+1; send w[k]; update
k + j           receive w[k+j-2]; act; send     receive batch k+j; send w[k+j-1]; update
k + count       receive w[k+count-2]; act;      (the next group's first batch)
                return the batch
==============  ==============================  ========================================

A rollout task ends with the next group's first rollout, so that the next group's learner
starts on a batch at once while its rollout tasks collect the one after: the pipeline does
not drain between groups. A ``join`` task on the learner's worker hands that batch over in
``LearnerOutput.carried``; a group that starts with a carried batch skips step ``k`` on
the rollout side. Sends and receives alternate in the same order on both ends, so the
blocking point-to-point calls cannot deadlock.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist

from .. import roles
from ..algorithm import Algorithm, Batch, LearnerOutput
from ..failures import PeerLost
from ..roles import TaskContext
from .base import chained
from .torch_allreduce import ensure_group

WHO = "actors-learner:stale=1"


def acting_copy(out: LearnerOutput) -> LearnerOutput:
    """What rollouts need of a learner output: its version and weights (no optimiser state).

    Examples
    --------
    >>> acting_copy(LearnerOutput(3, {"optimizer": 1}, {"w": 0})).state
    {}
    """
    return LearnerOutput(out.version, {}, out.weights)


def _send(obj: Any, dst: int) -> None:
    try:
        dist.send_object_list([obj], dst=dst)
    except RuntimeError as exc:  # gloo: the peer's connection closed or timed out
        raise PeerLost(f"{WHO}: rank {dst} of the group is gone ({exc})") from None


def _recv(src: int) -> Any:
    box: list[Any] = [None]
    try:
        dist.recv_object_list(box, src=src)
    except RuntimeError as exc:
        raise PeerLost(f"{WHO}: rank {src} of the group is gone ({exc})") from None
    return box[0]


def rollout_group(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                  older: LearnerOutput | None, carried: bool, replicas: tuple[int, ...],
                  count: int, rank: int, world: int) -> Batch:
    """Role ``rollout``: the (fused) ``replicas``' rollouts of iterations ``k + 1`` (``k``
    unless ``carried``) to ``k + count``, each batch sent to the learner's task as soon as
    it is collected but the last, which is returned for the next group.

    ``older`` is what rollout ``k`` acts with (``learner_in`` when None: the run's start).
    """
    ensure_group(ctx.run, rank, world, "gloo", who=WHO)
    k = ctx.iteration
    batch: Batch = {}
    for i in range(k + 1 if carried else k, k + count + 1):
        if i == k:
            acting = older if older is not None else learner_in
        elif i == k + 1:
            acting = learner_in
        else:
            acting = _recv(0)
        batch = roles.rollout(dataclasses.replace(ctx, iteration=i), algo, acting,
                              algo.num_steps, replicas)
        if i < k + count:
            _send(batch, 0)
    return batch


def learn_group(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, ranks: int,
                count: int, carried: bool) -> LearnerOutput:
    """Role ``learner``: ``count`` updates, each on the batches that the ``ranks`` rollout
    tasks send (the first on ``learner_in.carried`` when ``carried``); each update's
    weights go back to them for the rollout two iterations on."""
    from .actors_learner import learn

    ensure_group(ctx.run, 0, ranks + 1, "gloo", who=WHO)
    first = _carried(learner_in, ranks) if carried else []

    def one(it_ctx: TaskContext, current: LearnerOutput) -> LearnerOutput:
        j = it_ctx.iteration - ctx.iteration
        if j == 0 and carried:
            batches = first
        else:
            batches = [_recv(rank) for rank in range(1, ranks + 1)]
        if j >= 1:  # rollout k + j + 1 acts with this update's input
            for rank in range(1, ranks + 1):
                _send(acting_copy(current), rank)
        return learn(it_ctx, algo, dataclasses.replace(current, carried=[]), *batches)

    return chained(ctx, learner_in, count, one)


def join(learner_out: LearnerOutput, *batches: Batch) -> LearnerOutput:
    """The learner's output, carrying the next iteration's batches that the group's rollout
    tasks returned (in rank order)."""
    return dataclasses.replace(learner_out, carried=list(batches))


def learn_carried(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput
                  ) -> LearnerOutput:
    """Role ``learner``: one update on the batches ``learner_in`` carries (a group before
    collected them)."""
    from .actors_learner import learn

    batches = _carried(learner_in, len(learner_in.carried))
    return learn(ctx, algo, dataclasses.replace(learner_in, carried=[]), *batches)


def _carried(learner_in: LearnerOutput, ranks: int) -> list[Batch]:
    if not learner_in.carried or len(learner_in.carried) != ranks:
        raise RuntimeError(f"{WHO}: iteration expected {ranks} batches from the group of tasks "
                           f"before, got {len(learner_in.carried)}")
    return list(learner_in.carried)
