"""What each role does on its worker: the functions the iteration graph's tasks call.

Every function takes a :class:`TaskContext` first; the state it needs (envs, learner) is
resident on the worker (:mod:`daskrl.state`) and rebuilt from seeds where it is missing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .algorithm import Actor, Algorithm, Batch, LearnerOutput, require
from .state import resident, worker_name


@dataclass(frozen=True)
class TaskContext:
    """Identity of one task: which run, replica and iteration it belongs to."""

    run: str
    seed: int
    replica: int
    iteration: int
    num_iterations: int
    gpu: float = 0

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
                   role: str = "rollout") -> tuple[Actor, bool]:
    """This worker's actor for ``ctx.replica`` (or the fused actor of ``replicas``).

    A fused actor runs the envs of several co-located replicas as one batched actor
    (``len(replicas) * algo.num_envs`` envs, one forward pass per step).
    """
    # A replica first built after iteration 0 (a fresh or replacement worker) gets seeds
    # salted by that iteration, so it does not replay the episodes it played before.
    seed = ctx.replica_seed(ctx.iteration)
    if len(replicas) <= 1:
        return resident((ctx.run, role, ctx.replica), lambda: algo.make_actor(seed))

    def build() -> Actor:
        proto = algo.make_actor(seed)
        require(proto, "resized", "fusion", "give the actor resized(num_envs, seed), or "
                "turn fusion off with NAME:fuse=false")
        return proto.resized(len(replicas) * algo.num_envs, seed)  # type: ignore[attr-defined]

    return resident((ctx.run, role, replicas), build)


def rollout(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, steps: int,
            replicas: tuple[int, ...] = ()) -> Batch:
    """Role ``rollout``: step this replica's resident envs with the latest weights.

    With ``replicas`` (more than one), the co-located replicas run fused as one actor.
    """
    actor, built = resident_actor(ctx, algo, replicas)
    actor.set_weights(learner_in.weights, learner_in.version)
    batch = actor.rollout(steps)
    label = "+".join(map(str, replicas)) if len(replicas) > 1 else ctx.replica
    batch["stats"].update(worker=worker_name(), built=built, replica=label)
    return batch


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
    holder, built = resident_learner(ctx, algo, learner_in)
    learner = holder["learner"]
    metrics: dict[str, Any] = learner.update(list(batches), ctx.iteration / ctx.num_iterations)
    holder["version"] = learner_in.version + 1
    metrics.update(merge_stats([b["stats"] for b in batches]))
    metrics.update(learner_worker=worker_name(), learner_built=built,
                   learn_t_start=t0, learn_t_end=time.time())
    return LearnerOutput(learner_in.version + 1, learner.state_dict(), learner.weights(), metrics)


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the actors' stats into per-iteration metrics."""
    returns = [r for s in stats for r in s["episode_returns"]]
    lengths = [n for s in stats for n in s["episode_lengths"]]
    out: dict[str, Any] = {}
    for team in sorted({t for s in stats for t in s.get("team_returns", {})}):
        values = [r for s in stats for r in s.get("team_returns", {}).get(team, [])]
        out[f"return_mean/{team}"] = float(np.mean(values)) if values else float("nan")
    if any("agent_steps" in s for s in stats):  # multi-agent actors: totals over replicas
        out["agents"] = sum(s.get("agents", 0) for s in stats)
        out["agent_steps"] = sum(s.get("agent_steps", 0) for s in stats)
    return out | {
        "env_steps": sum(s["env_steps"] for s in stats),
        "episodes": len(returns),
        "episode_return_mean": float(np.mean(returns)) if returns else float("nan"),
        "episode_length_mean": float(np.mean(lengths)) if lengths else float("nan"),
        "rollout_s": max(s["t_end"] - s["t_start"] for s in stats),
        "rollout_t_start": min(s["t_start"] for s in stats),
        "rollout_workers": ";".join(f"{s['replica']}@{s['worker']}" for s in stats),
        "actors_built": sum(bool(s["built"]) for s in stats),
    }


def evaluate(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput) -> dict[str, float]:
    """Role ``evaluate``: a deterministic evaluation of the given weights on fresh envs."""
    return algo.evaluate(learner_in.weights, ctx.replica_seed(10_000))
