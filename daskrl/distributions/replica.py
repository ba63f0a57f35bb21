"""One data-parallel replica: its resident learner and actor, and an update stepped from
outside between all-reduces (by Dask tasks or by ``torch.distributed``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
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
        self.phases = Phases()

    def start(self) -> torch.Tensor:
        """The first flat tensor to average across the replicas."""
        with self.phases.timed("prepare"):
            if self.learner.update_plan().statistics:
                self.phases.statistics = True
                out = self.learner.statistics(self.batches).reshape(-1).cpu()
            else:
                self.plan = self.learner.minibatches(self.batches, self.progress)
                out = None
        out = self._compute() if out is None else out
        self.phases.ready.append(time.time())
        return out

    def step(self, avg: torch.Tensor) -> torch.Tensor | None:
        """Apply the average of the last tensor; the next gradients, or None at the end."""
        self.phases.back.append(time.time())
        if self.plan is None:
            with self.phases.timed("prepare"):
                self.plan = self.learner.minibatches(self.batches, self.progress, avg)
        else:
            with self.phases.timed("apply"):
                unflatten_into(avg, self.grads)
                self.learner.apply_gradients(self.grads)
        if len(self.done) == len(self.plan):
            return None
        out = self._compute()
        self.phases.ready.append(time.time())
        return out

    def _compute(self) -> torch.Tensor:
        assert self.plan is not None
        with self.phases.timed("compute"):
            grads, metrics = self.learner.compute_gradients(self.plan[len(self.done)])
            self.done.append(metrics)
            self.grads = grads
            return flatten(grads)

    def finish(self) -> dict[str, float]:
        """The update's metrics (``finish_update`` of the learner)."""
        return self.learner.finish_update(self.done)


class Phases:
    """Where one replica's update spends its time: wall and thread-CPU seconds of each phase,
    and the wall clock at which each round's tensor was ready and its average came back.

    All replicas of a run share one host clock (``time.time``) when they share a host, so
    :func:`round_split` can tell waiting for a slower replica from the all-reduce itself.
    CPU seconds are this thread's (``time.thread_time``): other jobs on the cores do not
    inflate them the way they inflate wall time.

    Examples
    --------
    >>> ph = Phases()
    >>> with ph.timed("compute"):
    ...     _ = sum(range(1000))
    >>> sorted(ph.wall), ph.cpu["compute"] >= 0.0
    (['compute'], True)
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.ready: list[float] = []
        self.back: list[float] = []
        self.statistics = False
        """Whether round 0 carried batch statistics rather than gradients."""

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """A context manager adding its block's wall and CPU seconds to phase ``name``."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0
            self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c0

    def summary(self) -> dict[str, Any]:
        """Per-phase totals and the round clocks (what travels back with the replica)."""
        return {"wall": dict(self.wall), "cpu": dict(self.cpu), "ready": list(self.ready),
                "back": list(self.back), "statistics": self.statistics}


def round_split(phases: list[dict[str, Any]]) -> dict[str, float]:
    """Split the replicas' sync rounds: ``dp/wait_s/r<r>`` (replica ``r`` ready, the slowest
    not yet: waiting for the slower replica), ``dp/sync_s`` (from the last replica ready to
    the first average back: the all-reduce itself, scheduler round trip included), and
    ``dp/stats_round_s`` (the same for round 0 when it carried batch statistics, in
    ``dp/sync_s`` too), summed over the rounds of one update; ``dp/first_wait_s/r<r>``,
    replica ``r``'s wait at round 0 (in ``dp/wait_s/r<r>`` too): at the rollout/update
    boundary, for the slower rollout; plus each replica's phase totals
    (``dp/<phase>_s/r<r>``, ``dp/<phase>_cpu_s/r<r>``).

    Examples
    --------
    >>> a = {"wall": {"compute": 1.0}, "cpu": {"compute": 0.9}, "ready": [1.0, 3.0],
    ...      "back": [1.5, 3.5]}
    >>> b = {"wall": {"compute": 1.2}, "cpu": {"compute": 1.1}, "ready": [1.2, 3.1],
    ...      "back": [1.6, 3.4]}
    >>> s = round_split([a, b])
    >>> round(s["dp/wait_s/r0"], 3), round(s["dp/sync_s"], 3), s["dp/compute_cpu_s/r1"]
    (0.3, 0.6, 1.1)
    >>> round(s["dp/first_wait_s/r0"], 3), s["dp/first_wait_s/r1"]
    (0.2, 0.0)
    """
    out: dict[str, float] = {}
    rounds = min(len(p["back"]) for p in phases)
    last_ready = [max(p["ready"][i] for p in phases) for i in range(rounds)]
    sync = [min(p["back"][i] for p in phases) - last_ready[i] for i in range(rounds)]
    out["dp/sync_s"] = sum(sync)
    out["dp/rounds"] = rounds
    if phases[0].get("statistics") and rounds:
        out["dp/stats_round_s"] = sync[0]
    for r, p in enumerate(phases):
        out[f"dp/wait_s/r{r}"] = sum(last_ready[i] - p["ready"][i] for i in range(rounds))
        if rounds:
            out[f"dp/first_wait_s/r{r}"] = last_ready[0] - p["ready"][0]
        for name, value in p["wall"].items():
            out[f"dp/{name}_s/r{r}"] = value
            out[f"dp/{name}_cpu_s/r{r}"] = p["cpu"][name]
    return out


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
    t0, c0 = time.perf_counter(), time.thread_time()
    batch = actor.rollout(algo.num_steps)
    holder["rollout_phase"] = (time.perf_counter() - t0, time.thread_time() - c0)
    batch["stats"].update(worker=worker_name(), built=actor_built, replica=ctx.replica)
    keep_snapshot(ctx, actor, "rollout", ctx.replica, batch["stats"])
    holder.update(stats=batch["stats"], built=built)
    return holder, learner, batch


def finish_replica(ctx: TaskContext, holder: dict[str, Any], update: ReplicaUpdate
                   ) -> dict[str, Any]:
    """The replica's output after its update: metrics, stats, weight digest (and replica
    0's weights and state), and where its time went (:meth:`Phases.summary`)."""
    learner, phases = holder["learner"], update.phases
    metrics = update.finish()
    holder["version"] += 1
    with phases.timed("finish"):
        weights = learner.weights()
        out = {"metrics": metrics, "stats": holder.pop("stats"), "digest": digest(weights),
               "worker": worker_name(), "built": holder.get("built", False)}
        if ctx.replica == 0:
            out.update(state=learner.state_dict(), weights=weights)
    wall, cpu = holder.pop("rollout_phase", (0.0, 0.0))
    phases.wall["rollout"], phases.cpu["rollout"] = wall, cpu
    out["phases"] = phases.summary()
    return out
