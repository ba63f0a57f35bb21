"""The vocabulary an algorithm is written in: actors, learners, and the algorithm bundle."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cloudpickle
import torch

from daskrl.core.fragment import check_role
from daskrl.core.replay import Replay
from daskrl.core.resources import Resources
from daskrl.core.sizes import Sizes
from daskrl.core.tensor_pickle import pack_tensors, unpack_tensors

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


@dataclass(frozen=True)
class LearnerOutput:
    """What a learner task returns: the next iteration's input and this one's metrics."""

    version: int
    state: dict[str, Any]
    weights: Weights
    metrics: dict[str, Any] = field(default_factory=dict)
    actors: dict[str, bytes] = field(default_factory=dict)
    """Deterministic mode: each actor's pickled state after this iteration's rollout, so a
    rebuilt actor (a lost worker, a resume) continues exactly where it left off."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Metrics of the earlier iterations a multi-iteration task ran before this one, oldest
    first (empty for a task of one iteration; see ``Distribution.iterations_per_task``)."""
    carried: list[Batch] = field(default_factory=list)
    """The next iteration's batches, when the tasks that made this output also collected
    them (``actors-learner:stale=1`` with several iterations per task); under ``apex``, the
    new priorities for each replay shard; else empty. Not checkpointed: a resumed run
    collects them again."""

    def __getstate__(self) -> dict[str, Any]:
        # CPU tensors travel as numpy arrays (why: daskrl.core.tensor_pickle)
        memo: dict[int, Any] = {}  # ``state["model"]`` is usually ``weights``: pack it once
        return {k: pack_tensors(v, memo) for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: unpack_tensors(v) for k, v in state.items()})


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


@dataclass(frozen=True)
class EvalRequest:
    """What ``daskrl eval`` asks of a trained policy: episodes on fresh envs.

    Examples
    --------
    >>> EvalRequest(episodes=5, seed=3).deterministic
    True
    """

    episodes: int = 10
    """Episodes to run (for a batched multi-agent env: episodes of every env together)."""
    seed: int = 0
    """Seeds the fresh envs and, when sampling, the actions."""
    deterministic: bool = True
    """Greedy actions (argmax, or a Gaussian's mean) rather than samples."""
    video_dir: Path | None = None
    """Write videos of the episodes here (None: no video)."""
    env_id: str | None = None
    """Another env id to evaluate on (None: the one the run trained on)."""
    opponent: str | None = None
    """Multi-agent runs: ``"random"`` plays each trained team against a uniformly random
    other team (None: trained against trained)."""


ROLES = ("rollout", "learner", "inference", "evaluate", "env", "replay")
ROLE_FALLBACK = {"env": "rollout", "inference": "learner"}
"""A role with no annotation of its own takes this role's (env replicas step like rollouts;
central inference sits with the learner)."""


@dataclass(frozen=True)
class Algorithm:
    """An RL algorithm as factories a distribution can place anywhere.

    Parameters
    ----------
    name : str
        Shown in summaries.
    make_actor : callable ``(seed) -> Actor``
        Builds one actor replica's envs and policy copy.
    make_learner : callable ``(seed, device) -> Learner``
        Builds the learner (model + optimiser) on ``device``.
    evaluate : callable ``(weights, seed) -> dict``
        Deterministic evaluation; returns at least ``eval_return_mean``.
    num_steps : int
        Steps each env of an actor takes per rollout.
    num_envs : int
        Envs per actor replica.
    num_actors : int
        Actor replicas per iteration.
    resources : mapping of role to Resources
        Per-role annotations; roles are ``rollout``, ``learner``, ``inference``, ``evaluate``
        and ``env`` (``env`` defaults to ``rollout``'s, ``inference`` to ``learner``'s).
    env_id : str, optional
        Checked against gymnasium's registry before any work starts.
    sizes : daskrl.core.sizes.Sizes, optional
        Bytes per env step of a rollout batch and the model's parameter count; with them,
        the driver refuses a run that would exceed a worker's memory limit
        (:func:`daskrl.runtime.memory.check_memory`). None: not checked.
    capabilities : iterable of str
        What its actors and learner offer beyond the :class:`Actor`/:class:`Learner`
        protocols, from :data:`CAPABILITIES`; each distribution requires some
        (``Distribution.requires``) and refuses an algorithm that lacks one.
    distribution : str
        The distribution it runs under when none is named (``daskrl train`` without
        ``--distribution``), e.g. ``"async"`` for A3C.
    make_policy : callable ``(weights, deterministic) -> torch.nn.Module``, optional
        The trained policy alone: a module whose ``forward(obs)`` maps a batch of observations
        (a tensor ``[B, *obs_shape]`` of the env's dtype) to a batch of actions, observation
        normalisation included. ``daskrl eval``, ``daskrl export`` and
        ``daskrl.load_policy`` run it. None: the algorithm cannot be evaluated or exported.
    evaluator : callable ``(weights, EvalRequest) -> dict``, optional
        Runs ``daskrl eval``'s episodes itself (multi-agent envs, teams, opponents); None: the
        generic gymnasium evaluator runs ``make_policy`` on ``env_id``'s envs.
    make_replay : callable ``(shard) -> Replay``, optional
        Builds one replay shard (role ``replay``; :class:`daskrl.core.replay.Replay`), for
        distributions that place the replay on its own workers (``apex``).
    replay_shards : int
        Replay shards (replicas of role ``replay``), each holding its share of the capacity.

    Examples
    --------
    >>> algo = Algorithm("noop", make_actor=print, make_learner=print, evaluate=print,
    ...                  num_steps=8, num_envs=4, num_actors=2)
    >>> algo.steps_per_iteration
    64
    >>> algo.resources_for("learner")
    Resources(cpu=1, gpu=0, custom={}, fallback=None)
    >>> sorted(Algorithm("a", print, print, print, num_steps=1,
    ...                  capabilities=["gradients"]).capabilities)
    ['gradients']
    """

    name: str
    make_actor: Callable[[int], Actor]
    make_learner: Callable[[int, str], Learner]
    evaluate: Callable[[Weights, int], dict[str, float]]
    num_steps: int
    num_envs: int = 1
    num_actors: int = 1
    resources: Mapping[str, Resources] = field(default_factory=dict)
    env_id: str | None = None
    sizes: Sizes | None = None
    capabilities: frozenset[str] = frozenset()
    distribution: str = "actors-learner"
    make_policy: Callable[[Weights, bool], torch.nn.Module] | None = None
    evaluator: Callable[[Weights, EvalRequest], dict[str, Any]] | None = None
    make_replay: Callable[[int], Replay] | None = None
    replay_shards: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.capabilities, str):
            raise TypeError(f"capabilities must be a collection of names, got "
                            f"{self.capabilities!r}")
        caps = frozenset(self.capabilities)
        unknown = sorted(caps - set(CAPABILITIES))
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}: choose from "
                             f"{', '.join(sorted(CAPABILITIES))}")
        object.__setattr__(self, "capabilities", caps)
        for role, res in self.resources.items():
            check_role(role)
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}: roles are {', '.join(ROLES)}")
            if not isinstance(res, Resources):
                raise TypeError(f"resources[{role!r}] must be daskrl.Resources, got {res!r}")
        if self.sizes is not None and not isinstance(self.sizes, Sizes):
            raise TypeError(f"sizes must be daskrl.core.sizes.Sizes, got {self.sizes!r}")
        for name in ("num_steps", "num_envs", "num_actors", "replay_shards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    @property
    def steps_per_iteration(self) -> int:
        """Env steps of all actors in one iteration, which the driver sizes a run by
        (:class:`~daskrl.algos.actor_critic.VecEnvActor` collects at least this many valid
        transitions; steps that only reset an env do not count)."""
        return self.num_steps * self.num_envs * self.num_actors

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Graph scripts are loaded by path and registered with cloudpickle to travel by
        # value; plain pickle (which Dask tries first) would reference them by module name,
        # which workers cannot import. The bytes are made once per algorithm.
        blob = self.__dict__.get("_blob")
        if blob is None:
            fields = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
            blob = cloudpickle.dumps(fields)
            object.__setattr__(self, "_blob", blob)
        return _load_algorithm, (blob,)

    def resources_for(self, role: str) -> Resources:
        """The annotation of ``role`` (its fallback role's, else one CPU, when it has none)."""
        if role in self.resources:
            return self.resources[role]
        if role in ROLE_FALLBACK:
            return self.resources_for(ROLE_FALLBACK[role])
        return Resources(cpu=1)

    def with_resources(self, overrides: Mapping[str, Resources]) -> Algorithm:
        """A copy with some roles' resources replaced (the ``--resources`` flag)."""
        merged = dict(self.resources)
        merged.update(overrides)
        fields = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return Algorithm(**{**fields, "resources": merged})


_LOADED: dict[str, Algorithm] = {}


def _load_algorithm(blob: bytes) -> Algorithm:
    """Unpickle an algorithm once per process (tasks of every iteration carry the same one)."""
    digest = hashlib.sha1(blob).hexdigest()
    algo = _LOADED.get(digest)
    if algo is None:
        algo = Algorithm(**cloudpickle.loads(blob))
        object.__setattr__(algo, "_blob", blob)
        _LOADED.clear()  # keep only the current run's algorithm
        _LOADED[digest] = algo
    return algo
