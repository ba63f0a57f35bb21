"""What each role does on its worker: the functions the iteration graph's tasks call.

Every function takes a :class:`TaskContext` first; the state it needs (envs, learner) is
resident on the worker (:mod:`daskrl.core.worker_state`) and rebuilt from seeds where it is missing.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import numpy as np
import torch

from daskrl.core.algorithm import (
    Actor,
    Algorithm,
    Batch,
    Learner,
    LearnerOutput,
    LightStateLearner,
    ResizableActor,
)
from daskrl.core.failures import expect
from daskrl.core.learner_threads import learner_threads
from daskrl.core.worker_state import drop_key, in_turn, resident, worker_name

T = TypeVar("T")
OutputState = Literal["full", "light", "none"]


@dataclass(frozen=True)
class TaskContext:
    """Identity of one task: which run, replica and iteration it belongs to."""

    run: str
    seed: int
    replica: int
    iteration: int
    num_iterations: int
    gpu: float = 0
    deterministic: bool = False
    env_retries: int = 0
    after: int | None = None
    """For a rollout: the iteration whose rollout of the same envs must run first on this
    worker (one-step-stale rollouts of consecutive iterations can be ready at once)."""
    schedule: tuple[int, float] = (0, 0.0)
    """``(iteration, progress)`` the schedules go on from: (0, 0.0) for a run as launched; a
    run resumed with another length continues from where its schedule stood (see
    :meth:`progress`)."""
    learner_alone: bool = False
    """For a learner task: no other task of the run computes while it updates (a lockstep
    distribution), so the update may use the cores the others leave idle
    (:mod:`daskrl.core.learner_threads`)."""
    learner_threads: int = 0
    """For a learner task: its update's torch threads, fixed by the distribution's
    ``threads`` option (0: not fixed)."""
    output_state: OutputState = "full"
    """What a learner task's output carries as its ``state`` (:func:`learner_state`):
    ``"full"`` (a checkpoint, a deterministic rerun or a rebuilt worker may need all of
    it), ``"light"`` (the light state of a ``light-state`` learner, else the full one) or
    ``"none"`` (an output that never leaves its task: an iteration before a task's last)."""

    def progress(self, iteration: float | None = None) -> float:
        """Where ``iteration`` (default: this task's) stands in the run's schedules (the
        learning rate's), 0 at the start and 1 at ``num_iterations``: linear from
        :attr:`schedule` on, so a resumed run that asks for more iterations continues its
        schedule from the value it had reached instead of restarting it.

        Examples
        --------
        >>> TaskContext("r", 1, 0, 5, 10).progress()
        0.5
        >>> TaskContext("r", 1, 0, 15, 20, schedule=(10, 0.8)).progress()  # 0.8 -> 1 over 10
        0.9
        """
        it = self.iteration if iteration is None else iteration
        start, at = self.schedule
        if start == 0 and at == 0.0:  # as launched (the formula bit-exact runs were made with)
            return it / self.num_iterations
        return at + (1.0 - at) * (it - start) / max(1, self.num_iterations - start)

    def replica_seed(self, salt: int = 0) -> int:
        """A seed for (run seed, replica, salt), independent across replicas.

        Examples
        --------
        >>> ctx = TaskContext("r", seed=1, replica=0, iteration=0, num_iterations=1)
        >>> ctx.replica_seed() == ctx.replica_seed(), ctx.replica_seed() == ctx.replica_seed(1)
        (True, False)
        """
        seq = np.random.SeedSequence([self.seed, self.replica, salt])
        return int(seq.generate_state(1)[0])


def pick_device(gpu: float) -> str:
    """``"cuda"`` when the task was given a GPU and torch sees one, else ``"cpu"``."""
    return "cuda" if gpu and torch.cuda.is_available() else "cpu"


def resident_actor(ctx: TaskContext, algo: Algorithm, replicas: tuple[int, ...] = (),
                   role: str = "rollout", saved: Mapping[str, bytes] | None = None
                   ) -> tuple[Actor, bool]:
    """This worker's actor for ``ctx.replica`` (or the fused actor of ``replicas``).

    A fused actor runs the envs of several co-located replicas as one batched actor
    (``len(replicas) * algo.num_envs`` envs, one forward pass per step).

    In deterministic mode (``ctx.deterministic``) an actor that is missing, or that is not
    at the end of iteration ``ctx.iteration - 1`` (a rerun after a lost worker), is rebuilt
    from its state in ``saved`` (:attr:`LearnerOutput.actors`), so it continues exactly
    where the previous iteration left it.
    """
    # A replica first built after iteration 0 (a fresh or replacement worker) gets seeds
    # salted by that iteration, so it does not replay the episodes it played before.
    seed = ctx.replica_seed(ctx.iteration)
    ident: Any = ctx.replica if len(replicas) <= 1 else replicas

    def build() -> Actor:
        if ctx.deterministic and saved and snapshot_key(role, ident) in saved:
            return pickle.loads(saved[snapshot_key(role, ident)])
        if len(replicas) <= 1:
            return algo.make_actor(seed)
        # distributions fuse replicas only for algorithms that declare resizable-actor
        proto = cast(ResizableActor, algo.make_actor(seed))
        return proto.resized(len(replicas) * algo.num_envs, seed)

    key = (ctx.run, role, ident)
    if not ctx.deterministic:
        return resident(key, build)
    store, _ = resident((*key, "at"), dict)
    if store.get("next") not in (None, ctx.iteration):  # ahead or behind: rebuild exactly
        drop_key(key)
    actor, built = resident(key, build)
    store["next"] = ctx.iteration + 1
    return actor, built


def snapshot_key(role: str, ident: int | tuple[int, ...]) -> str:
    """The key of an actor's state in :attr:`LearnerOutput.actors`.

    Examples
    --------
    >>> snapshot_key("rollout", 2), snapshot_key("single", (0, 1))
    ('rollout/2', 'single/0+1')
    """
    label = "+".join(map(str, ident)) if isinstance(ident, tuple) else str(ident)
    return f"{role}/{label}"


def keep_snapshot(ctx: TaskContext, actor: Actor, role: str, ident: int | tuple[int, ...],
                  stats: dict[str, Any]) -> None:
    """Deterministic mode: put the actor's pickled state in its rollout ``stats``."""
    if ctx.deterministic:
        stats["actor_state"] = {snapshot_key(role, ident): pickle.dumps(actor)}


def snapshots(stats: list[dict[str, Any]]) -> dict[str, bytes]:
    """The actor states that :func:`keep_snapshot` put in rollout stats, merged."""
    return {k: v for s in stats for k, v in s.get("actor_state", {}).items()}


def rollout(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, steps: int,
            replicas: tuple[int, ...] = ()) -> Batch:
    """Role ``rollout``: step this replica's resident envs with the latest weights.

    With ``replicas`` (more than one), the co-located replicas run fused as one actor.
    With ``ctx.after`` set, it runs once that iteration's rollout of the same envs ran on
    this worker (:func:`~daskrl.core.worker_state.in_turn`).
    """
    ident = replicas if len(replicas) > 1 else ctx.replica

    def collect() -> tuple[Actor, Batch, bool]:
        actor, built = resident_actor(ctx, algo, replicas, saved=learner_in.actors)
        actor.set_weights(learner_in.weights, learner_in.version)
        return actor, actor.rollout(steps), built

    key = (ctx.run, "rollout", ident)
    with in_turn(key, ctx.iteration, ctx.after, strict=ctx.deterministic):
        cpu = time.process_time()
        (actor, batch, built), retries = with_env_retries(ctx, key, collect)
        cpu = time.process_time() - cpu
    expect(batch, "rollout", "the actor's rollout(steps)", dict, ("stats",))
    label = "+".join(map(str, replicas)) if len(replicas) > 1 else ctx.replica
    batch["stats"].update(worker=worker_name(), built=built, replica=label, env_retries=retries,
                          cpu_s=cpu)
    keep_snapshot(ctx, actor, "rollout", ident, batch["stats"])
    return batch


def with_env_retries(ctx: TaskContext, key: Any, collect: Callable[[], T]) -> tuple[T, int]:
    """Run ``collect``; if it raises, drop the resident actor ``key`` and try again.

    Up to ``ctx.env_retries`` retries, each on an actor rebuilt from its seed (an env that
    crashed may be left in any state); then the last error stands, with the env's own
    traceback. Returns the result and the number of retries it took.

    Examples
    --------
    >>> ctx = TaskContext("r", 1, 0, 0, 1, env_retries=1)
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) == 1:
    ...         raise RuntimeError("simulator crashed")
    ...     return "batch"
    >>> with_env_retries(ctx, ("r", "rollout", 0), flaky)
    ('batch', 1)
    """
    attempt = 0
    while True:
        try:
            return collect(), attempt
        except Exception as exc:
            if attempt >= ctx.env_retries:
                raise
            attempt += 1
            drop_key(key)
            if ctx.deterministic:
                drop_key((*key, "at"))
            who = "+".join(map(str, key[2])) if isinstance(key[2], tuple) else key[2]
            print(f"daskrl: {key[1]} {who} on {worker_name()}: {type(exc).__name__}: {exc}; "
                  f"rebuilding its envs (retry {attempt} of {ctx.env_retries})",
                  file=sys.stderr)




def resident_learner(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                     role: str = "learner") -> tuple[dict[str, Any], bool]:
    """This worker's learner holder ``{"learner", "version"}``, in step with ``learner_in``.

    A learner that is fresh, or behind or ahead of ``learner_in`` (a resume, a replaced
    worker), loads ``learner_in.state`` first.
    """
    holder, built = resident(
        (ctx.run, role, ctx.replica),
        lambda: {"learner": algo.make_learner(ctx.replica_seed(), pick_device(ctx.gpu)),
                 "version": None},
    )
    if holder["version"] != learner_in.version:
        holder["learner"].load_state_dict(learner_in.state)
        holder["version"] = learner_in.version
    return holder, built


def learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, *batches: Batch
          ) -> LearnerOutput:
    """Role ``learner``: one update of the resident learner; returns weights and metrics."""
    t0 = time.time()
    check_batches(batches)
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    cpu = time.process_time()
    with learner_threads(holder, ctx.learner_alone and not ctx.deterministic,
                         ctx.learner_threads) as timed:
        metrics: dict[str, Any] = learner.update(list(batches), ctx.progress())
        expect(metrics, "learner", "the learner's update(batches, progress)", dict)
        timed.skip_unless_trained(metrics)
    metrics.update(learner_threads=timed.threads, learner_cpu_s=time.process_time() - cpu)
    holder["version"] = learner_in.version + 1
    metrics.update(merge_stats([b["stats"] for b in batches]))
    metrics.update(learner_worker=worker_name(), learner_built=built,
                   learn_t_start=t0, learn_t_end=time.time())
    return LearnerOutput(learner_in.version + 1, learner_state(ctx, algo, learner),
                         learner.weights(), metrics, snapshots([b["stats"] for b in batches]))


def learner_state(ctx: TaskContext, algo: Algorithm, learner: Learner) -> dict[str, Any]:
    """The ``state`` a learner output carries, as ``ctx.output_state`` asks.

    A learner whose full state is costly to copy (a replay's contents) declares
    ``light-state``; its outputs that no checkpoint needs then carry the light state, and a
    learner rebuilt from one (its worker lost) restarts that bulk empty and reports it.

    Examples
    --------
    >>> class Bulky:
    ...     def state_dict(self): return {"model": 1, "replay": [0, 1, 2]}
    ...     def light_state_dict(self): return {"model": 1}
    >>> algo = Algorithm("a", print, print, print, num_steps=1, capabilities={"light-state"})
    >>> [learner_state(TaskContext("r", 1, 0, 0, 1, output_state=s), algo, Bulky())
    ...  for s in ("full", "light", "none")]
    [{'model': 1, 'replay': [0, 1, 2]}, {'model': 1}, {}]
    """
    if ctx.output_state == "none":
        return {}
    if ctx.output_state == "light" and "light-state" in algo.capabilities:
        return cast(LightStateLearner, learner).light_state_dict()
    return learner.state_dict()


def check_batches(batches: tuple[Batch, ...] | list[Batch]) -> None:
    """Raise ``ValueError`` when the replicas' batches disagree on an array's shape per step.

    Examples
    --------
    >>> a = {"obs": np.zeros((5, 4)), "stats": {"replica": 0}}
    >>> b = {"obs": np.zeros((3, 6)), "stats": {"replica": 1}}
    >>> check_batches([a, b])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rollout replicas disagree on 'obs': replica 0 has shape (4,) per step, ...
    """
    if len(batches) < 2:
        return
    first = batches[0]
    for key, value in first.items():
        if key == "stats" or not hasattr(value, "shape"):
            continue
        for other in batches[1:]:
            got = getattr(other.get(key), "shape", None)
            if got is not None and got[1:] != value.shape[1:]:
                raise ValueError(
                    f"rollout replicas disagree on {key!r}: replica "
                    f"{first['stats'].get('replica')} has shape {tuple(value.shape[1:])} per "
                    f"step, replica {other['stats'].get('replica')} has {tuple(got[1:])}; "
                    "every replica must build the same env (check make_actor and the env's "
                    "observation space)")


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the actors' stats into per-iteration metrics."""
    returns = [r for s in stats for r in s["episode_returns"]]
    lengths = [n for s in stats for n in s["episode_lengths"]]
    out: dict[str, Any] = {}
    for team in sorted({t for s in stats for t in s.get("team_returns", {})}):
        values = [r for s in stats for r in s.get("team_returns", {}).get(team, [])]
        out[f"return_mean/{team}"] = float(np.mean(values)) if values else float("nan")
    if any("matches" in s for s in stats):  # games' outcomes, for a coordinator to read
        out["matches"] = [m for s in stats for m in s.get("matches", [])]
    if any("agent_steps" in s for s in stats):  # multi-agent actors: totals over replicas
        out["agents"] = sum(s.get("agents", 0) for s in stats)
        out["agent_steps"] = sum(s.get("agent_steps", 0) for s in stats)
    # seconds inside a rollout: the max over replicas, like rollout_s (they run in parallel)
    for key in ("env_s", "inference_s"):
        timed = [s[key] for s in stats if key in s]
        if timed:
            out[key] = max(timed)
    if any("cpu_s" in s for s in stats):  # CPU seconds: the replicas' sum (cores they kept busy)
        out["rollout_cpu_s"] = sum(s.get("cpu_s", 0.0) for s in stats)
    return out | {
        "env_steps": sum(s["env_steps"] for s in stats),
        "episodes": len(returns),
        "episode_return_mean": float(np.mean(returns)) if returns else float("nan"),
        "episode_length_mean": float(np.mean(lengths)) if lengths else float("nan"),
        "rollout_s": max(s["t_end"] - s["t_start"] for s in stats),
        "rollout_t_start": min(s["t_start"] for s in stats),
        "rollout_workers": ";".join(f"{s['replica']}@{s['worker']}" for s in stats),
        "actors_built": sum(bool(s["built"]) for s in stats),
        "env_retries": sum(int(s.get("env_retries", 0)) for s in stats),
    }


def coordinate(ctx: TaskContext, algo: Algorithm, previous: LearnerOutput,
               output: LearnerOutput) -> LearnerOutput:
    """Role ``coordinator``: iteration ``ctx.iteration``'s learner output, with the state
    ``previous`` (the output this iteration started from) carried, passed through the
    algorithm's :class:`~daskrl.core.contracts.Coordinator`."""
    assert algo.make_coordinator is not None
    carried = dataclasses.replace(output, coordinator=previous.coordinator)
    result = checked_coordination(
        algo.make_coordinator().coordinate(carried, ctx.iteration), output,
        "the coordinator's coordinate(output, iteration)")
    return dataclasses.replace(result, metrics={**result.metrics,
                                                "coordinator_worker": worker_name()})


def checked_coordination(result: Any, output: LearnerOutput, call: str) -> LearnerOutput:
    """``result`` of a coordinator's ``call`` on ``output``, checked: a learner output of the
    same version."""
    expect(result, "coordinator", call, LearnerOutput)
    if result.version != output.version:
        raise ValueError(f"the coordinator changed the learner output's version from "
                         f"{output.version} to {result.version}: it must keep it")
    return result


def without_coordinator_state(output: LearnerOutput) -> LearnerOutput:
    """``output`` with an empty ``coordinator`` field (what actors and learners take)."""
    return dataclasses.replace(output, coordinator={})


EVALUATION_SALT = 10_000
"""What an evaluate task's seed is drawn with (beside the run's seed and the replica)."""


def evaluation_seed(seed: int) -> int:
    """The seed a run seeded ``seed`` gives its final evaluation (the evaluate task,
    replica 0): its episodes' envs are seeded from it, so a peer library evaluated with it
    plays exactly the same episodes.

    Examples
    --------
    >>> evaluation_seed(1) == evaluation_seed(1) != evaluation_seed(2)
    True
    """
    return TaskContext("evaluate", seed, 0, 0, 1).replica_seed(EVALUATION_SALT)


def evaluate(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput) -> dict[str, float]:
    """Role ``evaluate``: a deterministic evaluation of the given weights on fresh envs."""
    result = algo.evaluate(learner_in.weights, ctx.replica_seed(EVALUATION_SALT))
    expect(result, "evaluate", "the algorithm's evaluate(weights, seed)", dict,
           ("eval_return_mean",))
    return result
