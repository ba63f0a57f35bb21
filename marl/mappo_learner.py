"""MAPPO's learner: the clipped-surrogate update of every team, by autograd and ``torch.optim``.

Minibatches are sets of (step, env) slots carrying all their agents, so a central critic
always sees whole environments. Each team's loss is :func:`daskrl.algos.losses.ppo_loss`;
the teams' losses are summed and differentiated together, and each team's actor and critic
gradients are clipped on their own (``clip_grad_norm_``) before the Adam step.

The update protocol (schedules, autograd gradients, clipped steps, the update loop) is the
PPO learner's, :class:`daskrl.algos.gradient_update.GradientUpdate`; what is MAPPO's own is
the plan of whole-env minibatches, the team losses and their metrics. The value normalisers'
batch statistics and the team-return sums are its :meth:`MAPPOLearner.statistics`, which
data-parallel replicas average before the plan, apart from the gradients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.gradient_update import GradientUpdate
from daskrl.algos.losses import ppo_loss
from daskrl.algos.offpolicy import adam, load_optimizer_state, optimizer_state
from daskrl.algos.ppo import explained_variance
from daskrl.algos.seeding import seeded_init
from daskrl.core.algorithm import UpdatePlan

from .activations import swap_tanh
from .mappo_model import MAPPOModel, ModelSpec
from .team_layout import TeamLayout

PARTS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")


@dataclass(frozen=True)
class MAPPOHyper:
    """MAPPO update settings (defaults from the MAPPO paper's MPE runs, clip 10 and lr 7e-4).

    Attributes
    ----------
    update_epochs, num_minibatches : int
        Passes over the batch, and minibatches (of whole (step, env) slots) per pass.
    learning_rate : float
        Adam step size (annealed linearly to 0 when ``anneal_lr``).
    anneal_lr : bool
        Anneal the learning rate over the run.
    clip_coef : float
        Surrogate and value clipping.
    clip_vloss : bool
        Clip the value loss around the old values.
    ent_coef, vf_coef : float
        Entropy bonus and value loss weights.
    max_grad_norm : float
        Gradient-norm clip of each team's actor and critic, separately.
    trained_teams : tuple of str or None
        Teams to train (None: all).
    compile : bool
        Compile each whole gradient step: the team forward passes and PPO losses, their
        gradients, the clips and the Adam step
        (:meth:`~daskrl.algos.gradient_update.GradientUpdate.compile_steps`). With the loss
        alone compiled, on one CPU core an update step at 32k agent samples took 48-50 ms
        instead of 52-55 ms, after a compile of 11 s (80 s without inductor's on-disk cache,
        ``benchmarks/mappo_scale.md``). It pays in long runs only.
    """

    update_epochs: int = 10
    num_minibatches: int = 1
    learning_rate: float = 7e-4
    anneal_lr: bool = False
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 1.0
    max_grad_norm: float = 10.0
    trained_teams: tuple[str, ...] | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        for name in ("update_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def concat(batches: list[dict[str, Any]], device: str | torch.device) -> dict[str, Tensor]:
    """The batches' arrays joined along the slot axis, as tensors on ``device``.

    Examples
    --------
    >>> b = {"obs": np.zeros((2, 3, 4), np.float32), "stats": {}}
    >>> concat([b, b], "cpu")["obs"].shape
    torch.Size([4, 3, 4])
    """
    keys = [k for k in batches[0] if k != "stats"]
    if len(batches) == 1:
        return {k: torch.as_tensor(batches[0][k], device=device) for k in keys}
    return {k: torch.cat([torch.as_tensor(b[k], device=device) for b in batches]) for k in keys}


def _returns(batches: list[dict[str, Any]]) -> Tensor:
    """The batches' per-agent returns ``[S, A]`` (numpy or tensors), joined along the slots."""
    parts = [torch.as_tensor(b["returns"]) for b in batches]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _learn_mask(batches: list[dict[str, Any]]) -> Tensor | None:
    """The batches' ``learn`` masks ``[S, teams]`` joined, or None when they carry none."""
    if "learn" not in batches[0]:
        return None
    parts = [torch.as_tensor(b["learn"], dtype=torch.bool) for b in batches]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _team_minibatch(parts: dict[str, Tensor], idx: Tensor, data: dict[str, Tensor],
                    learn: Tensor | None, team: int) -> dict[str, Tensor]:
    """One team's loss inputs on the slots ``idx``; with a ``learn`` mask only the slots the
    team learns from, with their own observations and actions (the other slots' moves were
    another policy's: a league's frozen snapshot)."""
    if learn is not None:
        idx = idx[learn[idx, team].to(idx.device)]
    out = {k: v[idx].reshape(-1) for k, v in parts.items()}
    if learn is not None:
        out.update(obs=data["obs"][idx], actions=data["actions"][idx])
    return out


def team_metrics(stats: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, float]:
    """``return_mean/<team>`` over the episodes the batches finished, and agent counts.

    Examples
    --------
    >>> s = {"team_returns": {"adversary": [10.0, 20.0]}, "agents": 4, "agent_steps": 100}
    >>> team_metrics([s, s], ("adversary",))
    {'return_mean/adversary': 15.0, 'agents': 8, 'agent_steps': 200}
    """
    out: dict[str, Any] = {}
    for name in names:
        values = [r for s in stats for r in s.get("team_returns", {}).get(name, [])]
        out[f"return_mean/{name}"] = float(np.mean(values)) if values else float("nan")
    out["agents"] = sum(int(s.get("agents", 0)) for s in stats)
    out["agent_steps"] = sum(int(s.get("agent_steps", 0)) for s in stats)
    return out


class MAPPOLearner(GradientUpdate):
    """Team actors, critics and value normalisers with one Adam optimiser (role ``learner``).

    Parameters
    ----------
    layout : TeamLayout
        Teams and sizes (see :func:`marl.mappo_rollout.layout_of`).
    model : ModelSpec
        Network settings (the actors' must match).
    hp : MAPPOHyper
        Update settings.
    seed : int
        Seeds the initial weights and the minibatch shuffling.
    device : str
        Where the update runs.

    Examples
    --------
    >>> from marl.mappo_env import EnvSpec, layout_of
    >>> from marl.mappo_rollout import MAPPOActor, RolloutSpec
    >>> learner = MAPPOLearner(layout_of(EnvSpec()), ModelSpec(), MAPPOHyper(update_epochs=1),
    ...                        seed=0)
    >>> actor = MAPPOActor(EnvSpec(), ModelSpec(), RolloutSpec(), num_envs=4, seed=0)
    >>> actor.set_weights(learner.weights(), 0)
    >>> m = learner.update([actor.rollout(25)], progress=0.0)
    >>> m["agents"], "return_mean/adversary" in m, learner.update_plan().steps
    (16, True, 1)
    """

    def __init__(self, layout: TeamLayout, model: ModelSpec, hp: MAPPOHyper, seed: int,
                 device: str = "cpu") -> None:
        with seeded_init(seed):  # weights from the seed alone (algos.seeding)
            self.layout, self.hp, self.device = layout, hp, device
            self.model = MAPPOModel(layout, model).to(device)
            names = hp.trained_teams if hp.trained_teams is not None else layout.names
            self.teams = sorted(layout.team_index(n) for n in names)
            if not self.teams:
                raise ValueError("no team to train: leave at least one team out of random_teams")
            self.groups = self.model.parameter_groups(self.teams)
            self.params = [p for g in self.groups for p in g]
            self.generator = torch.Generator().manual_seed(seed)
            if hp.compile:
                for net in [*self.model.actors, *self.model.critics]:
                    swap_tanh(net, nn.Tanh)  # inductor's own tanh is fast; no custom backward
                self.compile_steps()
            self.optimizer = adam(self.params, hp.learning_rate, eps=1e-5,
                                  compiled=hp.compile)

    def update_plan(self) -> UpdatePlan:
        """``update_epochs * num_minibatches`` steps, after merging :meth:`statistics`."""
        return UpdatePlan(steps=self.hp.update_epochs * self.hp.num_minibatches, statistics=True)

    def statistics(self, batches: list[dict[str, Any]]) -> Tensor:
        """``[value-target mean and mean square of each trained team, then (return sum,
        episode count) of each team]`` of these batches (float64, on the CPU).

        Replicas average them (equal-size batches: the mean of means is the overall mean,
        and a ratio of averaged sums is the overall ratio), so every replica's value
        normalisers take the same step and ``return_mean/<team>`` covers every replica.
        With a ``learn`` mask a team's statistics cover only its own slots (NaN when it has
        none: its normaliser then keeps still); replicas' counts then differ, and the mean
        of means is not exact (a league runs one learner).
        """
        returns = _returns(batches)
        learn = _learn_mask(batches)
        vstats = []
        for t in self.teams:
            team = self.model.team_actions(returns, t)
            if learn is not None:  # only the slots the team learns from
                team = team[learn[:, t].to(team.device)]
            vstats.append(self.model.value_norms[t].batch_stats(team).cpu())
        rsum = []
        for name in self.layout.names:
            values = [r for b in batches for r in b["stats"].get("team_returns", {}).get(name, [])]
            rsum += [float(np.sum(values)) if values else 0.0, float(len(values))]
        return torch.cat([*vstats, torch.tensor(rsum, dtype=torch.float64)])

    def minibatches(self, batches: list[dict[str, Any]], progress: float,
                    statistics: Tensor | None = None) -> list[dict[str, Any]]:
        """Start an update: fold ``statistics`` (default: these batches' own) into the value
        normalisers, set the learning rate, return ``update_epochs * num_minibatches``
        minibatches of (step, env) slots with each trained team's loss inputs."""
        self._t0, cpu0 = time.time(), time.thread_time()
        self._cpu = 0.0
        stats = self.statistics(batches) if statistics is None else statistics
        data = concat(batches, self.device)
        n = len(data["obs"])
        if n < self.hp.num_minibatches:
            raise ValueError(f"a batch of {n} (step, env) slots cannot make "
                             f"{self.hp.num_minibatches} minibatches: lower --num-minibatches "
                             "or raise --num-envs")
        model = self.model
        team: dict[int, dict[str, Tensor]] = {}
        for i, t in enumerate(self.teams):
            vn = model.value_norms[t]
            old_values = vn.normalize(model.team_actions(data["values"], t))
            vn.update(stats[2 * i : 2 * i + 2])
            team[t] = {"old_values": old_values,
                       "targets": vn.normalize(model.team_actions(data["returns"], t)),
                       "logp": model.team_actions(data["logp"], t),
                       "advantages": model.team_actions(data["advantages"], t)}
        self.schedule(progress)
        self._update = (data, stats, [b["stats"] for b in batches])
        learn = data.pop("learn", None)
        plan = []
        for _ in range(self.hp.update_epochs):
            perm = torch.randperm(n, generator=self.generator).to(data["obs"].device)
            for idx in torch.tensor_split(perm, self.hp.num_minibatches):
                plan.append({"obs": data["obs"][idx], "actions": data["actions"][idx],
                             "teams": {t: _team_minibatch(parts, idx, data, learn, t)
                                       for t, parts in team.items()}})
        self._cpu += time.thread_time() - cpu0
        return plan

    def compute_gradients(self, minibatch: dict[str, Any]
                          ) -> tuple[list[Tensor], dict[str, float]]:
        """Autograd gradients of the sum of the trained teams' PPO losses, and each team's
        loss parts (``losses/<part>/<team>``); its CPU time counted in ``update_cpu_s``."""
        cpu0 = time.thread_time()
        out = super().compute_gradients(minibatch)
        self._cpu += time.thread_time() - cpu0
        return out

    def train_step(self, minibatch: dict[str, Any]) -> dict[str, float]:
        """One gradient step (its CPU time counted in ``update_cpu_s``)."""
        cpu0 = time.thread_time()
        out = super().train_step(minibatch)
        self._cpu += time.thread_time() - cpu0
        return out

    def step_loss(self, minibatch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """:meth:`team_losses` of the minibatch."""
        return self.team_losses(minibatch["obs"], minibatch["actions"], minibatch["teams"])

    def step_metrics(self, parts: Tensor) -> dict[str, float]:
        """Each trained team's :data:`PARTS`, as ``losses/<part>/<team>``."""
        values, names = parts.tolist(), self.layout.names
        return {f"losses/{part}/{names[t]}": values[i][j]
                for i, t in enumerate(self.teams) for j, part in enumerate(PARTS)}

    def clip_groups(self) -> list[list[Tensor]]:
        """Each team's actor and each team's critic, clipped on their own."""
        return self.groups

    def team_losses(self, obs: Tensor, actions: Tensor, teams: dict[int, dict[str, Tensor]]
                    ) -> tuple[Tensor, Tensor]:
        """The sum of the trained teams' PPO losses on a minibatch, and each team's
        :data:`PARTS` (``[teams, 5]``, detached): what :meth:`compute_gradients`
        differentiates."""
        hp, model = self.hp, self.model
        loss = torch.zeros((), device=obs.device)
        parts = []
        for t in self.teams:
            mb = teams[t]  # its own rows when a league masks what each team learns from
            if mb["logp"].numel() == 0:  # no slot here is the team's: a zero-gradient term
                new_logp, _, new_v = model.evaluate(obs, actions, t)
                loss = loss + 0.0 * (new_logp.sum() + new_v.sum())
                parts.append(torch.zeros(len(PARTS), device=obs.device))
                continue
            new_logp, entropy, new_v = model.evaluate(mb.get("obs", obs),
                                                      mb.get("actions", actions), t)
            team_loss, team_parts = ppo_loss(
                new_logp, entropy, new_v, mb["logp"], mb["old_values"], mb["advantages"],
                mb["targets"], clip_coef=hp.clip_coef, ent_coef=hp.ent_coef,
                vf_coef=hp.vf_coef, clip_vloss=hp.clip_vloss, norm_adv=True)
            loss = loss + team_loss
            parts.append(team_parts)
        return loss, torch.stack(parts)

    def apply_gradients(self, grads: list[Tensor]) -> None:
        """Clip each team's actor and critic gradients on their own, then one Adam step."""
        cpu0 = time.thread_time()
        super().apply_gradients(grads)
        self._cpu += time.thread_time() - cpu0

    def finish_update(self, step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """Mean losses per team and over teams, explained variance, team returns (over every
        replica when the statistics were merged), learning rate and speeds."""
        data, stats, batch_stats = self._update
        metrics = {k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]}
        for part in PARTS:
            metrics[f"losses/{part}"] = float(np.mean(
                [metrics[f"losses/{part}/{self.layout.names[t]}"] for t in self.teams]))
        metrics.update(self._explained_variance(data))
        metrics.update(team_metrics(batch_stats, self.layout.names))
        sums = stats[2 * len(self.teams):].view(-1, 2).tolist()
        for name, (total, count) in zip(self.layout.names, sums, strict=True):
            metrics[f"return_mean/{name}"] = total / count if count else float("nan")
        update_s = time.time() - self._t0
        rollout_s = max(s["t_end"] - s["t_start"] for s in batch_stats)
        metrics["charts/learning_rate"] = float(self.optimizer.param_groups[0]["lr"])
        if self.compile_s is not None:
            metrics["compile_s"] = self.compile_s
        # update_cpu_s: this thread's CPU time in the update's own work (minibatches,
        # gradients, steps). Apart from other jobs' load, update_s - update_cpu_s is time spent
        # waiting between steps: in data-parallel, for the other replicas' gradients.
        cpu = [s["cpu_s"] for s in batch_stats if "cpu_s" in s]
        if cpu:  # the rollouts' own CPU seconds (the slowest one, like rollout_s)
            metrics["rollout_cpu_s"] = max(cpu)
        metrics.update(update_s=update_s, update_cpu_s=self._cpu,
                       agent_steps_per_s=metrics["agent_steps"] / max(rollout_s + update_s, 1e-9))
        del self._update
        return metrics

    @torch.no_grad()
    def _explained_variance(self, data: dict[str, Tensor]) -> dict[str, float]:
        out = {}
        for t in self.teams:
            y = self.model.team_actions(data["returns"], t).reshape(-1).float()
            v = self.model.team_actions(data["values"], t).reshape(-1).float()
            out[f"losses/explained_variance/{self.layout.names[t]}"] = explained_variance(y, v)
        return out

    def weights(self) -> dict[str, Tensor]:
        """CPU copy of every team's actor, critic and value normaliser."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimiser and shuffling-generator state (CPU)."""
        return {"model": self.weights(),
                "optimizer": optimizer_state(self.optimizer),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.generator.set_state(state["generator"])
