"""V-trace actor-critic: actors that record sequences, a learner that corrects for their lag.

Free-running actors act with weights some updates older than the learner's. Their batches
therefore keep the time-major sequence of every env (``[envs, steps]``, reset steps
included and marked invalid) with the acting policy's log-probabilities and version, and
the learner recomputes its own log-probabilities and values on them, then the V-trace
targets (:func:`daskrl.algos.losses.vtrace`) before its gradient steps:

- ``loss="actor-critic"`` (IMPALA): one step of ``-pg_advantage * logp + vf_coef *
  0.5 * (vs - V)^2 - ent_coef * entropy`` per batch (:func:`~daskrl.algos.losses.a2c_loss`
  on the V-trace advantages and targets);
- ``loss="ppo"`` (``graphs/ppo.py --vtrace``): PPO's epochs and minibatches, with the
  V-trace advantages and targets in place of the actor's GAE, and the ratio taken against
  the acting policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos import losses
from daskrl.algos.actor_critic import EnvRunner, spaces_of
from daskrl.algos.env_runner import NO_COST, StepCost
from daskrl.algos.learner import ActorCriticLearner, Minibatch, batch_tensors, shuffled_minibatches
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.normalize import Moments, Normalization
from daskrl.algos.ppo import PPOHyper
from daskrl.core.algorithm import Batch

SEQUENCE_KEYS = ("obs", "actions", "logp", "rewards", "discounts", "valid", "last_obs")
"""The arrays of a sequence batch; each is ``[envs, steps, ...]`` but ``last_obs``
(``[envs, ...]``, the observation after the last step), so batches of actors with
different env counts concatenate along the first axis."""


class SequenceActor:
    """A vector env and a policy copy whose rollouts are sequences of exactly ``num_steps``
    steps per env (``[envs, steps]``: :data:`SEQUENCE_KEYS`), for a V-trace learner.

    The policy is the env's actor-critic head (:func:`~daskrl.algos.networks.actor_critic_for`
    over flat observations): discrete actions, or 1-D Box actions from a Gaussian, whose
    ``logp`` is the log-density of the whole action vector (summed over its dimensions, the
    per-step log pi V-trace's importance weights need). Box actions are recorded as sampled;
    the env runner clips what it sends to the env.

    The step after an episode ends is gymnasium's reset step: it is kept in the sequence
    and marked invalid (``valid``), and ``discounts`` is ``gamma`` but 0 where an episode
    terminated. The env is built on first use (:meth:`resized` builds none).

    With ``normalization`` (PPO's running statistics, :mod:`daskrl.algos.normalize`) the
    network normalises the observations it is given (they are recorded raw, so the learner
    normalises them with its own statistics), rewards are recorded scaled by the return
    statistics that came with the weights, and ``batch["moments"]`` carries the moments of
    the valid observations and discounted returns for the learner to merge.

    Examples
    --------
    >>> actor = SequenceActor("CartPole-v1", num_envs=2, seed=0)
    >>> batch = actor.rollout(5)
    >>> batch["obs"].shape, batch["actions"].shape, batch["last_obs"].shape
    ((2, 5, 4), (2, 5), (2, 4))
    >>> batch["stats"]["policy_version"], type(actor.resized(3, seed=1)).__name__
    (-1, 'SequenceActor')
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (64, 64),
                 gamma: float = 0.99, step_cost: StepCost = NO_COST,
                 normalization: Normalization | None = None) -> None:
        self.env_id, self.num_envs, self.seed, self.hidden = env_id, num_envs, seed, hidden
        self.gamma, self.step_cost = gamma, step_cost
        self.normalization = normalization or Normalization()
        obs_space, action_space = spaces_of(env_id)
        if len(obs_space.shape) != 1:
            raise ValueError(f"{env_id}: observations of shape {obs_space.shape}; V-trace actors "
                             "serve flat observations (flatten them with a wrapper)")
        self.obs_dim = int(np.prod(obs_space.shape))
        self.net = actor_critic_for(obs_space, action_space, hidden, self.normalization)
        self.action_shape: tuple[int, ...] = tuple(self.net.action_shape)
        self.action_dtype = self.net.action_dtype
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1
        self._runner: EnvRunner | None = None
        self.discounted = np.zeros(num_envs)
        """Per env: the discounted return so far of its episode (reward scaling's statistic)."""

    @property
    def runner(self) -> EnvRunner:
        """The envs, built on first use."""
        if self._runner is None:
            self._runner = EnvRunner(self.env_id, self.num_envs, self.seed, self.step_cost)
        return self._runner

    def resized(self, num_envs: int, seed: int) -> SequenceActor:
        """An actor with the same settings, ``num_envs`` envs and ``seed`` (fusion)."""
        return SequenceActor(self.env_id, num_envs, seed, self.hidden, self.gamma,
                             self.step_cost, self.normalization)

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's weights unless this version is already loaded."""
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Step every env ``num_steps`` times with the loaded policy; return the sequences
        and the rollout's stats (``policy_version`` is the version that acted)."""
        runner, n, t_start = self.runner, self.num_envs, time.time()
        env_s, inference_s = runner.step_s, 0.0
        obs = np.zeros((num_steps, n, self.obs_dim), dtype=np.float32)
        actions = np.zeros((num_steps, n, *self.action_shape), dtype=self.action_dtype)
        logp = np.zeros((num_steps, n), dtype=np.float32)
        rewards = np.zeros((num_steps, n), dtype=np.float32)
        discounts = np.zeros((num_steps, n), dtype=np.float32)
        valid = np.zeros((num_steps, n), dtype=bool)
        returns: list[float] = []
        lengths: list[int] = []
        ret_rms = self.net.ret_rms
        seen = np.zeros((num_steps, n)) if ret_rms is not None else None
        for t in range(num_steps):
            t0 = time.perf_counter()
            obs[t] = np.asarray(runner.obs, dtype=np.float32).reshape(n, -1)
            a, lp, _ = self.net.act(obs[t], self.generator)
            actions[t], logp[t] = a.numpy(), lp.numpy()
            inference_s += time.perf_counter() - t0
            step = runner.step(actions[t].copy())
            rewards[t], valid[t] = step.reward, step.valid
            if seen is not None:  # gymnasium's NormalizeReward, statistics frozen for the rollout
                rewards[t], seen[t] = ret_rms.scale_rewards(
                    step.reward, self.discounted, step.valid, step.done, self.gamma)
            discounts[t] = self.gamma * ~np.asarray(step.terminated, dtype=bool)
            returns.extend(step.episode_returns)
            lengths.extend(step.episode_lengths)
        batch: dict[str, Any] = {
            "obs": obs.swapaxes(0, 1).copy(), "actions": actions.swapaxes(0, 1).copy(),
            "logp": logp.T.copy(),
            "rewards": rewards.T.copy(), "discounts": discounts.T.copy(), "valid": valid.T.copy(),
            "last_obs": np.asarray(runner.obs, dtype=np.float32).reshape(n, -1).copy(),
        }
        moments = {}
        if self.net.obs_rms is not None:
            moments["obs"] = Moments.of(obs[valid])
        if seen is not None:
            moments["ret"] = Moments.of(seen[valid])
        if moments:
            batch["moments"] = moments
        batch["stats"] = {
            "env_steps": int(valid.sum()), "rollout_steps": num_steps,
            "episode_returns": returns, "episode_lengths": lengths,
            "t_start": t_start, "t_end": time.time(), "inference_s": inference_s,
            "env_s": runner.step_s - env_s, "policy_version": self.version,
        }
        return batch

    def close(self) -> None:
        """Close the envs."""
        if self._runner is not None:
            self._runner.close()


class VTraceLearner(ActorCriticLearner):
    """An :class:`~daskrl.algos.learner.ActorCriticLearner` whose advantages and value
    targets are V-trace's, computed at the learner from the batches' sequences.

    Parameters
    ----------
    obs_dim, num_actions, seed, hidden, hp, device, compile
        As :class:`~daskrl.algos.learner.ActorCriticLearner`.
    gamma : float
        Discount (the actors record ``gamma`` or 0 per step; this one only documents it).
    rho_bar, c_bar : float
        V-trace's truncation of the importance weights.
    loss : ``"actor-critic"`` or ``"ppo"``
        IMPALA's one-step loss, or PPO's clipped surrogate over ``hp``'s epochs.
    network : callable, optional
        Builds the network (default: a discrete head of ``obs_dim`` and ``num_actions``);
        e.g. ``partial(actor_critic_for, obs_space, action_space, hidden)`` for Box actions.
    replicas : int
        Data-parallel replicas whose averaged moments :meth:`minibatches` may be given (as
        :class:`~daskrl.algos.learner.ActorCriticLearner`).

    Examples
    --------
    >>> actor = SequenceActor("CartPole-v1", num_envs=2, seed=0)
    >>> learner = VTraceLearner(4, 2, seed=0, hp=PPOHyper(update_epochs=1, num_minibatches=1),
    ...                         loss="actor-critic")
    >>> actor.set_weights(learner.weights(), 0)
    >>> m = learner.update([actor.rollout(8), actor.rollout(8)], 0.0)
    >>> sorted(k for k in m if k.startswith("vtrace/"))
    ['vtrace/rho_clipped', 'vtrace/rho_mean']
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (64, 64), hp: PPOHyper | None = None,
                 device: str = "cpu", compile: bool = False, *, rho_bar: float = 1.0,
                 c_bar: float = 1.0, loss: Literal["actor-critic", "ppo"] = "actor-critic",
                 network: Callable[[], nn.Module] | None = None, replicas: int = 1) -> None:
        if loss not in ("actor-critic", "ppo"):
            raise ValueError(f"loss={loss!r}: choose 'actor-critic' (IMPALA) or 'ppo'")
        self.kind = loss
        self.rho_bar, self.c_bar = rho_bar, c_bar
        super().__init__(obs_dim, num_actions, seed, hidden, hp, device, compile, network,
                         replicas)
        if loss == "actor-critic":
            self.parts = losses.A2C_PARTS
        self._vtrace_metrics: dict[str, float] = {}

    def _loss(self, mb: Minibatch) -> tuple[Tensor, Tensor]:
        if self.kind == "ppo":
            return super()._loss(mb)
        logp, entropy, values = self.net.evaluate(mb["obs"], mb["actions"])
        return losses.a2c_loss(logp, entropy, values, mb["advantages"], mb["returns"],
                               ent_coef=self.hp.ent_coef, vf_coef=self.hp.vf_coef,
                               norm_adv=False)

    def minibatches(self, batches: list[Batch], progress: float,
                    statistics: Tensor | None = None) -> list[Minibatch]:
        """Start an update: the V-trace targets of ``batches`` under the current network,
        flattened to their valid steps, cut into the plan's minibatches."""
        self.schedule(progress)
        self._merge_later(batches, statistics)  # running statistics, merged after the update
        seq = batch_tensors([{k: b[k] for k in (*SEQUENCE_KEYS, "stats")} for b in batches],
                            self.device)
        envs, steps = seq["actions"].shape[:2]
        obs = seq["obs"].reshape(envs * steps, -1).float()
        actions = seq["actions"].reshape(envs * steps, *seq["actions"].shape[2:])
        valid = seq["valid"].bool()
        with torch.no_grad():
            target_logp, _, values = self.net.evaluate(obs, actions)
            target_logp, values = target_logp.reshape(envs, steps), values.reshape(envs, steps)
            boot = self.net.value(seq["last_obs"].float())
            behaviour = seq["logp"].float()
            vs, adv = losses.vtrace(behaviour.T, target_logp.T, seq["rewards"].float().T,
                                    values.T, boot, seq["discounts"].float().T,
                                    self.rho_bar, self.c_bar, valid.T)
            rho = (target_logp - behaviour).exp()[valid]
        self._vtrace_metrics = {
            "vtrace/rho_mean": float(rho.mean()) if rho.numel() else float("nan"),
            # clipped: cut by more than float rounding (on-policy, the actor's and the
            # learner's log-probabilities of one network differ in the last bits)
            "vtrace/rho_clipped": float((rho > self.rho_bar * (1 + 1e-5)).float().mean())
            if rho.numel() else float("nan"),
        }
        mask = valid.reshape(-1)
        self._data = {"obs": obs[mask], "actions": actions[mask],
                      "logp": behaviour.reshape(-1)[mask], "values": values.reshape(-1)[mask],
                      "advantages": adv.T.reshape(-1)[mask], "returns": vs.T.reshape(-1)[mask]}
        epochs, num_mb = self.epochs_and_minibatches()
        return shuffled_minibatches(self._data, epochs, num_mb, self.generator)

    def finish_update(self, step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The update's metrics, with the mean importance weight and its clipped share."""
        return {**super().finish_update(step_metrics), **self._vtrace_metrics}
