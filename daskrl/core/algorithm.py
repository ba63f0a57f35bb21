"""The algorithm bundle (:class:`Algorithm`), what a learner task returns
(:class:`LearnerOutput`) and what ``daskrl eval`` asks (:class:`EvalRequest`). The protocols
its roles declare live in :mod:`daskrl.core.contracts` and are re-exported here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import torch

from daskrl.core.contracts import (  # re-exported: the vocabulary an algorithm is written in
    CAPABILITIES,
    Actor,
    Batch,
    Coordinator,
    EnvPart,
    GradientActor,
    GradientLearner,
    InferencePart,
    Learner,
    LightStateLearner,
    ResizableActor,
    SplitActor,
    UpdatePlan,
    Weights,
)
from daskrl.core.fragment import check_role
from daskrl.core.replay import Replay
from daskrl.core.resources import Resources
from daskrl.core.sizes import Sizes
from daskrl.core.tensor_pickle import pack_tensors, unpack_tensors

__all__ = ["CAPABILITIES", "ROLES", "ROLE_FALLBACK", "Actor", "Algorithm", "Batch",
           "Coordinator", "EnvPart",
           "EvalRequest", "GradientActor", "GradientLearner", "InferencePart", "Learner",
           "LearnerOutput", "LightStateLearner", "ResizableActor", "SplitActor", "UpdatePlan",
           "Weights"]


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
    coordinator: dict[str, Any] = field(default_factory=dict)
    """The coordinator's state (:class:`~daskrl.core.contracts.Coordinator`), carried from
    one iteration to the next and checkpointed with the learner's; empty without one."""

    def __getstate__(self) -> dict[str, Any]:
        # CPU tensors travel as numpy arrays (why: daskrl.core.tensor_pickle)
        memo: dict[int, Any] = {}  # ``state["model"]`` is usually ``weights``: pack it once
        return {k: pack_tensors(v, memo) for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: unpack_tensors(v) for k, v in state.items()})


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


ROLES = ("rollout", "learner", "inference", "evaluate", "env", "replay", "coordinator")
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
    make_coordinator : callable ``() -> Coordinator``, optional
        Builds the coordinator (role ``coordinator``; :class:`Coordinator`), whose task runs
        after every iteration's learner and decides what the next one plays (a league);
        with one, every task runs one iteration (no grouping of short iterations). None:
        none.

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
    make_coordinator: Callable[[], Coordinator] | None = None

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
