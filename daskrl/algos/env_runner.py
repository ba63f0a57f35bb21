"""The env half of an actor: a vector env (gymnasium's or EnvPool's) stepped on actions, with
its episode bookkeeping (role ``env``; ``central-inference`` places it on CPU workers)."""

from __future__ import annotations

import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class StepCost:
    """What each env step costs beyond the env's own work: stand-ins for a simulator that
    the benchmarks and the scale lab put in place of a real one.

    Attributes
    ----------
    cpu_s : float
        CPU seconds burnt per env per step, in the actor's thread (an expensive simulator
        running here: ``--env-step-cost``).
    sleep_s : float
        Wall seconds slept per step of the whole vector env, costing no CPU (simulators on
        other hosts, which step an actor's envs at the same time: ``--env-step-sleep``). An
        actor with ``E`` envs then steps at most ``E / sleep_s`` env steps a second,
        however many envs a fused actor holds.

    Examples
    --------
    >>> cost = StepCost(sleep_s=0.001)
    >>> bool(cost), bool(StepCost())
    (True, False)
    >>> t0 = time.perf_counter(); cost.spend(num_envs=4); time.perf_counter() - t0 >= 0.001
    True
    """

    cpu_s: float = 0.0
    sleep_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cpu_s", "sleep_s"):
            if getattr(self, name) < 0:
                flag = "--env-step-cost" if name == "cpu_s" else "--env-step-sleep"
                raise ValueError(f"{flag} must be >= 0 seconds, got {getattr(self, name)}")

    def __bool__(self) -> bool:
        return bool(self.cpu_s or self.sleep_s)

    def spend(self, num_envs: int) -> None:
        """One vector step's cost: ``cpu_s`` per env burnt, then ``sleep_s`` slept."""
        if self.cpu_s:
            burn_cpu(self.cpu_s * num_envs)
        if self.sleep_s:
            time.sleep(self.sleep_s)


NO_COST = StepCost()
"""An env step that costs only the env's own work."""


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
    step_cost : StepCost
        What each step costs beyond the env's own work (a stand-in simulator's CPU or
        wall time).
    backend : {"gymnasium", "envpool"}
        Who steps the envs (:func:`~daskrl.core.envs.make_vector_env`).

    Box actions are clipped to the action space's bounds before they reach the envs.

    Examples
    --------
    >>> runner = EnvRunner("CartPole-v1", num_envs=2, seed=0)
    >>> runner.step(np.zeros(2, np.int64)).obs.shape
    (2, 4)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, step_cost: StepCost = NO_COST,
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
            self.step_cost.spend(self.num_envs)
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
