"""``actors-learner``: N actor replicas with their own envs, one learner (IMPALA/Acme layout).

Trajectories move actor -> learner once per rollout; weights learner -> actors once per
iteration, as the learner task's output that the next iteration's rollouts take as input.
Replicas placed on the same worker are fused into one rollout task that steps all their
envs with one forward pass per step; on-policy rollouts placed on the learner's worker run
inside the learner's task, one task per iteration (``fuse=false`` keeps one task per
replica and role), or per several iterations: the driver puts up to
``iterations_per_task`` (default 16) short iterations in one such task, so that Dask's
per-task cost (a scheduler round trip, a result fetch) is paid once for all of them.

``stale=1`` (opt-in; the default stays on-policy) lets the rollouts of iteration ``k + 1``
run while the learner updates on iteration ``k``'s batch: they take the weights of
iteration ``k - 1``, one update old (IMPALA-style one-step-stale acting; PPO's ratio is
then taken against the policy that acted). The learner is placed on another worker than
the rollouts when there is one, and the embedded cluster starts one more worker for it;
``policy_lag`` in the metrics is how many updates old the acting weights were. The
rollouts of two consecutive iterations can then be ready at once; each replica's still run
in iteration order (:func:`daskrl.core.worker_state.in_turn`), so a seed gives the same
numbers. Short
iterations run several to a group of tasks that pass batches and weights to each other
directly (:mod:`daskrl.distributions.stale_pipe`), with the same numbers.

What a learner output carries as its state (:func:`output_state`): the full state only when
the run may need it (the graph's output is checkpointed, or the run is deterministic);
between checkpoints a ``light-state`` learner's light state (an off-policy learner's without
its replay, which would otherwise be copied and sent to the driver at every update). A
learner rebuilt from a light state after its worker was lost restarts its replay empty and
reports ``replay_lost``; so does a resume from the checkpoint a run stopped between
checkpoints (Ctrl-C) writes on its way out (the checkpoint before it holds the replay).
Iterations before a task's last pass no state at all (their output never leaves the task).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from dask.delayed import Delayed

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.keys import task_key
from daskrl.core.placement import Placement, task
from daskrl.core.resources import Resources
from daskrl.core.roles import OutputState, TaskContext
from daskrl.distributions.base import (
    Distribution,
    IterationInputs,
    chained,
    pinned,
    to_bool,
    to_int,
)
from daskrl.distributions.stale_pipe import join, learn, learn_carried, learn_group, rollout_group

CARRIED = "carried"
"""What :meth:`ActorsLearner.acting_weights` returns when the iteration's batches were
collected by the group of tasks before (``stale=1``)."""


def output_state(inputs: IterationInputs) -> OutputState:
    """What the learner output of the graph of ``inputs`` carries as its state: ``"full"``
    when it is checkpointed (a periodic checkpoint, the run's last graph) or the run is
    deterministic (a rerun after a lost worker must continue bit-exactly), else
    ``"light"``.

    Examples
    --------
    >>> from daskrl.core.placement import Placement
    >>> inputs = IterationInputs(Algorithm("a", print, print, print, num_steps=1),
    ...                          Placement({}, {}), "r", 1, 3, 10, None)
    >>> output_state(inputs), output_state(dataclasses.replace(inputs, checkpoint=True))
    ('light', 'full')
    """
    return "full" if inputs.checkpoint or inputs.deterministic else "light"


def learner_context(inputs: IterationInputs, alone: bool = False, threads: int = 0
                    ) -> TaskContext:
    """The learner task's context, with the :func:`output_state` its output carries;
    ``alone``: no rollout computes while it updates (on-policy lockstep); ``threads``: the
    update's torch threads, fixed (0: not)."""
    return dataclasses.replace(inputs.context("learner", 0), output_state=output_state(inputs),
                               learner_alone=alone, learner_threads=threads)


def colocated(placement: Placement, role: str, replicas: int) -> list[tuple[int, ...]]:
    """Replicas of ``role`` grouped by the worker they are placed on, in replica order.

    Examples
    --------
    >>> p = Placement({}, {"rollout": ("a", "b", "a")})
    >>> colocated(p, "rollout", 3)
    [(0, 2), (1,)]
    """
    groups: dict[str | int, list[int]] = defaultdict(list)
    for r in range(replicas):
        worker = placement.worker(role, r)
        groups[r if worker is None else worker].append(r)  # unplanned: never fused
    return [tuple(g) for g in groups.values()]


class ActorsLearner(Distribution):
    """Multi-actor, single-learner distribution (MSRL's DP-A).

    Parameters
    ----------
    fuse : bool
        Run co-located rollout replicas as one batched actor, and on-policy rollouts on the
        learner's worker inside the learner's task (default True; several replicas are fused
        only when the algorithm declares ``resizable-actor``).
    stale : int
        0 (default): on-policy, each rollout waits for the previous update. 1: rollouts act
        with weights one update old, so they overlap the learner's update (see the module
        notes).
    iterations_per_task : int
        The most iterations one task runs when the rollouts run inside the learner's task,
        or (``stale=1``) one group of piped tasks (default 64; the driver sizes tasks to
        about ``RunSettings.task_s``). 1 keeps one task per iteration.
    threads : int
        Torch threads of the learner's update (default 0: on-policy, the update takes the
        cores the waiting rollouts leave idle when timing shows that faster,
        :mod:`daskrl.core.learner_threads`; with ``stale=1`` the task's CPU grant). N > 0
        fixes N.

    Notes
    -----
    With ``stale=1`` an instance keeps the state of the run it serves
    (:attr:`last_built`): what the iteration after the last graph it built acts with. Use
    one instance per run (:func:`~daskrl.distributions.get_distribution` builds a new one
    per call).

    Examples
    --------
    >>> ActorsLearner(fuse="false").fuse, ActorsLearner(stale="1").stale
    (False, 1)
    """

    name = "actors-learner"
    serves_coordinator = True

    def __init__(self, fuse: bool | str = True, stale: int | str = 0,
                 iterations_per_task: int | str = 64, threads: int | str = 0) -> None:
        self.fuse = to_bool("fuse", fuse)
        self.stale = to_int("stale", stale, minimum=0)
        self.max_count = to_int("iterations_per_task", iterations_per_task)
        self.threads = to_int("threads", threads, minimum=0)
        if self.stale > 1:
            raise ValueError(f"option stale={stale!r} must be 0 (on-policy) or 1 (rollouts "
                             "one update behind the learner)")
        self.last_built: tuple[str, int, Any] | None = None
        """Per-run state with ``stale=1``: (run, the iteration after the last graph built,
        what that iteration's first rollout acts with: weights, or :data:`CARRIED` when that
        graph also collected its batches). None before the first graph."""

    def workers_wanted(self, algo: Algorithm) -> int:
        """Workers the embedded cluster starts: one per replica, plus the learner's if stale."""
        return algo.num_actors + self.stale

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """Rollout replicas and one learner (apart from the rollouts when stale)."""
        apart = ("rollout",) if self.stale else ()
        return [
            Fragment(roles.rollout, "rollout", algo.resources_for("rollout"), algo.num_actors),
            Fragment(learn, "learner", algo.resources_for("learner"), apart_from=apart),
        ]

    def acting_weights(self, inputs: IterationInputs) -> tuple[Any, int | None]:
        """What the first rollout of ``inputs.iteration`` acts with, or :data:`CARRIED`;
        and the iteration whose rollouts must run before it, if any.

        On-policy, ``inputs.learner_in`` (and None: each rollout already waits for the
        update after the one before). With ``stale=1``, the weights one update older than
        ``inputs.learner_in`` (the previous iteration's input) when that iteration was the
        last one built in this run, and that iteration (its rollouts and these can be ready
        at once; the workers run them in order); :data:`CARRIED` when the group of
        iterations built last also collected this iteration's batches (they travel in
        ``LearnerOutput.carried``); else (the first iteration, a resubmission after a lost
        worker) ``inputs.learner_in`` itself. Updates :attr:`last_built`: call it once per
        graph built, in the order the graphs are built.
        """
        if not self.stale:
            return inputs.learner_in, None
        last = self.last_built
        acts_next = CARRIED if inputs.count > 1 else inputs.learner_in
        self.last_built = (inputs.run, inputs.iteration + inputs.count, acts_next)
        if last is not None and last[:2] == (inputs.run, inputs.iteration):
            return last[2], inputs.iteration - 1
        return inputs.learner_in, None

    def _rollouts(self, inputs: IterationInputs, acting: Any, after: int | None
                  ) -> list[Delayed]:
        """One rollout task per replica, or per worker when fused, acting with ``acting``
        once the rollouts of iteration ``after`` (if not None) ran on their workers."""
        algo, place, k = inputs.algo, inputs.placement, inputs.iteration
        return [
            task(roles.rollout, dataclasses.replace(inputs.context("rollout", g[0]), after=after),
                 algo, acting, algo.num_steps,
                 g if len(g) > 1 else (), role="rollout", replica=g[0],
                 iteration=k, run=inputs.run, resources=place.resources["rollout"],
                 worker=place.worker("rollout", g[0]))
            for g in self._groups(inputs)
        ]

    def _groups(self, inputs: IterationInputs) -> list[tuple[int, ...]]:
        """Rollout replicas that run as one task: per worker when fused, else one each."""
        replicas = inputs.algo.num_actors
        if self._fuses(inputs):
            return colocated(inputs.placement, "rollout", replicas)
        return [(r,) for r in range(replicas)]

    def _fuses(self, inputs: IterationInputs) -> bool:
        """Co-located replicas run as one actor: ``fuse``, not deterministic (fused envs
        would depend on the placement), and one replica or an actor that can be resized."""
        algo = inputs.algo
        return (self.fuse and not inputs.deterministic
                and (algo.num_actors == 1 or "resizable-actor" in algo.capabilities))

    def _workers(self, inputs: IterationInputs) -> tuple[str | None, set[str | None]]:
        """The learner's worker and the rollout replicas' workers (None: unplaced)."""
        place = inputs.placement
        return (place.worker("learner", 0),
                {place.worker("rollout", r) for r in range(inputs.algo.num_actors)})

    def _in_learner_task(self, inputs: IterationInputs) -> bool:
        """On-policy, fused, and every rollout replica on the learner's worker."""
        learner, rollouts = self._workers(inputs)
        return (learner is not None and rollouts == {learner} and self._fuses(inputs)
                and not self.stale)

    def _piped(self, inputs: IterationInputs) -> bool:
        """Stale, fused, and no rollout replica on the learner's worker (nor unplaced)."""
        learner, rollouts = self._workers(inputs)
        return (bool(self.stale) and self._fuses(inputs)
                and learner is not None and None not in rollouts and learner not in rollouts)

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        """``iterations_per_task`` when the rollouts run inside the learner's task, or
        stale rollouts on their own workers can be piped to it; else 1."""
        fits = self._in_learner_task(inputs) or self._piped(inputs)
        return self.max_count if fits else 1

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """Rollout tasks feeding one learner task.

        On-policy with every rollout replica on the learner's worker (one worker, or a
        worker per replica when ``--workers`` is 1), the rollouts run inside the learner
        task: the same calls, one Dask task (and scheduler round trip) per iteration
        instead of two, or per ``inputs.count`` iterations.
        """
        algo, place, k = inputs.algo, inputs.placement, inputs.iteration
        learner_worker = place.worker("learner", 0)
        if self._in_learner_task(inputs):
            replicas = tuple(range(algo.num_actors))
            return task(rollout_and_learn, learner_context(inputs, True, self.threads), algo,
                        inputs.learner_in, inputs.context("rollout", 0),
                        replicas if len(replicas) > 1 else (), inputs.count, role="learner",
                        replica=0, iteration=k, run=inputs.run,
                        resources=place.resources["learner"], worker=learner_worker)
        if inputs.count != 1:
            if not self._piped(inputs):
                raise ValueError(f"{self.name}: {inputs.count} iterations per task need the "
                                 "rollouts inside the learner's task, or stale=1 with the "
                                 "learner on a worker of its own")
            return self._piped_group(inputs)
        acting, after = self.acting_weights(inputs)
        if acting is CARRIED:  # the group before collected this iteration's batches
            return task(learn_carried, learner_context(inputs, False, self.threads), algo,
                        inputs.learner_in,
                        role="learner", replica=0, iteration=k, run=inputs.run,
                        resources=place.resources["learner"], worker=learner_worker)
        # on-policy the rollouts end before the update starts: the learner works alone
        return task(learn, learner_context(inputs, not self.stale, self.threads), algo,
                    inputs.learner_in, *self._rollouts(inputs, acting, after), role="learner",
                    replica=0, iteration=k, run=inputs.run,
                    resources=place.resources["learner"], worker=learner_worker)

    def _piped_group(self, inputs: IterationInputs) -> Delayed:
        """``inputs.count`` stale iterations: a rollout task per rollout worker and a learner
        task, running at once and passing batches and weights directly
        (:mod:`~daskrl.distributions.stale_pipe`), joined on the learner's worker."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        acting, _ = self.acting_weights(inputs)  # a group runs after the task before it
        carried = acting is CARRIED
        older = None if carried or acting is inputs.learner_in else acting
        groups = self._groups(inputs)
        rollouts = [
            task(rollout_group, inputs.context("rollout", g[0]), algo, inputs.learner_in,
                 older, carried, g if len(g) > 1 else (), inputs.count, rank,
                 len(groups) + 1, role="rollout", replica=g[0], iteration=k, run=run,
                 resources=place.resources["rollout"], worker=place.worker("rollout", g[0]))
            for rank, g in enumerate(groups, start=1)
        ]
        learner_worker = place.worker("learner", 0)
        learned = task(learn_group, learner_context(inputs, False, self.threads), algo,
                       inputs.learner_in,
                       len(groups), inputs.count, carried, role="learner", replica=0, iteration=k,
                       run=run, resources=place.resources["learner"], worker=learner_worker)
        return pinned(join, learned, *rollouts, key=task_key("join", 0, k, run),
                      resources=Resources(), worker=learner_worker)


def rollout_and_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                      rollout_ctx: TaskContext, replicas: tuple[int, ...], count: int = 1
                      ) -> LearnerOutput:
    """Roles ``rollout`` and ``learner`` in one task on the learner's worker (on-policy):
    :func:`daskrl.core.roles.rollout` (all replicas fused), then :func:`learn`, for ``count``
    consecutive iterations (see :func:`~daskrl.distributions.base.chained`). Only the last
    one's output leaves the task: those before it carry no state."""
    last = ctx.iteration + count - 1

    def one(it_ctx: TaskContext, current: LearnerOutput) -> LearnerOutput:
        r_ctx = dataclasses.replace(rollout_ctx, iteration=it_ctx.iteration)
        batch = roles.rollout(r_ctx, algo, current, algo.num_steps, replicas)
        if it_ctx.iteration < last:
            it_ctx = dataclasses.replace(it_ctx, output_state="none")
        return learn(it_ctx, algo, current, batch)

    return chained(ctx, learner_in, count, one)
