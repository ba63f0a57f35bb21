"""Actors' side of off-policy learning: vector envs stepped with a caller's actions, their
steps folded into n-step transitions for a replay (DQN's, Ape-X's and SAC's actors)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from daskrl.algos.actor_critic import EnvRunner
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.nstep import concat_steps, nstep_transitions

Batch = dict[str, Any]


class TransitionCollector:
    """A vector env stepped with a caller's actions, its steps folded into n-step
    transitions (:func:`~daskrl.algos.nstep.nstep_transitions`), the unfinished ones
    carried to the next rollout.

    Examples
    --------
    >>> col = TransitionCollector("CartPole-v1", num_envs=2, seed=0, n_step=3, gamma=0.9)
    >>> batch = col.collect(8, lambda obs: np.zeros(len(obs), np.int64))
    >>> sorted(batch), batch["stats"]["env_steps"] <= 16
    (['actions', 'discounts', 'next_obs', 'obs', 'rewards', 'stats'], True)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, n_step: int = 1,
                 gamma: float = 0.99, step_cost: StepCost = NO_COST) -> None:
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.n_step, self.gamma, self.step_cost = n_step, gamma, step_cost
        self._runner: EnvRunner | None = None
        self.kept: dict[str, np.ndarray] | None = None

    @property
    def runner(self) -> EnvRunner:
        """The envs, built on first use."""
        if self._runner is None:
            self._runner = EnvRunner(self.env_id, self.num_envs, self.seed, self.step_cost)
        return self._runner

    def collect(self, num_steps: int, choose: Callable[[np.ndarray], np.ndarray]) -> Batch:
        """Step every env ``num_steps`` times with ``choose(obs)``'s actions; return the
        finished transitions and ``stats`` (``env_steps`` counts steps that were not
        resets, ``inference_s`` the time in ``choose``)."""
        runner = self.runner
        t_start, env_s, inference_s = time.time(), runner.step_s, 0.0
        cols: dict[str, list[np.ndarray]] = {k: [] for k in (
            "obs", "actions", "rewards", "next_obs", "terminated", "done", "pending")}
        returns: list[float] = []
        lengths: list[int] = []
        for _ in range(num_steps):
            obs = runner.obs
            t0 = time.perf_counter()
            actions = choose(obs)
            inference_s += time.perf_counter() - t0
            step = runner.step(actions)
            for key, value in (("obs", obs), ("actions", actions), ("rewards", step.reward),
                               ("next_obs", step.obs), ("terminated", step.terminated),
                               ("done", step.done), ("pending", step.valid)):
                cols[key].append(np.array(value))  # envs may reuse their arrays
            returns += step.episode_returns
            lengths += step.episode_lengths
        steps = {k: np.stack(v) for k, v in cols.items()}
        env_steps = int(steps["pending"].sum())
        batch, self.kept = nstep_transitions(concat_steps(self.kept, steps), self.n_step,
                                             self.gamma)
        batch["obs"] = batch["obs"].astype(np.float32, copy=False)
        batch["next_obs"] = batch["next_obs"].astype(np.float32, copy=False)
        batch["stats"] = {"env_steps": env_steps, "rollout_steps": num_steps,
                          "episode_returns": returns, "episode_lengths": lengths,
                          "t_start": t_start, "t_end": time.time(),
                          "env_s": runner.step_s - env_s, "inference_s": inference_s}
        return batch

    def close(self) -> None:
        """Close the envs."""
        if self._runner is not None:
            self._runner.close()
