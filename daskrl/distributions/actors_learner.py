"""``actors-learner``: N actor replicas with their own envs, one learner (IMPALA/Acme layout).

Trajectories move actor -> learner once per rollout; weights learner -> actors once per
iteration, as the learner task's output that the next iteration's rollouts take as input.
Replicas placed on the same worker are fused into one rollout task that steps all their
envs with one forward pass per step (``fuse=false`` keeps one task per replica).
"""

from __future__ import annotations

from collections import defaultdict

from dask.delayed import Delayed

from .. import roles
from ..algorithm import Algorithm
from ..fragment import Fragment
from ..graph import Placement, task
from .base import IterationInputs, to_bool


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


class ActorsLearner:
    """Multi-actor, single-learner distribution (MSRL's DP-A).

    Parameters
    ----------
    fuse : bool
        Run co-located rollout replicas as one batched actor (default True).

    Examples
    --------
    >>> ActorsLearner(fuse="false").fuse
    False
    """

    name = "actors-learner"

    def __init__(self, fuse: bool | str = True) -> None:
        self.fuse = to_bool("fuse", fuse)

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """Rollout replicas and one learner."""
        return [
            Fragment(roles.rollout, "rollout", algo.resources_for("rollout"), algo.num_actors),
            Fragment(roles.learn, "learner", algo.resources_for("learner")),
        ]

    def batches(self, inputs: IterationInputs) -> list[Delayed]:
        """One rollout task per replica, or per worker when fused."""
        algo, place, k = inputs.algo, inputs.placement, inputs.iteration
        groups = (colocated(place, "rollout", algo.num_actors) if self.fuse
                  else [(r,) for r in range(algo.num_actors)])
        return [
            task(roles.rollout, inputs.context("rollout", g[0]), algo, inputs.learner_in,
                 algo.num_steps, g if len(g) > 1 else (), role="rollout", replica=g[0],
                 iteration=k, run=inputs.run, resources=place.resources["rollout"],
                 worker=place.worker("rollout", g[0]))
            for g in groups
        ]

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """Rollout tasks feeding one learner task."""
        place = inputs.placement
        return task(roles.learn, inputs.context("learner", 0), inputs.algo, inputs.learner_in,
                    *self.batches(inputs), role="learner", replica=0, iteration=inputs.iteration,
                    run=inputs.run, resources=place.resources["learner"],
                    worker=place.worker("learner", 0))
