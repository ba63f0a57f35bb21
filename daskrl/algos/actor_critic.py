"""Actor and learner for discrete actor-critic methods on gymnasium vector envs."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..envs import make_vector_env, space_dims
from .gae import gae
from .networks import DiscreteActorCritic
from .ppo import PPOHyper, ppo_update


class VecEnvActor:
    """A vector env and a policy copy that collect rollouts with GAE applied.

    Handles gymnasium's next-step auto-reset: the step after an episode ends is a reset
    step (action ignored, reward 0); it is dropped from the batch, and the value of the
    final observation bootstraps truncated episodes.

    Examples
    --------
    >>> actor = VecEnvActor("CartPole-v1", num_envs=2, seed=0)
    >>> batch = actor.rollout(16)
    >>> batch["obs"].shape[1], batch["stats"]["env_steps"] <= 32
    (4, True)
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
    ) -> None:
        self.env = make_vector_env(env_id, num_envs, seed)
        obs_dim, num_actions = space_dims(self.env)
        self.net = DiscreteActorCritic(obs_dim, num_actions, hidden)
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.obs, _ = self.env.reset(seed=seed)
        self.num_envs = num_envs
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self.ep_return = np.zeros(num_envs)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Collect ``num_steps`` steps of every env; return valid transitions and stats."""
        t0 = time.time()
        n = self.num_envs
        obs_buf = np.zeros((num_steps, n, *self.obs.shape[1:]), dtype=np.float32)
        actions = np.zeros((num_steps, n), dtype=np.int64)
        logp = np.zeros((num_steps, n), dtype=np.float32)
        values = np.zeros((num_steps + 1, n), dtype=np.float32)
        rewards = np.zeros((num_steps, n), dtype=np.float32)
        terminated = np.zeros((num_steps, n), dtype=bool)
        done = np.zeros((num_steps, n), dtype=bool)
        valid = np.zeros((num_steps, n), dtype=bool)
        returns_done: list[float] = []
        lengths_done: list[int] = []
        obs = self.obs
        for t in range(num_steps):
            obs_buf[t] = obs
            actions[t], logp[t], values[t] = self.net.act(obs, generator=self.generator)
            obs, rew, term, trunc, _ = self.env.step(actions[t])
            real = ~self.prev_done
            valid[t] = real
            rewards[t] = rew
            terminated[t] = term
            done[t] = term | trunc
            self.ep_return += rew * real
            self.ep_length += real
            finished = done[t] & real
            if finished.any():
                returns_done.extend(self.ep_return[finished].tolist())
                lengths_done.extend(self.ep_length[finished].tolist())
                self.ep_return[finished] = 0.0
                self.ep_length[finished] = 0
            self.prev_done = done[t]
        self.obs = obs
        values[num_steps] = self.net.act(obs, generator=self.generator)[2]
        adv, ret = gae(
            rewards, values[:-1], values[1:], terminated, done, self.gamma, self.gae_lambda
        )
        mask = valid.reshape(-1)
        batch: dict[str, Any] = {
            "obs": obs_buf.reshape(num_steps * n, -1)[mask],
            "actions": actions.reshape(-1)[mask],
            "logp": logp.reshape(-1)[mask],
            "values": values[:-1].reshape(-1)[mask],
            "advantages": adv.reshape(-1)[mask],
            "returns": ret.reshape(-1)[mask],
        }
        batch["stats"] = {
            "env_steps": int(mask.sum()),
            "episode_returns": returns_done,
            "episode_lengths": lengths_done,
            "t_start": t0,
            "t_end": time.time(),
            "policy_version": self.version,
        }
        return batch

    def close(self) -> None:
        """Close the envs."""
        self.env.close()


class ActorCriticLearner:
    """Actor-critic network and Adam optimiser updated by PPO.

    Examples
    --------
    >>> learner = ActorCriticLearner(4, 2, seed=0)
    >>> sorted(learner.weights())[:2]
    ['actor.0.bias', 'actor.0.weight']
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
        hp: PPOHyper | None = None,
        device: str = "cpu",
    ) -> None:
        torch.manual_seed(seed)
        self.hp = hp or PPOHyper()
        self.device = device
        self.net = DiscreteActorCritic(obs_dim, num_actions, hidden).to(device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.hp.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, batches: list[dict[str, Any]], progress: float) -> dict[str, float]:
        """One PPO update on the concatenated batches (stats are ignored here)."""
        keys = [k for k in batches[0] if k != "stats"]
        batch = {k: np.concatenate([b[k] for b in batches]) for k in keys}
        lr = self.hp.learning_rate * (1.0 - progress) if self.hp.anneal_lr else None
        metrics = ppo_update(
            self.net, self.optimizer, batch, self.hp, self.generator, lr=lr, device=self.device
        )
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copy of the network weights."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.net.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser and shuffling-generator state (CPU)."""
        optim = self.optimizer.state_dict()
        optim_cpu = {
            "param_groups": optim["param_groups"],
            "state": {i: {k: _cpu(v) for k, v in s.items()} for i, s in optim["state"].items()},
        }
        return {"model": self.weights(), "optimizer": optim_cpu,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def _cpu(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if torch.is_tensor(value) else value


def evaluate_policy(
    env_id: str,
    weights: dict[str, torch.Tensor],
    seed: int,
    episodes: int = 10,
    hidden: tuple[int, ...] = (64, 64),
) -> dict[str, float]:
    """Mean and std of the return of ``episodes`` greedy episodes on a fresh env.

    Examples
    --------
    >>> net = DiscreteActorCritic(4, 2)
    >>> evaluate_policy("CartPole-v1", net.state_dict(), seed=0, episodes=2)["eval_episodes"]
    2
    """
    env = make_vector_env(env_id, episodes, seed)
    obs_dim, num_actions = space_dims(env)
    net = DiscreteActorCritic(obs_dim, num_actions, hidden)
    net.load_state_dict(weights)
    obs, _ = env.reset(seed=seed)
    total = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        actions = net.act(obs, deterministic=True)[0]
        obs, rew, term, trunc, _ = env.step(actions)
        total += rew * running
        running &= ~(term | trunc)
    env.close()
    return {
        "eval_return_mean": float(total.mean()),
        "eval_return_std": float(total.std()),
        "eval_episodes": episodes,
    }
