"""The replay role's vocabulary: what a replay shard, a learner that learns from replay
samples and an actor that explores on a fixed schedule offer (capability ``replay``).

Under the ``apex`` distribution, actors write transitions with initial priorities to replay
shards resident on their own workers; the learner learns from the shards' samples and sends
new priorities back. :mod:`daskrl.algos.replay_buffers` and :mod:`daskrl.algos.dqn_learner`
implement these.
"""

from __future__ import annotations

from typing import Any, Protocol

Batch = dict[str, Any]


class Replay(Protocol):
    """One replay shard, resident on a worker of the ``replay`` role."""

    capacity: int
    """The most transitions it holds (first in, first out beyond)."""
    sample_rows: int
    """Rows it samples for the learner per iteration: enough for every gradient step of
    an iteration, even if every step drew all its rows from this shard."""
    nbytes: int
    """Bytes it holds."""
    save: bool
    """Whether checkpoints hold its contents (``--no-save-replay`` turns it off)."""

    def __len__(self) -> int:
        """Transitions held."""

    def add(self, batch: Batch, priorities: Any = None) -> None:
        """Append ``batch``'s transitions, with initial ``priorities`` (None: the largest
        seen)."""

    def sample(self, n: int, beta: float = 0.4) -> Batch:
        """``n`` transitions in proportion to their priorities with ``indices``,
        ``weights``, ``priorities`` and ``stats`` (``size`` and ``total`` priority)."""

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of the transitions at ``indices``."""

    def state_dict(self) -> dict[str, Any]:
        """Contents, priorities and sampling state for a checkpoint (CPU tensors and
        plain numbers: checkpoints load with ``weights_only``)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (or a re-sharded state, see
        :func:`daskrl.algos.replay_shards.reshard`)."""


class ReplayLearner(Protocol):
    """A learner that learns from replay shards' samples (the ``apex`` learner)."""

    def learn_from(self, samples: list[Batch], progress: float
                   ) -> tuple[dict[str, float], list[Batch]]:
        """Gradient steps on the shards' ``samples`` (one per shard, merged in proportion
        to their total priorities); return the metrics and, per shard, the new priorities
        as ``{"indices", "priorities"}``."""


class ExploringActor(Protocol):
    """An actor that can act with a fixed exploration rate and add each transition's initial
    priority to its batches (an Ape-X actor)."""

    def explore(self, epsilon: float) -> None:
        """Act with ``epsilon`` from now on, and add ``priorities`` to every batch."""
