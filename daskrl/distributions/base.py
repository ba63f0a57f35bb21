"""The interface every distribution implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dask.delayed import Delayed

from ..algorithm import Algorithm
from ..fragment import Fragment
from ..graph import Placement
from ..roles import TaskContext


@dataclass(frozen=True)
class IterationInputs:
    """What a distribution needs to build iteration ``k``."""

    algo: Algorithm
    placement: Placement
    run: str
    seed: int
    iteration: int
    num_iterations: int
    learner_in: Any  # LearnerOutput, or a Future/Delayed of one

    def context(self, role: str, replica: int) -> TaskContext:
        """The task context of one replica of ``role`` in this iteration."""
        gpu = self.placement.resources[role].gpu if role in self.placement.resources else 0
        return TaskContext(self.run, self.seed, replica, self.iteration, self.num_iterations, gpu)


class Distribution(Protocol):
    """Turns an algorithm into one iteration's delayed graph.

    ``fragments`` says which roles it places, with their resources and replica counts;
    ``iteration`` returns a delayed ``LearnerOutput`` whose key starts with ``learner``.
    """

    name: str

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """The fragments it places, for placement and the pre-submit resource check."""

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """The delayed graph of one iteration."""
