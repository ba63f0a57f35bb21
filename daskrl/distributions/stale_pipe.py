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

When a fragment raises (an env crash after its retries, a learner error), its task sends
:class:`Stopped` where its partners expect the next batch or weights, and re-raises: the
partners return at once, without an error of their own, so the run stops with the one
error that happened (its inputs saved for ``daskrl replay`` from the inner fragment call,
which needs no process group), and no worker thread is left waiting for a peer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput
from daskrl.core.failures import Call, PeerLost
from daskrl.core.keys import task_key
from daskrl.core.roles import TaskContext
from daskrl.distributions.base import chained
from daskrl.distributions.torch_allreduce import ensure_group

WHO = "actors-learner:stale=1"


@dataclasses.dataclass(frozen=True)
class Stopped:
    """Sent in place of a batch or weights by a task whose fragment raised: the partner
    returns without an error of its own (the raising task's error is the run's)."""

    rank: int


class _PartnerStopped(Exception):
    """A partner task sent :class:`Stopped`."""


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
    """The next object from rank ``src``; :class:`_PartnerStopped` if it was :class:`Stopped`."""
    box: list[Any] = [None]
    try:
        dist.recv_object_list(box, src=src)
    except RuntimeError as exc:
        raise PeerLost(f"{WHO}: rank {src} of the group is gone ({exc})") from None
    if isinstance(box[0], Stopped):
        raise _PartnerStopped(src)
    return box[0]


def rollout_group(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                  older: LearnerOutput | None, carried: bool, replicas: tuple[int, ...],
                  count: int, rank: int, world: int) -> Batch | None:
    """Role ``rollout``: the (fused) ``replicas``' rollouts of iterations ``k + 1`` (``k``
    unless ``carried``) to ``k + count``, each batch sent to the learner's task as soon as
    it is collected but the last, which is returned for the next group (None when the
    learner's task stopped the group).

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
            try:
                acting = _recv(0)
            except _PartnerStopped:
                return None  # the learner's error stops the run
        step = dataclasses.replace(ctx, iteration=i)
        try:
            batch = Call(roles.rollout, task_key("rollout", ctx.replica, i, ctx.run))(
                step, algo, acting, algo.num_steps, replicas)
        except Exception:
            if i < k + count:  # the learner waits for this batch
                _best_effort(_send, Stopped(rank), 0)
            raise
        if i < k + count:
            _send(batch, 0)
    return batch


def learn_group(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, ranks: int,
                count: int, carried: bool) -> LearnerOutput:
    """Role ``learner``: ``count`` updates, each on the batches that the ``ranks`` rollout
    tasks send (the first on ``learner_in.carried`` when ``carried``); each update's
    weights go back to them for the rollout two iterations on."""

    ensure_group(ctx.run, 0, ranks + 1, "gloo", who=WHO)
    first = _carried(learner_in, ranks) if carried else []
    k, end = ctx.iteration, ctx.iteration + count

    def one(it_ctx: TaskContext, current: LearnerOutput) -> LearnerOutput:
        j = it_ctx.iteration - k
        if j == 0 and carried:
            batches = first
        else:
            batches, stopped = [], set()
            for rank in range(1, ranks + 1):
                try:
                    batches.append(_recv(rank))
                except _PartnerStopped:
                    stopped.add(rank)
            if stopped:  # a rollout task raised: stop the others, return quietly
                for rank in set(range(1, ranks + 1)) - stopped:
                    _best_effort(_stop_rollout, rank, k + j + 1, k + j + 1, k, end)
                raise _PartnerStopped(min(stopped))
        if j >= 1:  # rollout k + j + 1 acts with this update's input
            for rank in range(1, ranks + 1):
                _send(acting_copy(current), rank)
        try:
            return Call(learn, task_key("learner", 0, it_ctx.iteration, ctx.run))(
                it_ctx, algo, dataclasses.replace(current, carried=[]), *batches)
        except Exception:
            for rank in range(1, ranks + 1):
                _best_effort(_stop_rollout, rank, k + j + 1, k + j + 2 if j >= 1 else k + j + 1,
                             k, end)
            raise

    try:
        return chained(ctx, learner_in, count, one)
    except _PartnerStopped:
        return learner_in  # the rollout task's error is the run's


def _best_effort(fn: Any, *args: Any) -> None:
    """``fn(*args)``, unless a peer is gone: the error being raised is the one to keep."""
    try:
        fn(*args)
    except PeerLost:
        pass


def _stop_rollout(rank: int, at: int, weights_for: int, k: int, end: int) -> None:
    """Make rollout task ``rank`` of group ``k .. end`` return: it is at step ``at`` (has
    sent the batches before it) and has the weights of the steps before ``weights_for``.

    A step from ``k + 2`` on waits for its weights: it gets :class:`Stopped` instead. A step
    with its weights acts and sends its batch (but the last), which is taken first.
    """
    i = at
    while i <= end:
        if i >= k + 2 and i >= weights_for:
            _send(Stopped(0), rank)
            return
        if i == end:
            return  # it returns its last batch by itself
        try:
            _recv(rank)  # batch i
        except _PartnerStopped:
            return
        i += 1


def join(learner_out: LearnerOutput, *batches: Batch) -> LearnerOutput:
    """The learner's output, carrying the next iteration's batches that the group's rollout
    tasks returned (in rank order)."""
    return dataclasses.replace(learner_out, carried=list(batches))


def learn_carried(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput
                  ) -> LearnerOutput:
    """Role ``learner``: one update on the batches ``learner_in`` carries (a group before
    collected them)."""

    batches = _carried(learner_in, len(learner_in.carried))
    return learn(ctx, algo, dataclasses.replace(learner_in, carried=[]), *batches)


def _carried(learner_in: LearnerOutput, ranks: int) -> list[Batch]:
    if not learner_in.carried or len(learner_in.carried) != ranks:
        raise RuntimeError(f"{WHO}: iteration expected {ranks} batches from the group of tasks "
                           f"before, got {len(learner_in.carried)}")
    return list(learner_in.carried)


def learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, *batches: Batch
          ) -> LearnerOutput:
    """Role ``learner``: :func:`daskrl.core.roles.learn`, plus ``policy_lag`` (updates between
    the weights the batches were collected with and the ones updated now; 0 on-policy)."""
    out = roles.learn(ctx, algo, learner_in, *batches)
    versions = [b["stats"].get("policy_version") for b in batches]
    if all(isinstance(v, int) and v >= 0 for v in versions):
        out.metrics["policy_lag"] = learner_in.version - min(versions)
    return out
