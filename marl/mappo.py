"""MAPPO (Yu et al. 2022) with fused batched agents, for daskrl's distributions.

* a shared actor per team (parameter sharing), one forward pass per team over all agents
  of all environments of a worker (``[E, A_team, obs_dim] -> [E * A_team, obs_dim]``);
* a critic per team on the global state plus the agent's own observation
  (``critic="central"``, MAPPO) or on the own observation only (``critic="local"``, IPPO);
* GAE per agent, MAPPO's ValueNorm on value targets, the clipped surrogate of
  :mod:`daskrl.algos.ppo`.

The pieces live in :mod:`marl.mappo_model` (networks, with :mod:`marl.team_layout`,
:mod:`marl.value_norm` and :mod:`marl.activations`), :mod:`marl.mappo_policy` (the exported
actors), :mod:`marl.mappo_env` (envs, team layout, device), :mod:`marl.mappo_rollout`
(actor, GAE, evaluation), :mod:`marl.mappo_learner` (update, learner) and
:mod:`marl.mappo_video` (MP4s of episodes); this module gathers them and adds
:func:`train_inline`, the whole loop in one process without Dask (tests and benchmarks).
``graphs/mappo.py`` wraps them as a :class:`daskrl.Algorithm`.

Returns are per agent and per episode: ``return_mean/<team>`` is the mean over a team's
agents of their episode returns; the headline ``episode_return_mean``/``eval_return_mean``
is the adversary team's when the env has one (simple tag), else the mean over teams.

Examples
--------
>>> run = train_inline(EnvSpec(), iterations=1, num_envs=4, seed=0,
...                    hp=MAPPOHyper(update_epochs=1))
>>> sorted(k for k in run.history[-1] if k.startswith("return_mean/"))
['return_mean/adversary', 'return_mean/good']
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from .mappo_env import EnvSpec, layout_of, task_device, task_gpu
from .mappo_learner import MAPPOHyper, MAPPOLearner, team_metrics
from .mappo_model import MAPPOModel, ModelSpec, TeamLayout, ValueNorm, sample
from .mappo_policy import MAPPOPolicy
from .mappo_rollout import (
    HEADLINE_TEAM,
    EpisodeTracker,
    MAPPOActor,
    RolloutSpec,
    advantages,
    evaluate_teams,
    gae_tensor,
    mean_se,
    play_episodes,
)

__all__ = [
    "HEADLINE_TEAM", "EnvSpec", "EpisodeTracker", "MAPPOActor", "MAPPOHyper", "MAPPOLearner",
    "MAPPOModel", "MAPPOPolicy", "ModelSpec", "RolloutSpec", "TeamLayout", "ValueNorm",
    "advantages", "evaluate_teams", "gae_tensor", "layout_of", "mean_se", "play_episodes",
    "sample", "task_device",
    "task_gpu", "team_metrics", "InlineRun", "train_inline",
]


class InlineRun(NamedTuple):
    """What :func:`train_inline` returns."""

    learner: MAPPOLearner
    """The trained learner (``learner.weights()`` for evaluation)."""
    history: list[dict[str, Any]]
    """Each round's learner metrics, plus ``env_steps`` (cumulative) and ``wall_s``."""


def train_inline(env: EnvSpec, iterations: int, num_envs: int, seed: int = 0,
                 model: ModelSpec | None = None, hp: MAPPOHyper | None = None,
                 rollout: RolloutSpec | None = None, num_steps: int | None = None,
                 device: str = "cpu") -> InlineRun:
    """Train MAPPO for ``iterations`` rollout + update rounds in this process.

    Parameters
    ----------
    env : EnvSpec
        The env.
    iterations : int
        Rollout + update rounds.
    num_envs : int
        Environments stepped together.
    seed : int
        Seeds everything.
    model, hp, rollout : optional
        Network, update and rollout settings (defaults: MAPPO's).
    num_steps : int, optional
        Steps per rollout (default ``env.max_cycles``).
    device : str
        Where envs, rollouts and updates run.

    Returns
    -------
    InlineRun
        The learner and each round's metrics.
    """
    model, hp, rollout = model or ModelSpec(), hp or MAPPOHyper(), rollout or RolloutSpec()
    if rollout.random_teams and hp.trained_teams is None:
        layout = layout_of(env)
        trained = tuple(n for n in layout.names if n not in rollout.random_teams)
        hp = MAPPOHyper(**{**hp.__dict__, "trained_teams": trained})
    learner = MAPPOLearner(layout_of(env), model, hp, seed, device)
    actor = MAPPOActor(env, model, rollout, num_envs, seed + 1, device)
    steps = num_steps or env.max_cycles
    history: list[dict[str, Any]] = []
    env_steps, t0 = 0, time.time()
    for k in range(iterations):
        actor.set_weights(learner.weights(), k)
        batch = actor.collect(steps)
        metrics = learner.update([batch], k / iterations)
        env_steps += batch["stats"]["env_steps"]
        metrics.update(env_steps=env_steps, wall_s=time.time() - t0)
        history.append(metrics)
    return InlineRun(learner, history)
