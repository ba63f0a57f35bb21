"""The env half of an actor: a vector env (gymnasium's or EnvPool's) stepped on actions, with
its episode bookkeeping (role ``env``; ``central-inference`` places it on CPU workers)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from daskrl.core.envs import Backend, EnvStep, make_vector_env


def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (a stand-in for an expensive env step).

    CPU time, not wall time: on a busy machine the step takes longer, like real work would.

    Examples
    --------
    >>> burn_cpu(0.0)
    """
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class EnvRunner:
    """A vector env that steps on actions and keeps per-env episode returns and lengths.

    Parameters
    ----------
    env_id : str
        Gymnasium env id.
    num_envs : int
        Envs in the vector env.
    seed : int
        Seeds the envs.
    step_cost : float
        Extra CPU seconds burnt per env per step (models an expensive simulator).
    backend : {"gymnasium", "envpool"}
        Who steps the envs (:func:`~daskrl.core.envs.make_vector_env`).

    Box actions are clipped to the action space's bounds before they reach the envs.

    Examples
    --------
    >>> runner = EnvRunner("CartPole-v1", num_envs=2, seed=0)
    >>> runner.step(np.zeros(2, np.int64)).obs.shape
    (2, 4)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, step_cost: float = 0.0,
                 backend: Backend = "gymnasium") -> None:
        self.env = make_vector_env(env_id, num_envs, seed, backend, infos=False)  # unread
        self.obs, _ = self.env.reset(seed=seed)
        space = self.env.single_action_space
        self.bounds = ((space.low, space.high) if isinstance(space, gym.spaces.Box) else None)
        self.num_envs, self.step_cost = num_envs, step_cost
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self.ep_return = np.zeros(num_envs)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)
        self.step_s = 0.0
        """Seconds spent inside the vector env's ``step`` (and the step cost) so far."""

    def step(self, actions: np.ndarray) -> EnvStep:
        """Step every env once; the step after an episode ends is a reset step (not valid)."""
        t0 = time.perf_counter()
        if self.bounds is not None:
            actions = np.clip(actions, *self.bounds)
        obs, rew, term, trunc, _ = self.env.step(actions)
        if self.step_cost:
            burn_cpu(self.step_cost * self.num_envs)
        self.step_s += time.perf_counter() - t0
        valid = ~self.prev_done
        done = term | trunc
        self.ep_return += rew * valid
        self.ep_length += valid
        finished = done & valid
        out = EnvStep(obs, rew, term, done, valid)
        if finished.any():
            out.episode_returns = self.ep_return[finished].tolist()
            out.episode_lengths = self.ep_length[finished].tolist()
            self.ep_return[finished] = 0.0
            self.ep_length[finished] = 0
        self.prev_done = done
        self.obs = obs
        return out

    def close(self) -> None:
        """Close the envs."""
        self.env.close()
