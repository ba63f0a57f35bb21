"""``apex``: distributed prioritised replay (Ape-X, Horgan et al. 2018).

Three roles, each on its own workers when there are enough:

- ``replay``: ``Algorithm.replay_shards`` shards (resident on their workers; resources of
  the ``replay`` role). Actor ``i`` writes to shard ``i mod shards``. Each iteration a
  shard applies the priorities the learner sent back, adds its actors' transitions and
  samples for the learner.
- ``learner``: merges the shards' samples in proportion to their total priorities
  (:meth:`daskrl.core.replay.ReplayLearner.learn_from`) and returns new priorities with its
  output (``LearnerOutput.carried``).
- ``rollout``: N actors, each acting with its own exploration rate from the ladder
  ``eps_i = 0.4 ** (1 + 7 i / (N - 1))``, folding n-step transitions and computing their
  initial priorities (|TD error| under its weights). An actor refreshes its weights every
  ``refresh_every`` iterations, not every iteration, from the learner output ``stale``
  updates before the newest (default 0: the newest, which the refreshing rollout waits for;
  with ``stale >= 1`` that output is normally finished when the rollout starts, but on a
  2-core machine the waiting default measured faster, ``benchmarks/apex.md``).
  ``policy_lag`` in the metrics is how many updates old the acting weights were.

Placement: the shards are placed first, the learner apart from them, the actors apart from
both; on fewer workers than that the first actors share the shards' workers (whose tasks
take milliseconds) before the learner's, so one actor on two workers steps beside the
learner, not after it.

Who waits on whom: the shard task of iteration ``k`` applies the priorities of learner
``k - 2``, so it runs while learner ``k - 1`` trains and the learner does not wait for its
sample; it needs iteration ``k``'s rollouts of its own actors only. ``learner_busy`` is the
share of wall time between two learner tasks' ends that the learner computed (left out
while the buffer fills: the learner then has nothing to do).

State: shards live in worker-resident state that outlives a lost worker elsewhere (a new
attempt finds the shards that survived); a shard rebuilt on a new worker starts empty,
``replay_lost`` counts the transitions lost, and priorities the learner computed for the
old shard are not applied to the new one. The graph of a checkpointed iteration
(``IterationInputs.checkpoint``) carries every shard's contents to the learner output's
``state["replay_shards"]`` (or only their sizes when the shard was built with
``save=False``, ``--no-save-replay``); a resumed run restores them into the same number of
shards, or deals them over another number (:func:`daskrl.algos.replay_shards.reshard`). The
results depend on the order tasks finish: no ``--deterministic``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from dask.delayed import Delayed

from daskrl.algos.replay_shards import reshard
from daskrl.core.algorithm import Algorithm, Batch, LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.core.placement import task
from daskrl.core.replay import ExploringActor, Replay, ReplayLearner
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


@dataclass
class Shard:
    """A resident replay shard, a token naming this build of it (priorities computed on
    another build's samples are not applied), and a lock (a task of a lost attempt may
    still be running on it)."""

    buffer: Replay
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    lock: threading.Lock = field(default_factory=threading.Lock)


def restore_shard(buffer: Replay, saved: Sequence[Mapping[str, Any]], shard: int,
                  shards: int) -> tuple[int, int]:
    """Load shard ``shard`` of ``shards`` from the checkpoint's ``saved`` shard states; return
    (transitions restored, transitions it held when saved).

    The same number of shards loads shard ``shard``'s state as it was; another number deals
    every saved transition over the new shards (:func:`~daskrl.algos.replay_shards.reshard`).
    A state saved without contents (``--no-save-replay``) restores nothing.

    Examples
    --------
    >>> import numpy as np
    >>> from daskrl.algos.replay_buffers import PrioritizedReplay
    >>> old = PrioritizedReplay(8); old.add({"x": np.arange(5.0)}, np.ones(5))
    >>> new = PrioritizedReplay(8)
    >>> restore_shard(new, [old.state_dict()], 0, 1), len(new)
    ((5, 5), 5)
    >>> restore_shard(PrioritizedReplay(8), [{"size": 5}], 0, 1)  # saved without contents
    (0, 5)
    """
    sizes = [int(s["size"]) for s in saved]
    held = sizes[shard] if len(saved) == shards else len(range(shard, sum(sizes), shards))
    if not all("data" in s for s in saved):
        return 0, held
    if len(saved) == shards:
        buffer.load_state_dict(dict(saved[shard]))
    else:
        buffer.load_state_dict(reshard(saved, shards, shard, buffer.capacity))
    return len(buffer), held


def replay_step(ctx: TaskContext, algo: Algorithm, updates_from: LearnerOutput, store: str,
                save: bool, *batches: Batch) -> Batch:
    """Role ``replay``: apply the learner's new priorities for this shard, add the actors'
    transitions, sample ``sample_rows`` for the learner; with ``save``, add the shard's
    state for the checkpoint (``stats["state"]``).

    ``store`` names the run whose resident shard this is (the first attempt's: a shard
    outlives a lost worker elsewhere). A shard built here restores its part of
    ``updates_from.state["replay_shards"]`` when there is one (a resumed run).
    """
    j = ctx.replica
    with in_turn((ctx.run, "replay", j), ctx.iteration, ctx.after):
        shard, built = resident((store, "replay", j),
                                lambda: Shard(algo.make_replay(j)))  # type: ignore[misc]
        with shard.lock:
            buffer = shard.buffer
            restored, held = 0, -1
            saved = updates_from.state.get("replay_shards") if built else None
            if saved:
                restored, held = restore_shard(buffer, saved, j, algo.replay_shards)
            carried = updates_from.carried
            if len(carried) > j and carried[j].get("token") == shard.token:
                buffer.update_priorities(carried[j]["indices"], carried[j]["priorities"])
            added = 0
            for batch in batches:
                buffer.add({k: v for k, v in batch.items() if k != "priorities"},
                           batch.get("priorities"))
                added += int(batch["stats"]["env_steps"])
            sample: Batch = buffer.sample(buffer.sample_rows) if len(buffer) else {}
            state = None
            if save:
                state = buffer.state_dict() if buffer.save else {"size": len(buffer)}
    stats = sample.get("stats", {"size": 0, "total": 0.0})
    sample["stats"] = {**stats, "added": added, "built": built, "worker": worker_name(),
                       "nbytes": buffer.nbytes, "rollouts": [b["stats"] for b in batches],
                       "token": shard.token, "restored": restored, "held": held,
                       "state": state}
    return sample


def apex_learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
               *samples: Batch) -> LearnerOutput:
    """Role ``learner``: gradient steps on the shards' samples; new priorities go back with
    the output, each tagged with the shard build it was sampled from."""
    t0 = time.time()
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    metrics, updates = cast(ReplayLearner, learner).learn_from(
        list(samples), ctx.iteration / ctx.num_iterations)
    holder["version"] = learner_in.version + 1
    stats = [s["stats"] for s in samples]
    updates = [{**u, "token": st["token"]} for u, st in zip(updates, stats, strict=True)]
    rollouts = [r for st in stats for r in st["rollouts"]]
    metrics.update(merge_stats(rollouts))
    lost = restored = 0
    for j, st in enumerate(stats):
        metrics[f"replay_size/{j}"] = int(st["size"])
        if st["built"] and (ctx.iteration > 0 or st["held"] >= 0):
            before = (int(st["held"]) if st["held"] >= 0
                      else int(learner_in.metrics.get(f"replay_size/{j}", 0)))
            lost += max(0, before - int(st["restored"]))
            restored += int(st["restored"])
            print(f"daskrl: apex: {_rebuilt(j, st, ctx.iteration, before)}", file=sys.stderr)
    versions = [int(r.get("policy_version", -1)) for r in rollouts]
    t1 = time.time()
    prev_end = learner_in.metrics.get("learn_t_end")
    if metrics.get("gradient_steps") and prev_end is not None and t1 > float(prev_end):
        # the share of the time since the previous learner task ended spent computing
        metrics["learner_busy"] = min(1.0, (t1 - t0) / (t1 - float(prev_end)))
    metrics.update(
        replay_lost=lost, replay_restored=restored,
        replay_bytes=sum(int(st["nbytes"]) for st in stats),
        replay_workers=";".join(f"{j}@{st['worker']}" for j, st in enumerate(stats)),
        policy_lag=learner_in.version - min(versions) if versions else 0,
        learner_worker=worker_name(), learner_built=built, learn_t_start=t0, learn_t_end=t1)
    state = learner.state_dict()
    if any(st["state"] is not None for st in stats):
        state = {**state, "replay_shards": [st["state"] for st in stats]}
    return LearnerOutput(learner_in.version + 1, state, learner.weights(), metrics,
                         carried=updates)


def _rebuilt(j: int, st: Mapping[str, Any], iteration: int, before: int) -> str:
    """One line saying what happened to shard ``j`` built at ``iteration``."""
    where = f"replay shard {j} on {st['worker']} at iteration {iteration + 1}"
    if st["restored"]:
        return f"{where}: {st['restored']} transitions restored from the checkpoint"
    if st["held"] >= 0:
        return (f"{where} restarts with an empty buffer: the checkpoint holds no replay "
                f"contents (--no-save-replay); {before} transitions lost")
    return f"{where} was rebuilt empty ({before or 'its'} transitions lost)"


class Apex(Distribution):
    """Replay shards, a learner and actors on their own workers (Ape-X).

    Parameters
    ----------
    refresh_every : int
        Iterations between an actor's weight refreshes (default 4; 1: every iteration).
    stale : int
        A refresh takes the learner output this many updates before the newest one
        (default 0: the newest, which the refreshing rollout waits for; 1: the one before,
        so the rollout does not wait for the update running beside it).

    Notes
    -----
    An instance keeps the state of the run it serves (the learner outputs the actors
    refresh from and the shards apply priorities from): use one per run.

    Examples
    --------
    >>> a = Apex(refresh_every="2", stale="1")
    >>> a.refresh_every, a.stale
    (2, 1)
    """

    name = "apex"
    requires = frozenset({"replay"})
    deterministic = False
    switchable = False  # the replay lives in shards, not in the learner's output
    headline = ("learner_busy", "policy_lag")

    def headline_figures(self, columns: Mapping[str, Sequence[float]]) -> dict[str, float]:
        """Also the replay's size at the end and the rows the learner drew from it a second
        (over the steady iterations' time)."""
        out = super().headline_figures(columns)
        size = [v for v in columns.get("replay_size") or [] if not math.isnan(v)]
        if size:
            out["replay_size"] = size[-1]
        drawn, took = list(columns.get("replay_samples") or [])[1:], list(
            columns.get("iteration_s") or [])[1:]
        pairs = [(d, t) for d, t in zip(drawn, took, strict=False)
                 if not (math.isnan(d) or math.isnan(t))]
        if pairs and sum(t for _, t in pairs) > 0:
            out["replay_samples_per_s"] = sum(d for d, _ in pairs) / sum(t for _, t in pairs)
        return out

    def __init__(self, refresh_every: int | str = 4, stale: int | str = 0) -> None:
        self.refresh_every = to_int("refresh_every", refresh_every)
        self.stale = to_int("stale", stale, minimum=0)
        self.run: str | None = None
        """The attempt the last graph was built for."""
        self.next = -1
        """The iteration after the last graph built."""
        self.store: str | None = None
        """The run id the resident shards are kept under (the first attempt's)."""
        self.inputs: dict[int, Any] = {}
        """Iteration -> its learner input (the output of the iteration before), the few
        that refreshes and priority updates still need."""
        self.refreshed: Any = None
        """The learner output the actors last refreshed from."""

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
        """The replay shards, the learner (apart from them) and the actors (apart from
        both; see the module notes for fewer workers)."""
        return [
            Fragment(replay_step, "replay", algo.resources_for("replay"), algo.replay_shards),
            Fragment(apex_learn, "learner", algo.resources_for("learner"),
                     apart_from=("replay",)),
            Fragment(apex_rollout, "rollout", algo.resources_for("rollout"), algo.num_actors,
                     apart_from=("replay", "learner")),
        ]

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """Rollouts -> replay shards -> learner; see the module notes for who waits on what."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        in_order = (self.run, self.next) == (run, k)
        if not in_order:  # a new run, attempt or resume: start from this input alone
            self.inputs, self.refreshed = {}, None
        if self.store is None:
            self.store = run
        self.run, self.next = run, k + 1
        self.inputs[k] = inputs.learner_in
        keep = max(1, self.stale)
        self.inputs = {i: v for i, v in self.inputs.items() if i >= k - keep}
        if k % self.refresh_every == 0 or self.refreshed is None:
            self.refreshed = self.inputs[max(min(self.inputs), k - self.stale)]
        priorities_from = self.inputs.get(k - 1, inputs.learner_in)
        after = k - 1 if in_order else None

        def ctx(role: str, replica: int) -> TaskContext:
            return dataclasses.replace(inputs.context(role, replica), after=after)

        rollouts = [
            task(apex_rollout, ctx("rollout", i), algo, self.refreshed, algo.num_steps,
                 role="rollout", replica=i, iteration=k, run=run,
                 resources=place.resources["rollout"], worker=place.worker("rollout", i))
            for i in range(algo.num_actors)
        ]
        shards = algo.replay_shards
        samples = [
            task(replay_step, ctx("replay", j), algo, priorities_from, self.store,
                 inputs.checkpoint, *rollouts[j::shards], role="replay", replica=j,
                 iteration=k, run=run, resources=place.resources["replay"],
                 worker=place.worker("replay", j))
            for j in range(shards)
        ]
        return task(apex_learn, inputs.context("learner", 0), algo, inputs.learner_in,
                    *samples, role="learner", replica=0, iteration=k, run=run,
                    resources=place.resources["learner"], worker=place.worker("learner", 0))
