"""The base of every learner whose replay lives with it (DQN, SAC, TD3).

:class:`ReplayLearner` does what they all do the same way: add the batches it receives to
the replay, count env steps, wait (filling the buffer) until it holds ``learning_starts``
transitions, then take one gradient step per ``train_frequency`` new env steps; report the
replay's size and the transitions lost on a restore; split its state into the full one
(with the replay's contents) and the light one (without: capability ``light-state``).

A subclass adds only its maths: :meth:`ReplayLearner.train` (the gradient steps of an
update), :meth:`ReplayLearner.schedule` (exploration schedules, read before training),
:meth:`ReplayLearner.model_state` / :meth:`ReplayLearner.load_model_state` (networks,
optimisers, generators) and :meth:`ReplayLearner.weights` (what the actors load).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch import Tensor

from daskrl.algos.compiled_step import compile_seconds
from daskrl.algos.offpolicy import TensorMeans, restore_replay
from daskrl.algos.replay_buffers import ReplayBuffer

Batch = dict[str, Any]


class ReplayLearner(ABC):
    """Replay feeding, gradient-step accounting and state for off-policy learners.

    Parameters
    ----------
    replay : ReplayBuffer
        The learner's buffer (uniform or prioritised).
    learning_starts : int
        Transitions the replay holds before the first gradient step.
    train_frequency : int
        New env steps per gradient step.
    save_replay : bool
        Whether :meth:`state_dict` holds the replay's contents.

    Examples
    --------
    A learner that counts its gradient steps and learns nothing:

    >>> import numpy as np
    >>> from daskrl.algos.replay_buffers import ReplayBuffer
    >>> class Counting(ReplayLearner):
    ...     def train(self, ends, progress, means):
    ...         self.gradient_steps += len(ends)
    ...     def weights(self):
    ...         return {}
    ...     def model_state(self):
    ...         return {}
    ...     def load_model_state(self, state):
    ...         pass
    >>> learner = Counting(ReplayBuffer(100), learning_starts=6, train_frequency=2)
    >>> batch = {"obs": np.zeros((4, 1)), "stats": {"env_steps": 4}}
    >>> [learner.update([batch], 0.0)["gradient_steps"] for _ in range(3)]
    [0, 2, 2]
    """

    compiled: Any = None
    """The subclass's compiled gradient steps (``--compile``), None when it steps eagerly;
    with them :meth:`update` reports ``compile_s``."""

    def __init__(self, replay: ReplayBuffer, learning_starts: int, train_frequency: int,
                 save_replay: bool = True) -> None:
        self.replay = replay
        self.learning_starts = max(1, int(learning_starts))
        self.train_frequency = max(1, int(train_frequency))
        self.save_replay = save_replay
        self.env_steps = 0
        self.gradient_steps = 0
        self.replay_lost = 0
        """Transitions lost when this learner was restored from a state without its replay;
        reported (then reset) by the next update."""

    # ----------------------------------------------------------- what a subclass adds
    @abstractmethod
    def train(self, ends: list[int], progress: float, means: TensorMeans) -> None:
        """Take ``len(ends)`` gradient steps; ``ends[i]`` is the env-step count at which
        step ``i`` falls (target-update schedules follow it). Losses go into ``means``."""

    def schedule(self, progress: float) -> dict[str, float]:
        """Set the schedules the next weights carry (exploration) for ``progress``, after
        this update's batches were added; return them as metrics. Default: none."""
        return {}

    @abstractmethod
    def model_state(self) -> dict[str, Any]:
        """Networks, optimisers and generators (CPU copies)."""

    @abstractmethod
    def load_model_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`model_state` gave."""

    @abstractmethod
    def weights(self) -> dict[str, Tensor]:
        """A CPU copy of what the actors load."""

    # ----------------------------------------------------------- what they share
    @property
    def ready(self) -> bool:
        """Whether the replay holds enough transitions to learn from."""
        return len(self.replay) >= self.learning_starts

    def update(self, batches: list[Batch], progress: float) -> dict[str, float]:
        """Add the batches to the replay, then one gradient step per ``train_frequency``
        new env steps once the replay holds ``learning_starts`` transitions."""
        for batch in batches:
            self.replay.add(batch, batch.get("priorities"))
        before = self.env_steps
        self.env_steps += sum(int(b["stats"]["env_steps"]) for b in batches)
        metrics: dict[str, float] = dict(self.schedule(progress))
        means = TensorMeans()
        tf = self.train_frequency
        ends = ([k * tf for k in range(before // tf + 1, self.env_steps // tf + 1)]
                if self.ready else [])  # else: wait, filling the buffer
        if ends:
            self.train(ends, progress, means)
        metrics.update(self.replay_metrics())
        metrics.update({"gradient_steps": len(ends), "learner_env_steps": self.env_steps,
                        "replay_lost": self.replay_lost})
        self.replay_lost = 0
        metrics.update({f"losses/{k}": v for k, v in means.means().items()})
        if self.compiled is not None:  # what compiling cost this process so far
            metrics["compile_s"] = compile_seconds()
        return metrics

    def replay_metrics(self) -> dict[str, float]:
        """Size, bytes and capacity of the replay."""
        return {"replay_size": len(self.replay), "replay_bytes": self.replay.nbytes,
                "replay_capacity": self.replay.capacity}

    def state_dict(self) -> dict[str, Any]:
        """:meth:`model_state`, the counters and, unless ``save_replay`` is off, the
        replay."""
        state = self._state()
        if self.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def light_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` without the replay's contents (capability ``light-state``):
        what outputs between checkpoints carry, instead of a copy of the whole buffer."""
        return {**self._state(), "light": True}

    def _state(self) -> dict[str, Any]:
        return {**self.model_state(), "env_steps": self.env_steps,
                "gradient_steps": self.gradient_steps, "replay_size": len(self.replay)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` or :meth:`light_state_dict`; a state without the
        replay's contents leaves the buffer empty, says so, and the next update reports the
        transitions lost (``replay_lost``)."""
        self.load_model_state(state)
        self.env_steps, self.gradient_steps = int(state["env_steps"]), int(state["gradient_steps"])
        self.replay_lost = restore_replay(self.replay, state)
