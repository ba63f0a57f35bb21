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

from .algorithm import Algorithm, Batch, LearnerOutput
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


def rollout(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, steps: int) -> Batch:
    """Role ``rollout``: step this replica's resident envs with the latest weights."""
    # A replica first built after iteration 0 (a fresh or replacement worker) gets seeds
    # salted by that iteration, so it does not replay the episodes it played before.
    actor, built = resident(
        (ctx.run, "rollout", ctx.replica),
        lambda: algo.make_actor(ctx.replica_seed(ctx.iteration)),
    )
    actor.set_weights(learner_in.weights, learner_in.version)
    batch = actor.rollout(steps)
    batch["stats"].update(worker=worker_name(), built=built, replica=ctx.replica)
    return batch


def learn(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput, *batches: Batch
          ) -> LearnerOutput:
    """Role ``learner``: one update of the resident learner; returns weights and metrics."""
    t0 = time.time()
    holder, built = resident(
        (ctx.run, "learner", ctx.replica),
        lambda: {"learner": algo.make_learner(ctx.replica_seed(), pick_device(ctx.gpu)),
                 "version": None},
    )
    learner = holder["learner"]
    if holder["version"] != learner_in.version:  # fresh worker, or resumed from a checkpoint
        learner.load_state_dict(learner_in.state)
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
    return {
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
