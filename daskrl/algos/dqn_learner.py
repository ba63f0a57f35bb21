"""Role ``learner`` of DQN: the Q-network, its target, the optimiser and the replay.

Under ``single`` and ``actors-learner`` the replay is resident in the learner:
:meth:`DQNLearner.update` adds the batches it receives, then takes one gradient step per
``train_frequency`` new env steps once the replay holds ``learning_starts`` transitions
(before that it only waits, filling the buffer). Under ``apex`` the replay lives in shards on
other workers and :meth:`DQNLearner.learn_from` learns from their samples.

The target network changes only at its updates, so its Q-values of the next observations are
computed for every gradient step up to the next update in one forward pass; a uniform replay
gives all of an iteration's minibatches in one sample (:mod:`daskrl.algos.offpolicy`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from daskrl.algos.compiled_step import CompiledStep, compile_seconds
from daskrl.algos.gradient_update import annealed_lr, clipped_step, set_learning_rate
from daskrl.algos.offpolicy import (
    TensorMeans,
    adam,
    as_tensors,
    cpu_copy,
    load_optimizer_state,
    minibatches,
    optimizer_state,
    polyak_,
)
from daskrl.algos.qnet import QNetwork, q_and_target
from daskrl.algos.replay_buffers import importance_weights, make_replay
from daskrl.algos.replay_learner import ReplayLearner
from daskrl.algos.seeding import seeded_init

Batch = dict[str, Any]
FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")


@dataclass(frozen=True)
class DQNHyper:
    """DQN's update settings (CleanRL's names; see ``graphs/dqn.py`` for each flag)."""

    learning_rate: float = 2.3e-3
    anneal_lr: bool = False
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
    compile: bool = False


def huber(q: Tensor, target_q: Tensor, weights: Tensor | None = None) -> Tensor:
    """DQN's loss: the mean Huber loss of ``q`` to ``target_q``, each term weighted by its
    importance weight when ``weights`` (prioritised replay).

    Examples
    --------
    >>> huber(torch.tensor([0.0, 3.0]), torch.zeros(2)).item()
    1.25
    """
    if weights is None:
        return F.smooth_l1_loss(q, target_q)
    return (weights * F.smooth_l1_loss(q, target_q, reduction="none")).mean()


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


class DQNLearner(ReplayLearner):
    """Role ``learner`` for DQN: Q-network, target network, optimiser and the replay
    (fed and checkpointed by :class:`~daskrl.algos.replay_learner.ReplayLearner`).

    Examples
    --------
    >>> from daskrl.algos.q_actor import QActor
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
        with seeded_init(seed):  # weights from the seed alone (algos.seeding)
            super().__init__(make_replay(hyper.buffer_size, hyper.prioritized_replay,
                                         hyper.prioritized_replay_alpha, seed),
                             hyper.learning_starts, hyper.train_frequency, hyper.save_replay)
            self.hyper, self.device = hyper, device
            self.net = QNetwork(obs_dim, num_actions, hidden).to(device)
            self.target = copy.deepcopy(self.net)
            self.params = list(self.net.parameters())
            self.compiled: CompiledStep | None = None
            """The whole gradient step compiled (``hyper.compile``), else None."""
            if hyper.compile:
                self.compiled = CompiledStep(self._fit)
            self.optimizer = adam(self.params, hyper.learning_rate, compiled=hyper.compile)

    def schedule(self, progress: float) -> dict[str, float]:
        """Epsilon at ``progress`` (carried to the actors by the weights) and the learning
        rate (annealed linearly to 0 over the run with ``anneal_lr``)."""
        h = self.hyper
        self.net.epsilon.fill_(linear_schedule(h.start_e, h.end_e, h.exploration_fraction,
                                               progress))
        lr = annealed_lr(h.learning_rate, h.anneal_lr, progress)
        set_learning_rate(self.optimizer, lr)
        return {"charts/epsilon": float(self.net.epsilon), "charts/learning_rate": lr}

    def train(self, ends: list[int], progress: float, means: TensorMeans) -> None:
        """A gradient step at each of ``ends``; the target updates after each step that
        crosses a multiple of ``target_network_frequency`` env steps."""
        h, tf = self.hyper, self.train_frequency
        syncs = [s // h.target_network_frequency > (s - tf) // h.target_network_frequency
                 for s in ends]
        if self.replay.prioritized:
            beta = h.prioritized_replay_beta + (1 - h.prioritized_replay_beta) * progress
            self._train_prioritized(syncs, beta, means)
        else:
            self._train_uniform(syncs, means)

    def _train_uniform(self, syncs: list[bool], means: TensorMeans) -> None:
        """``len(syncs)`` gradient steps on one sample of the replay; the target updates
        after each step whose ``syncs`` entry is set."""
        h, n = self.hyper, len(syncs)
        mb = minibatches(self.replay, n, h.batch_size, FIELDS, self.device)
        both = torch.cat([mb["obs"], mb["next_obs"]], 1) if h.double_q else None
        actions = mb["actions"].long().unsqueeze(-1)
        start = 0
        while start < n:
            stop = next((i for i in range(start, n) if syncs[i]), n - 1) + 1
            with torch.no_grad():  # the target is fixed from start to stop
                nxt = mb["next_obs"][start:stop]
                next_target = self.target(nxt.reshape(-1, *nxt.shape[2:])).reshape(
                    stop - start, h.batch_size, -1)
                # without double Q the whole segment's targets are known now
                targets = (None if h.double_q else mb["rewards"][start:stop]
                           + mb["discounts"][start:stop] * next_target.max(-1).values)
            for i in range(start, stop):
                if self.compiled is not None:
                    self._compiled_step(mb["obs"][i], mb["next_obs"][i], mb["actions"][i],
                                        mb["rewards"][i], mb["discounts"][i],
                                        next_target[i - start], None, means)
                    continue
                if targets is None:
                    q, target_q = q_and_target(
                        self.net, mb["obs"][i], mb["next_obs"][i], mb["actions"][i],
                        mb["rewards"][i], mb["discounts"][i], next_target[i - start], True,
                        None if both is None else both[i])
                else:
                    q = self.net(mb["obs"][i]).gather(1, actions[i]).squeeze(1)
                    target_q = targets[i - start]
                self._step(q, target_q, None, means)
            if syncs[stop - 1]:
                self.sync_target()
            start = stop

    def _train_prioritized(self, syncs: list[bool], beta: float, means: TensorMeans) -> None:
        """One sample per gradient step: each step's new priorities weigh the next sample."""
        for sync in syncs:
            sample = self.replay.sample(self.hyper.batch_size, beta)
            td = self.gradient_step(sample, means)
            self.replay.update_priorities(sample["indices"], td)
            if sync:
                self.sync_target()

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
        means = TensorMeans()
        for g in range(steps):
            counts = self.replay.rng.multinomial(h.batch_size, totals / totals.sum())
            parts = [{k: v[c0:c0 + c] for k, v in s.items() if k != "stats"} if c else {}
                     for s, c0, c in zip(samples, cursors, counts, strict=True)]
            cursors += counts
            live = [p for p in parts if p]  # a shard with no rows (none drawn) adds nothing
            merged = {k: np.concatenate([p[k] for p in live]) for k in live[0]}
            merged["weights"] = importance_weights(merged["priorities"] / totals.sum(), size,
                                                   beta)
            td = self.gradient_step(merged, means)
            for j, piece in enumerate(np.split(td, np.cumsum(counts)[:-1])):
                if counts[j]:
                    updates[j]["indices"].append(parts[j]["indices"])
                    updates[j]["priorities"].append(piece)
            prev, step = before + g * per, before + (g + 1) * per  # spread over the steps
            if step // h.target_network_frequency > prev // h.target_network_frequency:
                self.sync_target()
        out = [{k: np.concatenate(v) if v else np.zeros(0) for k, v in u.items()}
               for u in updates]
        metrics["gradient_steps"] = steps
        metrics["replay_samples"] = steps * h.batch_size  # rows drawn from the shards
        if self.compiled is not None:
            metrics["compile_s"] = compile_seconds()
        metrics.update({f"losses/{k}": v for k, v in means.means().items()})
        return metrics, out

    def gradient_step(self, sample: Batch, means: TensorMeans | None = None) -> np.ndarray:
        """One Huber-loss step on ``sample`` weighted by its importance ``weights``; returns
        the new |TD errors| (priorities) and adds the loss and mean Q to ``means``."""
        b = as_tensors(sample, (*FIELDS, "weights"), self.device)
        with torch.no_grad():
            next_target = self.target(b["next_obs"])
        if self.compiled is not None:
            td = self._compiled_step(b["obs"], b["next_obs"], b["actions"], b["rewards"],
                                     b["discounts"], next_target, b["weights"], means)
            return td.cpu().numpy().astype(np.float64)
        q, target_q = q_and_target(self.net, b["obs"], b["next_obs"], b["actions"],
                                   b["rewards"], b["discounts"], next_target,
                                   self.hyper.double_q)
        self._step(q, target_q, b["weights"], means)
        return (target_q - q).detach().abs().cpu().numpy().astype(np.float64)

    def _step(self, q: Tensor, target_q: Tensor, weights: Tensor | None,
              means: TensorMeans | None) -> None:
        """Huber loss (importance-weighted when ``weights``), backward, clip, Adam."""
        loss = huber(q, target_q, weights)
        clipped_step(self.optimizer, self.params, torch.autograd.grad(loss, self.params),
                     [self.params], self.hyper.max_grad_norm)
        self.gradient_steps += 1
        if means is not None:
            means.add("td_loss", loss)
            means.add("q_values", q)  # averaged at the end: one op less per step

    def _fit(self, obs: Tensor, next_obs: Tensor, actions: Tensor, rewards: Tensor,
             discounts: Tensor, next_target: Tensor, weights: Tensor | None
             ) -> tuple[Tensor, Tensor, Tensor]:
        """The whole gradient step (what :attr:`compiled` compiles): Q and its target, the
        Huber loss, its gradients, the clip and the Adam step; returns the loss, the mean Q
        and the |TD errors| (taken before the step, as :meth:`_step` callers do)."""
        q, target_q = q_and_target(self.net, obs, next_obs, actions, rewards, discounts,
                                   next_target, self.hyper.double_q)
        loss = huber(q, target_q, weights)
        with torch.no_grad():  # outside the graph autograd.grad consumes: no graph break
            loss_value, q_mean, td = loss.clone(), q.mean(), (target_q - q).abs()
        clipped_step(self.optimizer, self.params, torch.autograd.grad(loss, self.params),
                     [self.params], self.hyper.max_grad_norm)
        return loss_value, q_mean, td

    def _compiled_step(self, obs: Tensor, next_obs: Tensor, actions: Tensor, rewards: Tensor,
                       discounts: Tensor, next_target: Tensor, weights: Tensor | None,
                       means: TensorMeans | None) -> Tensor:
        """:attr:`compiled` on one minibatch, counted and recorded as :meth:`_step`; returns
        the |TD errors|."""
        assert self.compiled is not None
        loss, q_mean, td = self.compiled(obs, next_obs, actions, rewards, discounts,
                                         next_target, weights)
        self.gradient_steps += 1
        if means is not None:
            means.add("td_loss", loss)
            means.add("q_values", q_mean)  # equal minibatches: the mean of means is the mean
        return td

    def sync_target(self) -> None:
        """Copy (``tau = 1``) or move (Polyak, ``tau < 1``) the target towards the network."""
        polyak_(self.target.q.parameters(), self.net.q.parameters(), self.hyper.tau)

    def weights(self) -> dict[str, Tensor]:
        """A CPU copy of the Q-network (with its epsilon) for the actors."""
        return cpu_copy(self.net)

    def model_state(self) -> dict[str, Any]:
        """Network, target and optimiser (CPU copies)."""
        return {
            "model": self.weights(),
            "target": cpu_copy(self.target),
            "optimizer": optimizer_state(self.optimizer)}

    def load_model_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`model_state` gave."""
        self.net.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.optimizer, state["optimizer"])
