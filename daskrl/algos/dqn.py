"""DQN (double Q, target network, n-step, Huber loss) with its replay resident in the learner.

The learner's :meth:`DQNLearner.update` adds the batches it receives to its replay, then
takes one gradient step per ``train_frequency`` new env steps once the replay holds
``learning_starts`` transitions (before that it only waits, filling the buffer), so the
existing ``single`` and ``actors-learner`` distributions run it unchanged. Actors
(:class:`QActor`) act epsilon-greedily with the epsilon the learner wrote into the weights
(a buffer of :class:`QNetwork`: it is set from the run's progress, and travels with the
weights), fold their steps into ``n``-step transitions, and, for Ape-X, compute the
transitions' initial priorities.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from daskrl.algos.actor_critic import EnvRunner
from daskrl.algos.replay import (
    concat_steps,
    importance_weights,
    make_replay,
    nstep_transitions,
)

Batch = dict[str, Any]


def relu_mlp(n_in: int, n_out: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """A ReLU MLP (PyTorch's default initialisation, as CleanRL's and SB3's Q-networks).

    Examples
    --------
    >>> relu_mlp(4, 2, (8,))(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), nn.ReLU()]
        n_in = h
    layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


class EpsilonGreedy(nn.Module):
    """A Q-network's policy alone: ``forward(obs) -> actions``, argmax of Q, or with
    probability ``epsilon`` a uniformly random action (scriptable, no numpy).

    Examples
    --------
    >>> pi = EpsilonGreedy(relu_mlp(4, 2, (8,)), epsilon=0.0)
    >>> pi(torch.zeros(3, 4)).shape
    torch.Size([3])
    """

    def __init__(self, q: nn.Module, epsilon: float = 0.0) -> None:
        super().__init__()
        self.q = q
        self.epsilon = float(epsilon)

    def forward(self, obs: Tensor) -> Tensor:
        """Actions (int64) for a batch of observations."""
        q = self.q(obs.float().reshape(obs.shape[0], -1))
        greedy = q.argmax(-1)
        if self.epsilon <= 0:
            return greedy
        explore = torch.rand(greedy.shape, device=q.device) < self.epsilon
        random = torch.randint(0, q.shape[-1], greedy.shape, device=q.device)
        return torch.where(explore, random, greedy)


class QNetwork(nn.Module):
    """Action values over flat observations, and the exploration rate the actors use.

    ``epsilon`` is a buffer, so it travels in the ``state_dict`` with the weights: the
    learner sets it from the run's progress, every actor reads it when it loads weights.

    Examples
    --------
    >>> net = QNetwork(4, 2, (16, 16))
    >>> net(torch.zeros(5, 4)).shape, float(net.epsilon)
    (torch.Size([5, 2]), 1.0)
    >>> net.policy(deterministic=True)(torch.zeros(5, 4)).shape
    torch.Size([5])
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (256, 256)
                 ) -> None:
        super().__init__()
        self.q = relu_mlp(obs_dim, num_actions, hidden)
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, obs: Tensor) -> Tensor:
        """Q-values ``[B, num_actions]``."""
        return self.q(obs.reshape(obs.shape[0], -1))

    def policy(self, deterministic: bool = True) -> EpsilonGreedy:
        """Greedy (``deterministic``) or epsilon-greedy with the current epsilon."""
        return EpsilonGreedy(self.q, 0.0 if deterministic else float(self.epsilon))


def discrete_dims(env_id: str) -> tuple[int, int]:
    """Flat observation size and action count of ``env_id``; one line naming the action
    space when it is not Discrete.

    Examples
    --------
    >>> discrete_dims("CartPole-v1")
    (4, 2)
    >>> discrete_dims("Pendulum-v1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: DQN needs a Discrete action space, but Pendulum-v1's is Box(-2.0, 2.0, (1,), ...
    """
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"DQN needs a Discrete action space, but {env_id}'s is {act_space}: "
                         "use graphs/sac.py for continuous actions")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"DQN needs a Box observation space, but {env_id}'s is {obs_space}: "
                         "use a flattening wrapper")
    return int(np.prod(obs_space.shape)), int(act_space.n)


class TransitionCollector:
    """A vector env stepped with a caller's actions, its steps folded into n-step
    transitions (:func:`~daskrl.algos.replay.nstep_transitions`), the unfinished ones
    carried to the next rollout.

    Examples
    --------
    >>> col = TransitionCollector("CartPole-v1", num_envs=2, seed=0, n_step=3, gamma=0.9)
    >>> batch = col.collect(8, lambda obs: np.zeros(len(obs), np.int64))
    >>> sorted(batch), batch["stats"]["env_steps"] <= 16
    (['actions', 'discounts', 'next_obs', 'obs', 'rewards', 'stats'], True)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, n_step: int = 1,
                 gamma: float = 0.99, step_cost: float = 0.0) -> None:
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


class QActor:
    """Role ``rollout`` for DQN: envs and an epsilon-greedy Q-network copy.

    Parameters
    ----------
    env_id, num_envs, seed : str, int, int
        The envs.
    hidden : tuple of int
        The Q-network's hidden layers.
    n_step, gamma : int, float
        Transitions fold ``n_step`` env steps, discounted by ``gamma``.
    epsilon : float, optional
        A fixed exploration rate (Ape-X's per-actor ladder); None: the learner's, read from
        the weights.
    priorities : bool
        Add each transition's initial priority, ``|n-step TD error|`` under this actor's
        weights (Ape-X), as ``priorities``.
    step_cost : float
        Extra CPU seconds per env step (a stand-in for an expensive simulator).

    Examples
    --------
    >>> actor = QActor("CartPole-v1", 2, seed=0, hidden=(16,), priorities=True)
    >>> batch = actor.rollout(8)
    >>> batch["obs"].shape[1], batch["priorities"].shape == batch["rewards"].shape
    (4, True)
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (256, 256),
                 n_step: int = 1, gamma: float = 0.99, epsilon: float | None = None,
                 priorities: bool = False, step_cost: float = 0.0) -> None:
        self.env_id, self.num_envs, self.seed, self.hidden = env_id, num_envs, seed, hidden
        self.epsilon, self.priorities = epsilon, priorities
        self.collector = TransitionCollector(env_id, num_envs, seed, n_step, gamma, step_cost)
        self.net = QNetwork(*discrete_dims(env_id), hidden)
        self.rng = np.random.default_rng(seed)
        self.version = -1

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version

    def explore(self, epsilon: float) -> None:
        """Act with ``epsilon`` (Ape-X's per-actor rate) and add initial priorities."""
        self.epsilon, self.priorities = float(epsilon), True

    def resized(self, num_envs: int, seed: int) -> QActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed``."""
        col = self.collector
        return QActor(self.env_id, num_envs, seed, self.hidden, col.n_step, col.gamma,
                      self.epsilon, self.priorities, col.step_cost)

    def rollout(self, num_steps: int) -> Batch:
        """``num_steps`` epsilon-greedy steps of every env, as n-step transitions."""
        eps = float(self.net.epsilon) if self.epsilon is None else self.epsilon

        def choose(obs: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                greedy = self.net(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
            explore = self.rng.random(len(obs)) < eps
            return np.where(explore, self.rng.integers(0, self.net.q[-1].out_features,
                                                       len(obs)), greedy)

        batch = self.collector.collect(num_steps, choose)
        if self.priorities:
            batch["priorities"] = td_errors(self.net, self.net, batch, double_q=True)
        batch["stats"].update(epsilon=eps, policy_version=self.version)
        return batch

    def close(self) -> None:
        """Close the envs."""
        self.collector.close()


def td_errors(net: nn.Module, target: nn.Module, batch: Batch, double_q: bool) -> np.ndarray:
    """``|rewards + discounts * Q_target(next_obs, a*) - Q(obs, actions)|`` without autograd;
    ``a*`` is the online network's argmax (double Q) or the target's.

    Examples
    --------
    >>> net = QNetwork(4, 2, (8,))
    >>> b = {"obs": np.zeros((3, 4), np.float32), "actions": np.zeros(3, np.int64),
    ...      "rewards": np.ones(3, np.float32), "next_obs": np.zeros((3, 4), np.float32),
    ...      "discounts": np.zeros(3, np.float32)}
    >>> td_errors(net, net, b, True).shape
    (3,)
    """
    with torch.inference_mode():
        q, target_q = _q_and_target(net, target, _tensors(batch, "cpu"), double_q)
    return (target_q - q).abs().numpy().astype(np.float64)


def _tensors(batch: Batch, device: str) -> dict[str, Tensor]:
    return {k: torch.as_tensor(np.asarray(batch[k]), device=device)
            for k in ("obs", "actions", "rewards", "next_obs", "discounts")}


def _q_and_target(net: nn.Module, target: nn.Module, b: dict[str, Tensor], double_q: bool
                  ) -> tuple[Tensor, Tensor]:
    obs, next_obs = b["obs"].float(), b["next_obs"].float()
    if double_q:  # one forward pass of the online network over both halves
        both = net(torch.cat([obs, next_obs]))
        q_all, next_online = both[:len(obs)], both[len(obs):].detach()
    else:
        q_all, next_online = net(obs), None
    q = q_all.gather(1, b["actions"].long().reshape(-1, 1)).squeeze(1)
    with torch.no_grad():
        next_target = target(next_obs)
        best = (next_online if next_online is not None else next_target).argmax(1, keepdim=True)
        bootstrap = next_target.gather(1, best).squeeze(1)
        target_q = b["rewards"].float() + b["discounts"].float() * bootstrap
    return q, target_q


@dataclass(frozen=True)
class DQNHyper:
    """DQN's update settings (CleanRL's names; see ``graphs/dqn.py`` for each flag)."""

    learning_rate: float = 2.3e-3
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1000
    tau: float = 1.0
    target_network_frequency: int = 256
    train_frequency: int = 2
    start_e: float = 1.0
    end_e: float = 0.04
    exploration_fraction: float = 0.16
    double_q: bool = True
    prioritized_replay: bool = False
    prioritized_replay_alpha: float = 0.6
    prioritized_replay_beta: float = 0.4
    max_grad_norm: float = 10.0
    save_replay: bool = True


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """``start`` moving linearly to ``end`` over the first ``fraction`` of the run.

    Examples
    --------
    >>> linear_schedule(1.0, 0.0, 0.5, 0.25), linear_schedule(1.0, 0.0, 0.5, 0.9)
    (0.5, 0.0)
    """
    if fraction <= 0:
        return end
    return start + (end - start) * min(1.0, progress / fraction)


class DQNLearner:
    """Role ``learner`` for DQN: Q-network, target network, optimiser and the replay.

    Examples
    --------
    >>> learner = DQNLearner(4, 2, seed=0, hidden=(16,),
    ...                      hyper=DQNHyper(learning_starts=8, batch_size=4))
    >>> batch = QActor("CartPole-v1", 2, seed=0, hidden=(16,)).rollout(10)
    >>> m = learner.update([batch], progress=0.1)
    >>> m["replay_size"] == len(batch["rewards"]), m["gradient_steps"] > 0
    (True, True)
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (256, 256), hyper: DQNHyper = DQNHyper(),
                 device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.hyper, self.device = hyper, device
        self.net = QNetwork(obs_dim, num_actions, hidden).to(device)
        self.target = copy.deepcopy(self.net)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=hyper.learning_rate)
        self.replay = make_replay(hyper.buffer_size, hyper.prioritized_replay,
                                  hyper.prioritized_replay_alpha, seed)
        self.env_steps = 0
        self.gradient_steps = 0

    def update(self, batches: list[Batch], progress: float) -> dict[str, float]:
        """Add the batches to the replay, then train on samples of it (see module notes)."""
        h = self.hyper
        for batch in batches:
            self.replay.add(batch, batch.get("priorities"))
        before = self.env_steps
        self.env_steps += sum(int(b["stats"]["env_steps"]) for b in batches)
        self.net.epsilon.fill_(linear_schedule(h.start_e, h.end_e, h.exploration_fraction,
                                               progress))
        beta = h.prioritized_replay_beta + (1 - h.prioritized_replay_beta) * progress
        metrics: dict[str, float] = {"charts/epsilon": float(self.net.epsilon)}
        losses, qs = [], []
        if len(self.replay) >= max(1, h.learning_starts):  # else: wait, filling the buffer
            tf = max(1, h.train_frequency)
            for k in range(before // tf + 1, self.env_steps // tf + 1):
                sample = self.replay.sample(h.batch_size, beta)
                loss, q, td = self.gradient_step(sample)
                self.replay.update_priorities(sample["indices"], td)
                losses.append(loss)
                qs.append(q)
                step = k * tf
                if step // h.target_network_frequency > (step - tf) // h.target_network_frequency:
                    self.sync_target()
        metrics.update(self.replay_metrics())
        metrics.update({"gradient_steps": len(losses), "learner_env_steps": self.env_steps})
        if losses:
            metrics.update({"losses/td_loss": float(np.mean(losses)),
                            "losses/q_values": float(np.mean(qs))})
        return metrics

    def learn_from(self, samples: list[Batch], progress: float
                   ) -> tuple[dict[str, float], list[Batch]]:
        """Ape-X: gradient steps on replay shards' samples; return the metrics and each
        shard's new priorities.

        Each shard sampled ``sample_rows`` rows in proportion to its own priorities; every
        gradient step draws how many of its ``batch_size`` rows come from each shard in
        proportion to the shards' totals (``Multinomial``) and takes that many unused rows
        of each, so a row is drawn with probability ``p_i / sum of all p``, as from one
        buffer; importance weights are taken over all shards. No step before the shards
        hold ``learning_starts`` transitions together (the learner waits). Target updates
        follow the env steps the shards report adding.
        """
        h = self.hyper
        totals = np.array([float(s["stats"]["total"]) for s in samples])
        size = sum(int(s["stats"]["size"]) for s in samples)
        before = self.env_steps
        self.env_steps += sum(int(s["stats"]["added"]) for s in samples)
        beta = h.prioritized_replay_beta + (1 - h.prioritized_replay_beta) * progress
        updates: list[Batch] = [{"indices": [], "priorities": []} for _ in samples]
        metrics: dict[str, float] = {"replay_size": size, "learner_env_steps": self.env_steps}
        rows = min(len(s["indices"]) for s in samples if s["stats"]["size"]) if size else 0
        steps = rows // h.batch_size if size >= max(1, h.learning_starts) else 0
        cursors = np.zeros(len(samples), np.int64)
        per = (self.env_steps - before) / max(1, steps)
        losses, qs = [], []
        for g in range(steps):
            counts = self.replay.rng.multinomial(h.batch_size, totals / totals.sum())
            parts = [{k: v[c0:c0 + c] for k, v in s.items() if k != "stats"} if c else {}
                     for s, c0, c in zip(samples, cursors, counts, strict=True)]
            cursors += counts
            live = [p for p in parts if p]  # a shard with no rows (none drawn) adds nothing
            merged = {k: np.concatenate([p[k] for p in live]) for k in live[0]}
            merged["weights"] = importance_weights(merged["priorities"] / totals.sum(), size,
                                                   beta)
            loss, q, td = self.gradient_step(merged)
            losses.append(loss)
            qs.append(q)
            for j, piece in enumerate(np.split(td, np.cumsum(counts)[:-1])):
                if counts[j]:
                    updates[j]["indices"].append(parts[j]["indices"])
                    updates[j]["priorities"].append(piece)
            prev, step = before + g * per, before + (g + 1) * per  # spread over the steps
            if step // h.target_network_frequency > prev // h.target_network_frequency:
                self.sync_target()
        out = [{k: np.concatenate(v) if v else np.zeros(0) for k, v in u.items()}
               for u in updates]
        metrics["gradient_steps"] = len(losses)
        if losses:
            metrics.update({"losses/td_loss": float(np.mean(losses)),
                            "losses/q_values": float(np.mean(qs))})
        return metrics, out

    def replay_metrics(self) -> dict[str, float]:
        """Size, bytes and capacity of the replay."""
        return {"replay_size": len(self.replay), "replay_bytes": self.replay.nbytes,
                "replay_capacity": self.replay.capacity}

    def gradient_step(self, sample: Batch) -> tuple[float, float, np.ndarray]:
        """One Huber-loss step on ``sample`` weighted by its importance weights; returns
        the loss, the mean Q and the new |TD errors| (priorities)."""
        b = _tensors(sample, self.device)
        q, target_q = _q_and_target(self.net, self.target, b, self.hyper.double_q)
        weights = torch.as_tensor(sample["weights"], device=self.device)
        loss = (weights * F.smooth_l1_loss(q, target_q, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.hyper.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        td = (target_q - q).detach().abs().cpu().numpy().astype(np.float64)
        return float(loss.detach()), float(q.detach().mean()), td

    def sync_target(self) -> None:
        """Copy (``tau = 1``) or move (Polyak, ``tau < 1``) the target towards the network."""
        tau = self.hyper.tau
        with torch.no_grad():
            for t, p in zip(self.target.q.parameters(), self.net.q.parameters(), strict=True):
                if tau < 1:
                    t.mul_(1 - tau).add_(p, alpha=tau)
                else:
                    t.copy_(p)

    def weights(self) -> dict[str, Tensor]:
        """A CPU copy of the Q-network (with its epsilon) for the actors."""
        return {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimiser, counters and, unless ``save_replay`` is off, the replay."""
        state: dict[str, Any] = {
            "model": self.weights(),
            "target": {k: v.detach().cpu().clone() for k, v in self.target.state_dict().items()},
            "optimizer": self.optimizer.state_dict(), "env_steps": self.env_steps,
            "gradient_steps": self.gradient_steps, "replay_size": len(self.replay)}
        if self.hyper.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; a state saved without its replay leaves the
        buffer empty, and says so."""
        self.net.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_steps, self.gradient_steps = int(state["env_steps"]), int(state["gradient_steps"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        elif int(state.get("replay_size", 0)):
            print(f"daskrl: the replay buffer was not saved (--no-save-replay): it restarts "
                  f"empty, {state['replay_size']} transitions lost", file=sys.stderr)


def q_policy(env_id: str, hidden: tuple[int, ...], weights: dict[str, Tensor],
             deterministic: bool = True) -> nn.Module:
    """The trained policy of ``weights`` alone (``Algorithm.make_policy``).

    Examples
    --------
    >>> w = QNetwork(4, 2, (8,)).state_dict()
    >>> q_policy("CartPole-v1", (8,), w)(torch.zeros(2, 4)).shape
    torch.Size([2])
    """
    net = QNetwork(*discrete_dims(env_id), hidden)
    net.load_state_dict(weights)
    return net.policy(deterministic).eval()
