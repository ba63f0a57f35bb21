"""Actor and learner for actor-critic methods on vector envs (gymnasium's or EnvPool's).

An actor is two halves that distributions may place apart: an :class:`EnvRunner` (the
vector env and its episode bookkeeping; role ``env``) and a :class:`RolloutRecorder` (the
policy copy, the rollout buffers and GAE; role ``inference``). :class:`VecEnvActor` runs
both in one loop (``actors-learner``, ``single``, ``data-parallel``); ``central-inference``
steps runners on CPU workers and feeds a recorder on the learner's worker. The learner,
:class:`~daskrl.algos.learner.ActorCriticLearner`, is importable from here too.

The network is chosen from the env's spaces (:func:`~daskrl.algos.networks.actor_critic_for`).
Observations are stored in the env's dtype when it is uint8 (Atari frames travel 4x smaller
than float32), else as float32. With running statistics (:mod:`daskrl.algos.normalize`) the
recorder scales rewards by the return statistics that came with the weights and returns the
moments of the observations and returns it saw (``batch["moments"]``) for the learner to merge.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from daskrl.algos.evaluation import evaluate_module
from daskrl.algos.gae import gae
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.networks import DiscreteActorCritic, actor_critic_for
from daskrl.algos.normalize import Moments, Normalization
from daskrl.core.envs import Backend, EnvStep, env_spaces, make_vector_env

__all__ = ["ActorCriticLearner", "DiscreteActorCritic", "EnvRunner", "EnvStep", "RolloutRecorder",
           "VecEnvActor", "burn_cpu", "evaluate_policy", "policy_module", "spaces_of"]


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


class RolloutRecorder:
    """A policy copy that picks actions step by step and turns the steps into a PPO batch.

    Storage is ``(num_steps, num_envs)`` (grown when a rollout runs longer); :meth:`finish`
    applies GAE and keeps only the valid transitions (reset steps dropped), flattened.
    ``inference_s`` in the stats is the time spent choosing actions and values.

    Examples
    --------
    >>> rec = RolloutRecorder(DiscreteActorCritic(4, 2), seed=0)
    >>> runner = EnvRunner("CartPole-v1", num_envs=2, seed=0)
    >>> rec.begin(3, runner.obs)
    >>> for _ in range(3):
    ...     rec.record(runner.step(rec.act(runner.obs)))
    >>> rec.finish(runner.obs)["obs"].shape
    (6, 4)
    """

    def __init__(self, net: nn.Module, seed: int, gamma: float = 0.99,
                 gae_lambda: float = 0.95, sign_reward: bool = False) -> None:
        self.net = net
        self.generator = torch.Generator().manual_seed(seed)
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.sign_reward = sign_reward
        self.version = -1
        self.t = 0
        self.inference_s = 0.0
        self.discounted: np.ndarray | None = None
        """Per env: the discounted return so far of its episode (reward scaling's statistic)."""

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version

    def begin(self, num_steps: int, obs: np.ndarray) -> None:
        """Buffers for ``num_steps`` steps of ``len(obs)`` envs (the last rollout's when they
        fit: :meth:`finish` hands out copies, never the buffers)."""
        n = len(obs)
        self.t, self.t_start, self.inference_s = 0, time.time(), 0.0
        self.returns_done: list[float] = []
        self.lengths_done: list[int] = []
        if self.discounted is None or len(self.discounted) != n:
            self.discounted = np.zeros(n)
        old = getattr(self, "obs", None)
        if old is not None and old.shape == (num_steps, n, *obs.shape[1:]):
            return
        dtype = np.uint8 if obs.dtype == np.uint8 else np.float32
        self.obs = np.zeros((num_steps, n, *obs.shape[1:]), dtype=dtype)
        self.actions = np.zeros((num_steps, n, *self.net.action_shape),
                                dtype=self.net.action_dtype)
        self.logp = np.zeros((num_steps, n), dtype=np.float32)
        self.values = np.zeros((num_steps + 1, n), dtype=np.float32)
        self.rewards = np.zeros((num_steps, n), dtype=np.float32)
        self.terminated = np.zeros((num_steps, n), dtype=bool)
        self.done = np.zeros((num_steps, n), dtype=bool)
        self.valid = np.zeros((num_steps, n), dtype=bool)
        self.returns_seen = np.zeros((num_steps, n))

    def _grow(self) -> None:
        """Make room for more steps than :meth:`begin` allocated (doubling)."""
        for name in ("obs", "actions", "logp", "values", "rewards", "terminated", "done",
                     "valid", "returns_seen"):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros_like(old)]))

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Sample actions for step ``t`` (one batched forward pass) and record them."""
        t0 = time.perf_counter()
        t = self.t
        if t == len(self.actions):
            self._grow()
        self.obs[t] = obs
        actions, logp, values = self.net.act(self.obs[t], self.generator)
        actions = actions.numpy(force=True)  # force: also from a GPU (central inference)
        self.actions[t], self.logp[t] = actions, logp.numpy(force=True)
        self.values[t] = values.numpy(force=True)
        self.inference_s += time.perf_counter() - t0
        return actions  # its own array: the buffer is reused by the next rollout

    def record(self, step: EnvStep) -> None:
        """Record what the envs returned for step ``t`` and advance to ``t + 1``."""
        t = self.t
        self.rewards[t] = self._reward(step)
        self.terminated[t] = step.terminated
        self.done[t] = step.done
        self.valid[t] = step.valid
        if step.episode_returns:
            self.returns_done.extend(step.episode_returns)
            self.lengths_done.extend(step.episode_lengths)
        self.t = t + 1

    def _device_obs(self, obs: np.ndarray) -> torch.Tensor:
        """``obs`` as the network takes it: uint8 frames as they are, others flat float32."""
        if obs.dtype == np.uint8:
            return torch.as_tensor(obs)
        x = torch.as_tensor(obs, dtype=torch.float32)
        return x.reshape(len(x), -1)

    def _reward(self, step: EnvStep) -> np.ndarray:
        """The reward to learn from: its sign (``sign_reward``), then divided by the running
        std of the discounted return when the network keeps ``ret_rms`` (gymnasium's
        ``NormalizeReward``, with the statistics frozen for the rollout)."""
        reward = np.sign(step.reward) if self.sign_reward else step.reward
        rms = self.net.ret_rms
        if rms is None:
            return reward
        assert self.discounted is not None
        valid = step.valid
        self.discounted[valid] = self.discounted[valid] * self.gamma + reward[valid]
        self.returns_seen[self.t] = self.discounted
        self.discounted[step.done & valid] = 0.0
        return np.clip(reward / rms.std(), -rms.clip, rms.clip)

    def finish(self, last_obs: np.ndarray) -> dict[str, Any]:
        """Bootstrap from ``last_obs``, apply GAE, return the valid transitions and stats."""
        T = self.t
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.values[T] = self.net.value(self._device_obs(last_obs))
        self.inference_s += time.perf_counter() - t0
        adv, ret = gae(self.rewards[:T], self.values[:T], self.values[1 : T + 1],
                       self.terminated[:T], self.done[:T], self.gamma, self.gae_lambda)
        mask = self.valid[:T].reshape(-1)
        flat = T * self.obs.shape[1]
        image = self.obs.dtype == np.uint8 and self.obs.ndim == 5
        obs = self.obs[:T].reshape(flat, *(self.obs.shape[2:] if image else (-1,)))[mask]
        batch: dict[str, Any] = {
            "obs": obs,
            "actions": self.actions[:T].reshape(flat, *self.net.action_shape)[mask],
            "logp": self.logp[:T].reshape(-1)[mask],
            "values": self.values[:T].reshape(-1)[mask],
            "advantages": adv.reshape(-1)[mask],
            "returns": ret.reshape(-1)[mask],
        }
        moments = {}
        if self.net.obs_rms is not None:
            moments["obs"] = Moments.of(obs)
        if self.net.ret_rms is not None:
            moments["ret"] = Moments.of(self.returns_seen[:T].reshape(-1)[mask])
        if moments:
            batch["moments"] = moments
        batch["stats"] = {
            "env_steps": int(mask.sum()),
            "rollout_steps": T,
            "episode_returns": self.returns_done,
            "episode_lengths": self.lengths_done,
            "t_start": self.t_start,
            "t_end": time.time(),
            "inference_s": self.inference_s,
            "policy_version": self.version,
        }
        return batch


class VecEnvActor:
    """A vector env and a policy copy that collect rollouts with GAE applied.

    Handles gymnasium's next-step auto-reset: the step after an episode ends is a reset
    step (action ignored, reward 0); it is dropped from the batch, and the value of the
    final observation bootstraps truncated episodes. The env is built on first use, so a
    distribution can take only the policy half (:attr:`recorder`) or make a resized copy
    (:meth:`resized`) without building envs it will not step.

    Examples
    --------
    >>> actor = VecEnvActor("CartPole-v1", num_envs=2, seed=0)
    >>> batch = actor.rollout(16)
    >>> batch["obs"].shape[1], batch["stats"]["env_steps"] >= 32
    (4, True)
    >>> actor.resized(8, seed=1).num_envs
    8
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        step_cost: float = 0.0,
        normalization: Normalization | None = None,
        backend: Backend = "gymnasium",
    ) -> None:
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.hidden, self.step_cost = hidden, step_cost
        self.normalization, self.backend = normalization or Normalization(), backend
        net = actor_critic_for(*spaces_of(env_id, backend), hidden, self.normalization)
        self.recorder = RolloutRecorder(net, seed, gamma, gae_lambda,
                                        self.normalization.sign_reward)
        self._runner: EnvRunner | None = None

    @property
    def runner(self) -> EnvRunner:
        """The env half, built on first use."""
        if self._runner is None:
            self._runner = EnvRunner(self.env_id, self.num_envs, self.seed, self.step_cost,
                                     self.backend)
        return self._runner

    @property
    def env(self) -> Any:
        """The gymnasium vector env."""
        return self.runner.env

    @property
    def net(self) -> nn.Module:
        """The policy copy (the head :func:`~daskrl.algos.networks.actor_critic_for` chose)."""
        return self.recorder.net

    @property
    def version(self) -> int:
        """Version of the loaded weights (-1 before the first :meth:`set_weights`)."""
        return self.recorder.version

    def resized(self, num_envs: int, seed: int) -> VecEnvActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed`` (fusion, env groups)."""
        rec = self.recorder
        return VecEnvActor(self.env_id, num_envs, seed, self.hidden, rec.gamma, rec.gae_lambda,
                           self.step_cost, self.normalization, self.backend)

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        self.recorder.set_weights(weights, version)

    def env_part(self) -> EnvRunner:
        """The env half (:class:`~daskrl.core.algorithm.SplitActor`; ``central-inference``)."""
        return self.runner

    def inference_part(self) -> RolloutRecorder:
        """The policy half (:class:`~daskrl.core.algorithm.SplitActor`; ``central-inference``)."""
        return self.recorder

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Collect at least ``num_steps * num_envs`` transitions; return them and stats.

        Every env steps ``num_steps`` times, then all envs step again until the valid
        transitions reach ``num_steps * num_envs``: the auto-reset steps that fell inside
        the rollout carry no transition, so without the extra steps a run would end short of
        the env steps it asked for. ``env_steps`` in the stats counts transitions (what the
        batch holds); ``rollout_steps`` the vector-env steps taken; ``env_s`` and
        ``inference_s`` the seconds spent in the envs and in the policy.
        """
        runner, rec = self.runner, self.recorder
        env_s = runner.step_s
        rec.begin(num_steps + max(2, num_steps // 8), runner.obs)
        for _ in range(num_steps):
            rec.record(runner.step(rec.act(runner.obs)))
        missing = num_steps * self.num_envs - int(np.count_nonzero(rec.valid[: rec.t]))
        while missing > 0:
            step = runner.step(rec.act(runner.obs))
            rec.record(step)
            missing -= int(np.count_nonzero(step.valid))
        batch = rec.finish(runner.obs)
        batch["stats"]["env_s"] = runner.step_s - env_s
        return batch

    def close(self) -> None:
        """Close the envs."""
        if self._runner is not None:
            self._runner.close()


_SPACES: dict[tuple[str, str], tuple[gym.Space, gym.Space]] = {}


def spaces_of(env_id: str, backend: Backend = "gymnasium") -> tuple[gym.Space, gym.Space]:
    """Single observation and action spaces of ``env_id`` (probed once per process).

    Examples
    --------
    >>> spaces_of("CartPole-v1")[1]
    Discrete(2)
    """
    if (env_id, backend) not in _SPACES:
        _SPACES[env_id, backend] = env_spaces(env_id, backend)
    return _SPACES[env_id, backend]


def policy_module(env_id: str, hidden: tuple[int, ...], weights: dict[str, torch.Tensor],
                  deterministic: bool = True, normalization: Normalization | None = None
                  ) -> torch.nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``): observations in,
    actions out (normalised by the running statistics in ``weights``, when it has them).

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> pi = policy_module("CartPole-v1", (64, 64), net.state_dict())
    >>> pi(torch.zeros(5, 4)).shape
    torch.Size([5])
    """
    net = actor_critic_for(*spaces_of(env_id), hidden, normalization)
    net.load_state_dict(weights)
    return net.policy(deterministic).eval()


def evaluate_policy(
    env_id: str,
    weights: dict[str, torch.Tensor],
    seed: int,
    episodes: int = 10,
    hidden: tuple[int, ...] = (64, 64),
    normalization: Normalization | None = None,
) -> dict[str, float]:
    """Mean and std of the return of ``episodes`` greedy episodes on a fresh env.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> evaluate_policy("CartPole-v1", net.state_dict(), seed=0, episodes=2)["eval_episodes"]
    2
    """
    obs_space, action_space = env_spaces(env_id)
    net = actor_critic_for(obs_space, action_space, hidden, normalization)
    net.load_state_dict(weights)
    return evaluate_module(env_id, net.policy(True), seed, episodes)
