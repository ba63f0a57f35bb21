"""``central-inference`` (SEED RL): envs step on CPU workers, one batched policy serves them all.

Each env worker holds its replicas' envs, split into ``env_groups`` groups (SRL's env ring,
default 2). Per step and group there is one ``inference`` task on the learner's worker (one
forward pass over that group's envs on every env worker) and one ``env`` task per env worker
(step those envs with the actions); a few more steps follow to make up for auto-reset steps
(:func:`extra_steps`), so each iteration collects its env steps. While group 0 steps, group 1
is being served: stepping and inference overlap. Observations and actions cross the network
every step; trajectories stay on the inference worker, which hands each group's finished batch
(GAE applied) to the learner. A task costs ~2 ms of Dask overhead, so a step of a group costs
~5 ms however few envs it has: this distribution pays off with many envs per group or a heavy
policy.

Keys: ``env-<worker>g<group>-it<k>-s<t>`` (``s0`` reads the current observation, ``s<t>``
takes step ``t``) and ``inference-<group>-it<k>-s<t>`` (the last, ``s<num_steps + extra>``,
returns the batch).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from dask.delayed import Delayed

from daskrl.core import roles
from daskrl.core.algorithm import (
    Algorithm,
    Batch,
    EnvPart,
    InferencePart,
    LearnerOutput,
    SplitActor,
)
from daskrl.core.envs import EnvStep
from daskrl.core.fragment import Fragment
from daskrl.core.keys import step_key, task_key
from daskrl.core.placement import task
from daskrl.core.roles import TaskContext
from daskrl.core.worker_state import resident, worker_name
from daskrl.distributions.actors_learner import colocated
from daskrl.distributions.base import Distribution, IterationInputs, pinned, to_int


def unit_seed(ctx: TaskContext, unit: int) -> int:
    """Seed of env unit ``unit`` (one group of one env worker); salted by the build iteration."""
    return TaskContext(ctx.run, ctx.seed, unit, ctx.iteration, ctx.num_iterations
                       ).replica_seed(ctx.iteration)


def _split_actor(algo: Algorithm, num_envs: int, seed: int) -> SplitActor:
    """An actor of ``num_envs`` envs (the algorithm declares ``split-actor``)."""
    proto = cast(SplitActor, algo.make_actor(seed))
    return cast(SplitActor, proto.resized(num_envs, seed))


def _env_part(algo: Algorithm, num_envs: int, seed: int) -> EnvPart:
    return _split_actor(algo, num_envs, seed).env_part()


def _inference_part(algo: Algorithm, num_envs: int, seed: int) -> dict[str, Any]:
    """A group's inference state: its actor's inference part, and whether it was just built."""
    return {"part": _split_actor(algo, num_envs, seed).inference_part(), "built": True}


def observe(ctx: TaskContext, algo: Algorithm, unit: int, num_envs: int, _after: int
            ) -> np.ndarray:
    """Role ``env``: the current observation of this unit's envs (built on first use).

    ``_after`` (the previous iteration's version) only orders this after its learner.
    """
    part, _ = resident((ctx.run, "env", unit),
                       lambda: _env_part(algo, num_envs, unit_seed(ctx, unit)))
    return part.obs


def env_step(ctx: TaskContext, unit: int, offset: int, num_envs: int,
             actions: np.ndarray | None) -> EnvStep | None:
    """Role ``env``: step this unit's envs with its slice of the group's actions (no step
    when the group already holds its transitions: ``actions`` is None)."""
    if actions is None:
        return None
    part: EnvPart = resident((ctx.run, "env", unit), _lost("env", unit))[0]
    return part.step(actions[offset : offset + num_envs])


def extra_steps(num_steps: int) -> int:
    """Steps a group may take past ``num_steps`` to make up for auto-reset steps, which carry
    no transition (the headroom :meth:`VecEnvActor.rollout` allocates).

    Examples
    --------
    >>> extra_steps(128), extra_steps(8)
    (16, 2)
    """
    return max(2, num_steps // 8)


def infer(ctx: TaskContext, start: tuple[Algorithm, LearnerOutput] | None, group: int,
          t: int, num_steps: int, sizes: tuple[int, ...], *parts: Any
          ) -> np.ndarray | Batch | None:
    """Role ``inference``: record step ``t - 1`` of group ``group`` and act for step ``t``.

    ``start`` (the algorithm and the learner's output) comes with ``t == 0`` only, so the
    per-step tasks stay small. ``parts`` are the env workers' observations (``t == 0``) or
    their :class:`EnvStep` results. Like :meth:`VecEnvActor.rollout`, every env steps
    ``num_steps`` times, then all step again until the valid transitions reach
    ``num_steps`` per env (auto-reset steps carry none), for at most
    :func:`extra_steps` more steps; once they are reached the remaining tasks of the
    chain pass ``None`` (no step). At ``t == num_steps + extra_steps(num_steps)`` the
    group's batch (GAE applied) is returned instead of actions.
    """
    key = (ctx.run, "inference", group)
    if start is not None:
        algo, learner_in = start
        seed = unit_seed(ctx, group)  # = the seed of group `group` on the first env worker
        state, built = resident(key, lambda: _inference_part(algo, sum(sizes), seed))
        state["built"] = built
        rec: InferencePart = state["part"]
        rec.set_weights(learner_in.weights, learner_in.version)
        obs = np.concatenate(parts)
        rec.begin(num_steps + extra_steps(num_steps), obs)
        state["obs"], state["missing"] = obs, num_steps * len(obs)
        return rec.act(obs)
    state = resident(key, _lost("inference", group))[0]
    rec = state["part"]
    if parts[0] is not None:  # the envs stepped
        step = merge_steps(parts)
        rec.record(step)
        state["obs"] = step.obs
        state["missing"] -= int(np.count_nonzero(step.valid))
    last = num_steps + extra_steps(num_steps)
    if t < num_steps or (t < last and state["missing"] > 0 and parts[0] is not None):
        return rec.act(state["obs"])
    if t < last:
        return None
    batch = rec.finish(state["obs"])
    batch["stats"].update(worker=worker_name(), built=state["built"], replica=f"g{group}")
    return batch


def merge_steps(steps: tuple[EnvStep, ...]) -> EnvStep:
    """One :class:`EnvStep` of the envs of several workers, in worker order.

    Examples
    --------
    >>> s = EnvStep(np.zeros((2, 4)), np.ones(2), *(np.zeros(2, bool),) * 3, [1.0], [5])
    >>> m = merge_steps((s, s))
    >>> m.obs.shape, m.episode_returns
    ((4, 4), [1.0, 1.0])
    """
    if len(steps) == 1:
        return steps[0]
    arrays = {f: np.concatenate([getattr(s, f) for s in steps])
              for f in ("obs", "reward", "terminated", "done", "valid")}
    return EnvStep(**arrays, episode_returns=[r for s in steps for r in s.episode_returns],
                   episode_lengths=[n for s in steps for n in s.episode_lengths])


def _lost(role: str, unit: int) -> Any:
    def fail() -> Any:
        raise RuntimeError(
            f"central-inference: the {role} state of unit {unit} is not on worker "
            f"{worker_name()!r} (its worker was lost mid-rollout); resume the run from its "
            "last checkpoint with --resume")
    return fail


def _version(output: LearnerOutput) -> int:
    return output.version


def group_sizes(num_envs: int, groups: int) -> list[int]:
    """Split ``num_envs`` envs into ``groups`` near-equal groups.

    Examples
    --------
    >>> group_sizes(9, 2)
    [5, 4]
    """
    if num_envs < groups:
        raise ValueError(f"central-inference: an env worker has {num_envs} envs, fewer than "
                         f"env_groups={groups}; raise --num-envs or lower env_groups")
    return [num_envs // groups + (i < num_envs % groups) for i in range(groups)]


class CentralInference(Distribution):
    """Env workers step, one batched inference worker acts for all of them (MSRL's DP-B).

    Parameters
    ----------
    env_groups : int
        Groups each env worker's envs are split into (>= 2 lets stepping one group
        overlap inference for the other; 1 turns the ring off).

    Examples
    --------
    >>> CentralInference(env_groups="3").groups
    3
    """

    name = "central-inference"
    requires = frozenset({"split-actor", "resizable-actor"})

    def __init__(self, env_groups: int | str = 2) -> None:
        self.groups = to_int("env_groups", env_groups)

    def required(self, algo: Algorithm) -> dict[str, str]:
        """``split-actor`` and ``resizable-actor``: env groups step apart from inference."""
        fix = ("pick actors-learner, single or data-parallel, or give the actor env_part() and "
               "inference_part() like VecEnvActor")
        return {"split-actor": fix,
                "resizable-actor": "give the actor resized(num_envs, seed) like VecEnvActor"}

    def task_floor_s(self, algo: Algorithm, hop_s: float) -> float:
        """Each env group's steps are a chain: an ``inference`` task, then its ``env``
        task, per step: two hops a step."""
        return 2 * algo.num_steps * hop_s

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """Env replicas, one inference server and one learner."""
        return [
            Fragment(env_step, "env", algo.resources_for("env"), algo.num_actors),
            Fragment(infer, "inference", algo.resources_for("inference")),
            Fragment(roles.learn, "learner", algo.resources_for("learner")),
        ]

    def batches(self, inputs: IterationInputs) -> list[Delayed]:
        """One delayed batch per env group (the last inference task of its chain)."""
        algo, place, k, run = inputs.algo, inputs.placement, inputs.iteration, inputs.run
        workers = ([(r,) for r in range(algo.num_actors)] if inputs.deterministic
                   else colocated(place, "env", algo.num_actors))  # units then follow replicas
        sizes = [group_sizes(len(reps) * algo.num_envs, self.groups) for reps in workers]
        env_res, inf_res = place.resources["env"], place.resources["inference"]
        inf_worker = place.worker("inference", 0)
        after = pinned(_version, inputs.learner_in, key=task_key("version", 0, k, run),
                       resources=inf_res, worker=place.worker("learner", 0), strict=False)
        out = []
        for g in range(self.groups):
            units = [i * self.groups + g for i in range(len(workers))]
            group = tuple(s[g] for s in sizes)
            offsets = np.cumsum((0,) + group)[:-1].tolist()
            env_ctx = [inputs.context("env", u) for u in units]
            env_worker = [place.worker("env", reps[0]) for reps in workers]
            parts = [pinned(observe, env_ctx[i], algo, u, group[i], after,
                            key=step_key("env", f"{i}g{g}", k, 0, run), resources=env_res,
                            worker=env_worker[i]) for i, u in enumerate(units)]
            ctx = inputs.context("inference", g)
            last = algo.num_steps + extra_steps(algo.num_steps)
            for t in range(last + 1):
                start = (algo, inputs.learner_in) if t == 0 else None
                acted = pinned(infer, ctx, start, g, t, algo.num_steps, group, *parts,
                               key=step_key("inference", g, k, t, run), resources=inf_res,
                               worker=inf_worker)
                if t == last:
                    out.append(acted)
                    break
                parts = [pinned(env_step, env_ctx[i], u, offsets[i], group[i], acted,
                                key=step_key("env", f"{i}g{g}", k, t + 1, run),
                                resources=env_res, worker=env_worker[i])
                         for i, u in enumerate(units)]
        return out

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """The env ring's step chains feeding one learner task."""
        place = inputs.placement
        return task(roles.learn, inputs.context("learner", 0), inputs.algo, inputs.learner_in,
                    *self.batches(inputs), role="learner", replica=0, iteration=inputs.iteration,
                    run=inputs.run, resources=place.resources["learner"],
                    worker=place.worker("learner", 0))
