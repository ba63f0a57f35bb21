"""The memory a run needs on each worker, checked against the workers' limits before launch.

An algorithm states two sizes (:class:`Sizes`): the bytes one env step adds to a rollout
batch (all agents of that env together) and its model's parameter count. From those and
the placement (which replicas of which role sit on which worker), :func:`estimate` adds up
what each worker process holds at once: for every rollout replica its buffers and the batch
made from them, for the learner the batches it receives and the model, gradients and
optimiser state, plus the process itself, once. Thread workers (``LocalCluster(processes=
False)``) share one process, so their replicas add up in it. :func:`check_memory` refuses a
run whose estimate exceeds a process's memory limit, before any task starts, naming the
workers and the flag to lower; Dask would otherwise pause or kill the workers half-way
through an iteration. Dask compares the memory of a worker's whole process with that
worker's own ``memory_limit``, so the limit of a process is the smallest of its workers'.

An algorithm without ``sizes`` is not checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskrl.core.sizes import FLOAT_BYTES, MiB, Sizes, format_bytes

if TYPE_CHECKING:
    from daskrl.core.algorithm import Algorithm
    from daskrl.core.placement import Placement
    from daskrl.distributions import Distribution

PROCESS_BYTES = 384 * MiB
"""A worker process with Python, torch, gymnasium and Dask loaded (about 370 MiB measured
after a PPO rollout and update on CartPole)."""
ACTOR_COPIES = 2
"""A rollout's buffers, plus the batch made from them (held until the learner fetched it)."""
LEARNER_COPIES = 2
"""The batches a learner receives, plus their concatenation for the update."""
MODEL_COPIES = 6
"""A learner's weights, gradients, Adam's two moments, and the CPU copies it returns."""
POLICY_COPIES = 2
"""An actor's policy copy and the weights it received."""

FIXES = {
    "rollout buffers": "lower --num-envs or --num-steps, or spread the replicas over more "
                       "workers",
    "learner batch": "lower --num-envs, --num-steps or --num-actors",
    "model and optimiser": "lower --hidden (the model's width)",
    "policy copy": "lower --hidden (the model's width)",
    "gradients": "lower --num-actors or --hidden",
    "worker process": "give the workers more memory",
    "replay": "lower --buffer-size (the replay's capacity in transitions), or spread it over "
              "more --replay-shards under --distribution apex",
}
"""What to lower when a part dominates a worker's estimate."""


@dataclass
class WorkerNeed:
    """The estimated memory of one worker process, by part (``label -> bytes``)."""

    worker: str
    """The worker's name, or ``"process HOST:PID"`` for a process of several workers."""
    parts: dict[str, int] = field(default_factory=dict)
    replicas: dict[str, list[int]] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    """The workers of this process that hold replicas."""

    @property
    def total(self) -> int:
        """All parts together."""
        return sum(self.parts.values())

    def add(self, label: str, nbytes: int, role: str, replica: int) -> None:
        """Add ``nbytes`` to part ``label`` for ``replica`` of ``role``."""
        if nbytes <= 0:
            return
        self.parts[label] = self.parts.get(label, 0) + nbytes
        self.replicas.setdefault(role, []).append(replica)

    def describe(self) -> str:
        """The parts, largest first."""
        return "; ".join(f"{label} {format_bytes(n)}" for label, n in
                         sorted(self.parts.items(), key=lambda kv: -kv[1]))


def _role_parts(role: str, algo: Algorithm, sizes: Sizes, roles: set[str],
                receives: str) -> list[tuple[str, int]]:
    """What one replica of ``role`` holds, as ``(label, bytes)``."""
    one = algo.num_envs * algo.num_steps * sizes.transition_bytes  # one replica's rollout
    every = one * algo.num_actors
    model = sizes.model_params * FLOAT_BYTES
    if role == "rollout":
        return [("rollout buffers", ACTOR_COPIES * one), ("policy copy", POLICY_COPIES * model)]
    if role == "inference":  # central inference records every env replica's trajectories
        return [("rollout buffers", ACTOR_COPIES * every), ("policy copy", POLICY_COPIES * model)]
    if role == "replica":  # data-parallel: an actor and a learner in one
        return [("rollout buffers", ACTOR_COPIES * one), ("learner batch", LEARNER_COPIES * one),
                ("model and optimiser", MODEL_COPIES * model)]
    if role == "replay":  # a shard of an off-policy replay on its own worker (apex)
        return [("replay", -(-sizes.replay_bytes // algo.replay_shards))]
    if role != "learner":
        return []  # env replicas and evaluation hold little beyond the process
    parts = [("model and optimiser", MODEL_COPIES * model)]
    if sizes.replay_bytes and "replay" not in roles:  # the replay is resident in the learner
        parts.append(("replay", sizes.replay_bytes))
    if "replica" in roles:  # data-parallel: the learner only gathers the replicas' outputs
        return parts
    if receives == "gradients":  # actors send gradients, not batches
        return parts + [("gradients", algo.num_actors * model)]
    if not roles & {"rollout", "inference"}:  # single: the rollouts run inside this task
        parts.append(("rollout buffers", ACTOR_COPIES * every))
    return parts + [("learner batch", LEARNER_COPIES * every)]


def estimate(algo: Algorithm, placement: Placement, distribution: Distribution | str = "",
             processes: Mapping[str, str] | None = None) -> dict[str, WorkerNeed]:
    """Estimated bytes each worker process of ``placement`` holds at once during the run.

    Parameters
    ----------
    algo : Algorithm
        With :attr:`~daskrl.Algorithm.sizes` (none: an empty estimate).
    placement : Placement
        Which worker each replica of each role runs on.
    distribution : Distribution or str
        The distribution, or its name: what its learner receives
        (:attr:`~daskrl.distributions.Distribution.learner_receives`) decides its parts.
    processes : mapping of worker name to its process, optional
        Workers that share a process (threads) are estimated together, the process once;
        a worker missing here (or all, by default) is a process of its own.

    Returns
    -------
    dict
        The process (the worker's name when it is alone in it) -> its :class:`WorkerNeed`.

    Examples
    --------
    >>> from daskrl import Algorithm, Placement
    >>> algo = Algorithm("a", print, print, print, num_steps=128, num_envs=8, num_actors=2,
    ...                  sizes=Sizes(transition_bytes=47, model_params=9000))
    >>> place = Placement({}, {"rollout": ("w0", "w1"), "learner": ("w0",)})
    >>> need = estimate(algo, place, "actors-learner")
    >>> sorted(need), need["w0"].parts["learner batch"] == 2 * 2 * 8 * 128 * 47
    (['w0', 'w1'], True)
    >>> shared = estimate(algo, place, "actors-learner", {"w0": "h:7", "w1": "h:7"})
    >>> list(shared), shared["h:7"].parts["worker process"] == PROCESS_BYTES
    (['h:7'], True)
    """
    sizes = algo.sizes
    if sizes is None:
        return {}
    roles = set(placement.workers)
    receives = _learner_receives(distribution)
    processes = processes or {}
    names = {name for names in placement.workers.values() for name in names}
    together: dict[str, set[str]] = {}
    for name in names:
        together.setdefault(processes.get(name, name), set()).add(name)
    needs: dict[str, WorkerNeed] = {}
    for role, placed in placement.workers.items():
        for replica, name in enumerate(placed):
            process = processes.get(name, name)
            label = name if len(together[process]) == 1 else f"process {process}"
            need = needs.setdefault(process, WorkerNeed(label, {"worker process": PROCESS_BYTES},
                                                        workers=sorted(together[process])))
            for part, nbytes in _role_parts(role, algo, sizes, roles, receives):
                need.add(part, nbytes, role, replica)
    return needs


def _learner_receives(distribution: Distribution | str) -> str:
    """What the learner of ``distribution`` (or of the distribution of that name) receives.

    Examples
    --------
    >>> _learner_receives("async"), _learner_receives("actors-learner"), _learner_receives("")
    ('gradients', 'batches', 'batches')
    """
    if not isinstance(distribution, str):
        return distribution.learner_receives
    from daskrl.distributions import KINDS

    kind = KINDS.get(distribution)
    return kind.learner_receives if kind is not None else "batches"


class MemoryBudgetError(ValueError):
    """A run would need more memory on a worker than the worker's limit."""


def check_memory(backend: Any, algo: Algorithm, distribution: Distribution | str,
                 placement: Placement) -> dict[str, WorkerNeed]:
    """Refuse the run when a worker process's estimate exceeds its memory limit; return
    the estimate (by process, see :func:`estimate`).

    ``backend.memory_limits()`` gives each worker's limit in bytes (``None`` or 0: no
    limit, as for the in-process backend), ``backend.worker_processes()`` which workers
    share a process. A process's limit is the smallest of its workers': Dask pauses a
    worker once its whole process's memory passes a share of that worker's limit.

    Raises
    ------
    MemoryBudgetError
        Naming the worker, its estimate by part, its limit and the flag to lower.

    Examples
    --------
    >>> from daskrl import Algorithm, Placement
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> algo = Algorithm("a", print, print, print, num_steps=8, sizes=Sizes(47, 9000))
    >>> place = Placement({}, {"learner": ("local",)})
    >>> need = check_memory(SyncBackend(), algo, "single", place)  # no limit in-process
    >>> need["local"].total > 0
    True
    """
    if algo.sizes is None:
        return {}
    needs = estimate(algo, placement, distribution, backend.worker_processes())
    limits: Mapping[str, int | None] = backend.memory_limits()  # None or 0: no limit known
    for _, need in sorted(needs.items()):
        known = [limit for w in need.workers if (limit := limits.get(w))]
        if known and need.total > min(known):
            raise MemoryBudgetError(_refusal(algo, need, min(known)))
    return needs


def _refusal(algo: Algorithm, need: WorkerNeed, limit: int) -> str:
    largest = max((p for p in need.parts if p != "worker process"), key=need.parts.get,
                  default="worker process")
    held = ", ".join(f"{role} {_runs(r)}" for role, r in sorted(need.replicas.items()))
    step = algo.sizes.transition_bytes if algo.sizes else 0
    if len(need.workers) > 1:  # threads of one process: each worker's limit is the process's
        return (f"{need.worker} would need about {format_bytes(need.total)} for this run "
                f"({held}: {need.describe()}); its {len(need.workers)} workers are threads of "
                f"that process, and Dask pauses each one once the process's memory nears its "
                f"own limit, {format_bytes(limit)} (a LocalCluster's default divides the "
                f"machine's memory among its workers), so no task would run there: give every "
                f"worker the process's budget, LocalCluster(processes=False, "
                f"memory_limit=\"{thread_budget(need.total)}\"), or no limit, memory_limit=0; "
                f"or {FIXES[largest]} (now --num-envs {algo.num_envs}, --num-steps "
                f"{algo.num_steps}, --num-actors {algo.num_actors})")
    return (f"worker {need.worker!r} would need about {format_bytes(need.total)} for this run "
            f"({held or 'no replicas'}: {need.describe()}) but its memory limit is "
            f"{format_bytes(limit)}: {FIXES[largest]} (now --num-envs {algo.num_envs}, "
            f"--num-steps {algo.num_steps}, --num-actors {algo.num_actors}; one env step holds "
            f"{format_bytes(step)}), or give the workers more memory")


def thread_budget(total: int) -> str:
    """A ``memory_limit`` for thread workers under which a process holding ``total`` bytes
    stays below Dask's pause threshold (``distributed.worker.memory.pause``, 80 %), in whole
    GiB, with :data:`HEADROOM` more for what the process allocates after the estimate (without
    it, a total just under a whole GiB left the process megabytes from the pause).

    Examples
    --------
    >>> thread_budget(3 * 2**30)
    '5GiB'
    """
    import dask

    pause = dask.config.get("distributed.worker.memory.pause") or 1.0
    return f"{max(1, math.ceil(total * HEADROOM / pause / 2**30))}GiB"


HEADROOM = 1.25
"""The share above the estimated total that :func:`thread_budget` leaves."""


def _runs(replicas: list[int]) -> str:
    """Replica numbers, runs of three or more written ``first-last``.

    Examples
    --------
    >>> _runs([0, 1, 2, 3, 5, 7, 8])
    '0-3/5/7/8'
    """
    ordered = sorted(set(replicas))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "/".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else "/".join(map(str, run))
                    for run in runs)
