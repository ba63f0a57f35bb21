"""``actors-learner``: N actor replicas with their own envs, one learner (IMPALA/Acme layout).

Trajectories move actor -> learner once per rollout; weights learner -> actors once per
iteration, as the learner task's output that the next iteration's rollouts take as input.
"""

from __future__ import annotations

from dask.delayed import Delayed

from .. import roles
from ..algorithm import Algorithm
from ..fragment import Fragment
from ..graph import task
from .base import IterationInputs


class ActorsLearner:
    """Multi-actor, single-learner distribution (MSRL's DP-A)."""

    name = "actors-learner"

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """Rollout replicas and one learner."""
        return [
            Fragment(roles.rollout, "rollout", algo.resources_for("rollout"), algo.num_actors),
            Fragment(roles.learn, "learner", algo.resources_for("learner")),
        ]

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """``num_actors`` rollout tasks feeding one learner task."""
        algo, place, k = inputs.algo, inputs.placement, inputs.iteration
        batches = [
            task(roles.rollout, inputs.context("rollout", r), algo, inputs.learner_in,
                 algo.num_steps, role="rollout", replica=r, iteration=k, run=inputs.run,
                 resources=place.resources["rollout"], worker=place.worker("rollout", r))
            for r in range(algo.num_actors)
        ]
        return task(roles.learn, inputs.context("learner", 0), algo, inputs.learner_in, *batches,
                    role="learner", replica=0, iteration=k, run=inputs.run,
                    resources=place.resources["learner"], worker=place.worker("learner", 0))
