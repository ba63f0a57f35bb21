"""The policy half of an actor: a policy copy that picks actions step by step, the rollout
buffers, reward scaling and GAE (role ``inference``).

Observations are stored in the env's dtype when it is uint8 (Atari frames travel 4x smaller
than float32), else as float32. With running statistics (:mod:`daskrl.algos.normalize`) the
recorder scales rewards by the return statistics that came with the weights and returns the
moments of the observations and returns it saw (``batch["moments"]``) for the learner to merge.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from daskrl.algos.gae import gae
from daskrl.algos.normalize import Moments
from daskrl.core.envs import EnvStep


class RolloutRecorder:
    """A policy copy that picks actions step by step and turns the steps into a PPO batch.

    Storage is ``(num_steps, num_envs)`` (grown when a rollout runs longer); :meth:`finish`
    applies GAE and keeps only the valid transitions (reset steps dropped), flattened.
    ``inference_s`` in the stats is the time spent choosing actions and values.

    Examples
    --------
    >>> from daskrl.algos.env_runner import EnvRunner
    >>> from daskrl.algos.networks import DiscreteActorCritic
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
        scaled, self.returns_seen[self.t] = rms.scale_rewards(
            reward, self.discounted, step.valid, step.done, self.gamma)
        return scaled

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
