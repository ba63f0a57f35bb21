"""``apex``: distributed prioritised replay (Ape-X, Horgan et al. 2018).

Three roles, each on its own workers when there are enough:

- ``rollout``: N actors, each acting with its own exploration rate from the ladder
  ``eps_i = 0.4 ** (1 + 7 i / (N - 1))``, folding n-step transitions and computing their
  initial priorities (|TD error| under its weights). An actor refreshes its weights every
  ``refresh_every`` iterations, not every iteration, so it runs ahead of the learner (up to the
  driver's look-ahead); ``policy_lag`` in the metrics is how many updates old the acting
  weights were.
- ``replay``: ``Algorithm.replay_shards`` shards (resident on their workers; resources of
  the ``replay`` role). Actor ``i`` writes to shard ``i mod shards``. Each iteration a
  shard applies the priorities the learner sent back, adds its actors' transitions and
  samples for the learner.
- ``learner``: merges the shards' samples in proportion to their total priorities
  (:meth:`daskrl.core.replay.ReplayLearner.learn_from`) and returns new priorities with its
  output (``LearnerOutput.carried``).

The shard task of iteration ``k`` applies the priorities of learner ``k - 2``, so it runs
while learner ``k - 1`` trains: the learner does not wait for its sample. Shards and actors
live in worker-resident state of the attempt: after a lost worker, the driver places the
fragments again and they are rebuilt empty; ``replay_lost`` in the metrics counts the
transitions lost, and the run goes on. Shards are not checkpointed: a resumed run starts
with empty shards and says so. The results depend on the order tasks finish: no
``--deterministic``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, cast

from dask.delayed import Delayed

from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.placement import task
from daskrl.core.replay import ExploringActor, ReplayLearner
from daskrl.core.roles import TaskContext, merge_stats, resident_actor, resident_learner
from daskrl.core.worker_state import in_turn, resident, worker_name
from daskrl.distributions.base import Distribution, IterationInputs, Unsupported, to_int


def epsilon_ladder(i: int, n: int, base: float = 0.4, spread: float = 7.0) -> float:
    """Ape-X's exploration rate of actor ``i`` of ``n``: ``base ** (1 + spread i / (n - 1))``.

    Examples
    --------
    >>> [round(epsilon_ladder(i, 3), 4) for i in range(3)]
    [0.4, 0.0162, 0.0007]
    >>> epsilon_ladder(0, 1)
    0.4
    """
    if n <= 1:
        return base
    return base ** (1 + spread * i / (n - 1))


def apex_rollout(ctx: TaskContext, algo: Algorithm, weights_from: LearnerOutput,
                 steps: int) -> Batch:
    """Role ``rollout``: ``steps`` steps of this replica's resident actor at its ladder
    epsilon, loading ``weights_from``'s weights when they are newer than its own."""
    key = (ctx.run, "rollout", ctx.replica)
    with in_turn(key, ctx.iteration, ctx.after):
        actor, built = resident_actor(ctx, algo)
        if built:
            cast(ExploringActor, actor).explore(epsilon_ladder(ctx.replica, algo.num_actors))
        actor.set_weights(weights_from.weights, weights_from.version)
        batch = actor.rollout(steps)
    batch["stats"].update(worker=worker_name(), built=built, replica=ctx.replica)
    return batch


def replay_step(ctx: TaskContext, algo: Algorithm, updates_from: LearnerOutput,
                *batches: Batch) -> Batch:
    """Role ``replay``: apply the learner's new priorities for this shard, add the actors'
    transitions, sample ``sample_rows`` for the learner."""
    key = (ctx.run, "replay", ctx.replica)
    with in_turn(key, ctx.iteration, ctx.after):
        shard, built = resident(key, lambda: algo.make_replay(ctx.replica))  # type: ignore[misc]
        carried = updates_from.carried
        if not built and len(carried) > ctx.replica and len(carried[ctx.replica]["indices"]):
            shard.update_priorities(carried[ctx.replica]["indices"],
                                    carried[ctx.replica]["priorities"])
        added = 0
        for batch in batches:
            shard.add({k: v for k, v in batch.items() if k != "priorities"},
                      batch.get("priorities"))
            added += int(batch["stats"]["env_steps"])
        sample: Batch = shard.sample(shard.sample_rows) if len(shard) else {}
    stats = sample.get("stats", {"size": 0, "total": 0.0})
    sample["stats"] = {**stats, "added": added, "built": built, "worker": worker_name(),
                       "nbytes": shard.nbytes, "rollouts": [b["stats"] for b in batches]}
    return sample


def apex_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
               *samples: Batch) -> LearnerOutput:
    """Role ``learner``: gradient steps on the shards' samples; new priorities go back with
    the output."""
    t0 = time.time()
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    metrics, updates = cast(ReplayLearner, learner).learn_from(
        list(samples), ctx.iteration / ctx.num_iterations)
    holder["version"] = learner_in.version + 1
    rollouts = [st for s in samples for st in s["stats"]["rollouts"]]
    metrics.update(merge_stats(rollouts))
    lost = 0
    for j, s in enumerate(samples):
        metrics[f"replay_size/{j}"] = int(s["stats"]["size"])
        if s["stats"]["built"] and ctx.iteration > 0:
            before = int(learner_in.metrics.get(f"replay_size/{j}", 0))
            lost += before
            print(f"daskrl: apex: replay shard {j} was rebuilt empty on {s['stats']['worker']} "
                  f"at iteration {ctx.iteration + 1} ({before or 'its'} transitions lost; "
                  "shards are not checkpointed)", file=sys.stderr)
    versions = [int(st.get("policy_version", -1)) for st in rollouts]
    metrics.update(
        replay_lost=lost, replay_bytes=sum(int(s["stats"]["nbytes"]) for s in samples),
        replay_workers=";".join(f"{j}@{s['stats']['worker']}" for j, s in enumerate(samples)),
        policy_lag=learner_in.version - min(versions) if versions else 0,
        learner_worker=worker_name(), learner_built=built, learn_t_start=t0,
        learn_t_end=time.time())
    return LearnerOutput(learner_in.version + 1, learner.state_dict(), learner.weights(),
                         metrics, carried=updates)


class Apex(Distribution):
    """Actors, replay shards and a learner on their own workers (Ape-X).

    Parameters
    ----------
    refresh_every : int
        Iterations between an actor's weight refreshes (default 4; 1: every iteration).

    Notes
    -----
    An instance keeps the state of the run it serves (the weights the actors refresh from,
    the learner output whose priorities the next shard tasks apply): use one per run.

    Examples
    --------
    >>> Apex(refresh_every="2").refresh_every
    2
    """

    name = "apex"
    requires = frozenset({"replay"})
    deterministic = False

    def __init__(self, refresh_every: int | str = 4) -> None:
        self.refresh_every = to_int("refresh_every", refresh_every)
        self.last: tuple[str, int, Any] | None = None
        """(run, the iteration after the last graph built, that graph's learner input)."""
        self.refreshed: tuple[str, Any] | None = None
        """(run, the learner output the actors last refreshed from)."""

    def check(self, algo: Algorithm) -> None:
        """Refuse an algorithm without the ``replay`` capability (its promise includes
        ``make_replay``), or with fewer actors than shards."""
        super().check(algo)
        if algo.num_actors < algo.replay_shards:
            raise Unsupported(f"apex: --num-actors {algo.num_actors} is fewer than "
                              f"--replay-shards {algo.replay_shards}: every shard needs an actor "
                              "writing to it; raise --num-actors or lower --replay-shards")

    def workers_wanted(self, algo: Algorithm) -> int:
        """One worker per actor and per shard, and the learner's."""
        return algo.num_actors + algo.replay_shards + 1

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """The learner, the replay shards (apart from it) and the actors (apart from both)."""
        return [
            Fragment(apex_learn, "learner", algo.resources_for("learner")),
            Fragment(replay_step, "replay", algo.resources_for("replay"), algo.replay_shards,
                     apart_from=("learner",)),
            Fragment(apex_rollout, "rollout", algo.resources_for("rollout"), algo.num_actors,
                     apart_from=("replay", "learner")),
        ]

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """Rollouts -> replay shards -> learner; see the module notes for who waits on what."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        in_order = self.last is not None and self.last[:2] == (run, k)
        priorities_from = self.last[2] if in_order and self.last else inputs.learner_in
        self.last = (run, k + 1, inputs.learner_in)
        if k % self.refresh_every == 0 or self.refreshed is None or self.refreshed[0] != run:
            self.refreshed = (run, inputs.learner_in)
        weights_from = self.refreshed[1]
        after = k - 1 if in_order else None

        def ctx(role: str, replica: int) -> TaskContext:
            return dataclasses.replace(inputs.context(role, replica), after=after)

        rollouts = [
            task(apex_rollout, ctx("rollout", i), algo, weights_from, algo.num_steps,
                 role="rollout", replica=i, iteration=k, run=run,
                 resources=place.resources["rollout"], worker=place.worker("rollout", i))
            for i in range(algo.num_actors)
        ]
        shards = algo.replay_shards
        samples = [
            task(replay_step, ctx("replay", j), algo, priorities_from,
                 *rollouts[j::shards], role="replay", replica=j, iteration=k, run=run,
                 resources=place.resources["replay"], worker=place.worker("replay", j))
            for j in range(shards)
        ]
        return task(apex_learn, inputs.context("learner", 0), algo, inputs.learner_in,
                    *samples, role="learner", replica=0, iteration=k, run=run,
                    resources=place.resources["learner"], worker=place.worker("learner", 0))

