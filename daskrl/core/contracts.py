"""What an algorithm's actors and learners declare: the protocols each role and each
capability promises, and :data:`CAPABILITIES`, the names an
:class:`~daskrl.core.algorithm.Algorithm` declares them by. Distributions read only these
declarations; nothing is probed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

Batch = dict[str, Any]
"""A rollout's transitions (flat numpy arrays) plus ``stats`` (a dict of numbers/lists)."""

Weights = dict[str, torch.Tensor]
"""A CPU ``state_dict`` of the policy: what travels from learner to actors."""


class Actor(Protocol):
    """Envs plus a local policy copy, resident on a worker across iterations."""

    def set_weights(self, weights: Weights, version: int) -> None:
        """Load policy weights (a no-op when ``version`` is already loaded)."""

    def rollout(self, num_steps: int) -> Batch:
        """Step the envs ``num_steps`` times and return the post-processed batch."""


class Learner(Protocol):
    """Model and optimiser, resident on the learner's worker across iterations."""

    def update(self, batches: list[Batch], progress: float) -> dict[str, float]:
        """One update on the batches; ``progress`` in [0, 1) drives schedules. For a
        :class:`GradientLearner`: its :meth:`~GradientLearner.minibatches` plan, each
        minibatch computed and applied in turn, then ``finish_update``."""

    def weights(self) -> Weights:
        """A CPU copy of the policy weights for the actors."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (model, optimiser, RNG), CPU tensors."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""


class LightStateLearner(Learner, Protocol):
    """A learner whose full state holds a bulk that is costly to copy at every update (a
    replay's contents), with a light state beside it (capability ``light-state``).

    Outputs that no checkpoint and no deterministic rerun needs carry the light state; the
    full one (:meth:`Learner.state_dict`) goes only into those that do
    (``TaskContext.output_state``).
    """

    def light_state_dict(self) -> dict[str, Any]:
        """Its state without the bulk: everything else :meth:`Learner.state_dict` holds.
        ``load_state_dict`` takes it, restarts the bulk empty and reports what was lost in
        its next update's metrics (``replay_lost``)."""


class ResizableActor(Actor, Protocol):
    """An actor that can make a copy of itself with a different number of envs.

    Fusion (co-located replicas run as one batched actor), ``single`` and the env groups of
    ``central-inference`` need it; :class:`~daskrl.algos.actor_critic.VecEnvActor` has it.
    """

    def resized(self, num_envs: int, seed: int) -> ResizableActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""


class GradientActor(Actor, Protocol):
    """An actor that computes a loss gradient on its own rollout (A3C's actors)."""

    rollout_steps: int
    """Steps each env takes for one gradient."""

    def gradients(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Roll out its own number of steps; return CPU gradients (computed like the
        learner's ``compute_gradients``) and the rollout's ``stats`` (with ``rollout_steps``,
        the steps each env took, and the loss parts)."""


@dataclass(frozen=True)
class UpdatePlan:
    """What a :class:`GradientLearner` declares about every update, before any batch exists
    (``data-parallel`` sizes its graph of sync steps from it).

    Examples
    --------
    >>> UpdatePlan(steps=16, statistics=False).steps
    16
    """

    steps: int
    """Gradient steps per update: the length of every ``minibatches`` plan."""
    statistics: bool
    """Whether ``statistics(batches)`` returns a tensor that replicas must average (and
    pass to ``minibatches``) before the first gradient step."""


class GradientLearner(Learner, Protocol):
    """A learner whose update is a plan of minibatches, each a gradient computed by autograd
    then applied (capability ``gradients``).

    A distribution may run the steps of :meth:`Learner.update` itself: ``statistics`` (merged
    across replicas when ``update_plan().statistics``), ``minibatches``, and for each
    minibatch ``compute_gradients``, an all-reduce of the gradients, ``apply_gradients``;
    then ``finish_update``. Every replica iterates the same plan, so no step is counted by
    hand. ``async`` applies gradients computed by :class:`GradientActor` s, after
    ``schedule``. Statistics that are not gradients (e.g. a value normaliser's) travel only
    through ``statistics``, never with the gradients.
    """

    device: str
    """Where the model lives (``"cpu"``, ``"cuda:0"``): the all-reduce picks gloo or NCCL
    from it."""

    def update_plan(self) -> UpdatePlan:
        """Steps per update and whether batch statistics are merged first."""

    def schedule(self, progress: float) -> dict[str, float]:
        """Set the schedules (learning rate) for ``progress`` in [0, 1]; return them."""

    def statistics(self, batches: list[Batch]) -> torch.Tensor | None:
        """This replica's batch statistics that are not gradients (None when there are none);
        replicas average them before :meth:`minibatches`."""

    def minibatches(self, batches: list[Batch], progress: float,
                    statistics: torch.Tensor | None = None) -> list[Any]:
        """Start an update: set the schedules, fold in ``statistics`` (averaged over the
        replicas, else this learner's own), return the minibatches in stepping order."""

    def compute_gradients(self, minibatch: Any) -> tuple[list[torch.Tensor], dict[str, float]]:
        """Autograd gradients of the loss (one tensor per parameter) and the loss parts."""

    def apply_gradients(self, grads: list[torch.Tensor]) -> None:
        """Clip (``clip_grad_norm_``) and take one ``torch.optim`` step with ``grads``."""

    def finish_update(self, step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """End the update begun by :meth:`minibatches`; its metrics from each step's."""


class EnvPart(Protocol):
    """The env-stepping half of a :class:`SplitActor` (role ``env``): a vector env and its
    episode bookkeeping, no policy."""

    obs: Any
    """The current observation of every env, ``[num_envs, ...]`` (numpy)."""

    def step(self, actions: Any) -> Any:
        """Step every env once with ``actions``; return a
        :class:`~daskrl.core.envs.EnvStep` (observation after the step, reward,
        terminated, done, valid, and the episodes it finished)."""


class InferencePart(Protocol):
    """The policy half of a :class:`SplitActor` (role ``inference``): a policy copy that
    picks actions step by step and turns the recorded steps into a batch."""

    def set_weights(self, weights: Weights, version: int) -> None:
        """Load policy weights (a no-op when ``version`` is already loaded)."""

    def begin(self, num_steps: int, obs: Any) -> None:
        """Start a rollout of ``num_steps`` steps from ``obs`` (one row per env)."""

    def act(self, obs: Any) -> Any:
        """Actions for ``obs`` (one batched forward pass), recorded for the batch."""

    def record(self, step: Any) -> None:
        """Record what the envs returned (an ``EnvStep``) for the last :meth:`act`."""

    def finish(self, last_obs: Any) -> Batch:
        """Bootstrap from ``last_obs`` and return the rollout's batch with its ``stats``."""


class SplitActor(ResizableActor, Protocol):
    """An actor whose env stepping and inference can run in different processes
    (``central-inference``: envs on CPU workers, one batched policy on the learner's).

    Declared by an algorithm with the ``split-actor`` capability;
    :class:`~daskrl.algos.actor_critic.VecEnvActor` is one.
    """

    def env_part(self) -> EnvPart:
        """Its envs (built on first use), stepped with actions chosen elsewhere."""

    def inference_part(self) -> InferencePart:
        """Its policy copy and rollout buffers, fed with steps made elsewhere."""


class Coordinator(Protocol):
    """The run-wide decisions between iterations (a league's match-making, its ratings and
    snapshots): role ``coordinator``, one task after every iteration's learner.

    It holds no state of its own between tasks: what it keeps travels in the learner output's
    ``coordinator`` field from one coordinator task to the next, on the coordinator's worker.
    The next iteration's actors and learner take the output without it, and so does the
    driver, except for the iterations it checkpoints and when it restarts a chain of tasks:
    a checkpoint holds the state, ``--resume`` restores it, and after a lost worker the run
    goes on with the state of the last checkpointed iteration and the learner as it last
    finished.
    """

    # ``Any`` for daskrl.core.algorithm.LearnerOutput: that module imports this one
    def start(self, output: Any) -> Any:
        """The first iteration's input, from the initial learner output of a fresh run (its
        ``coordinator`` field empty) or a resumed one (the checkpointed state): the picks
        the first iteration plays, with nothing recorded (the metrics left as they are)."""

    def coordinate(self, output: Any, iteration: int) -> Any:
        """The :class:`~daskrl.core.algorithm.LearnerOutput` the next iteration takes.

        ``output`` is iteration ``iteration``'s, its ``coordinator`` field the state the
        previous call returned (``{}`` at the start of a run) and its ``metrics`` as the
        learner returned them (the actors' ``matches`` included, see
        :func:`daskrl.core.roles.merge_stats`). The result may add entries to ``weights``
        (what the actors play against), must keep the learner's ``state`` and ``version``,
        and may replace ``metrics`` with plain numbers (they become ``metrics.csv`` columns).
        """


CAPABILITIES: Mapping[str, str] = {
    "gradients": "its learner's gradients can be averaged across replicas before every "
                 "optimiser step, as data-parallel does",
    "resizable-actor": "actor.resized(num_envs, seed) makes a copy with other envs, as fusion, "
                       "single and central-inference's env groups need",
    "split-actor": "its actor is a SplitActor whose env_part() and inference_part() can run "
                   "in different processes, as central-inference places them",
    "gradient-actor": "its actor is a GradientActor and its learner applies gradients as they "
                      "arrive, as async does",
    "vtrace": "its actor records sequences with the acting policy's log-probabilities and "
              "version, and its learner corrects for their lag with V-trace (a value head), "
              "as impala's free-running actors need",
    "light-state": "its learner is a LightStateLearner: outputs between checkpoints carry "
                   "light_state_dict(), without the bulk that is costly to copy (a replay)",
    "replay": "make_replay builds replay shards, its learner is a ReplayLearner and its actor "
              "an ExploringActor (daskrl.core.replay), as apex places them",
}
"""The capabilities an :class:`Algorithm` may declare, and what each promises. A distribution
lists those it requires and refuses an algorithm that lacks one before any worker starts."""
