"""MAPPO's learner side: the clipped-surrogate update of every team, and the learner object.

Minibatches are sets of (step, env) slots carrying all their agents, so a central critic
always sees whole environments. Each team's loss uses :mod:`daskrl.algos.ppo`'s
``policy_loss``, ``value_loss`` and ``normalize``; the teams' losses are summed into one
backward pass, and each team's actor and critic gradients are clipped on their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.ppo import normalize, policy_loss, value_loss

from .mappo_model import MAPPOModel, ModelSpec, TeamLayout

GradHook = Callable[[list[Tensor]], None]
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


def mappo_update(model: MAPPOModel, optimizer: torch.optim.Optimizer, data: dict[str, Tensor],
                 old_values: dict[int, Tensor], hp: MAPPOHyper, teams: list[int],
                 generator: torch.Generator, grad_hook: GradHook | None = None
                 ) -> dict[str, float]:
    """``update_epochs`` x ``num_minibatches`` clipped-surrogate steps of ``teams``.

    ``data`` holds ``obs [S, A, D]``, ``actions, logp, values, advantages, returns [S, A]``
    for ``S`` (step, env) slots. Value normalisers must already hold this batch's returns.
    ``grad_hook`` gets the gradients of ``teams``' parameters after each backward pass.

    Returns mean losses per team (``losses/<part>/<team>``) and over teams (``losses/<part>``).
    """
    n = len(data["obs"])
    if n < hp.num_minibatches:
        raise ValueError(f"a batch of {n} (step, env) slots cannot make {hp.num_minibatches} "
                         "minibatches: lower --num-minibatches or raise --num-envs")
    groups = model.parameter_groups(teams)
    params = [p for g in groups for p in g]
    targets = {t: model.value_norms[t].normalize(model.team_actions(data["returns"], t))
               for t in teams}
    sums = torch.zeros(len(teams), len(PARTS), device=data["obs"].device)
    steps = 0
    for _ in range(hp.update_epochs):
        perm = torch.randperm(n, generator=generator).to(data["obs"].device)
        for idx in torch.tensor_split(perm, hp.num_minibatches):
            obs, actions = data["obs"][idx], data["actions"][idx]
            loss = torch.zeros((), device=obs.device)
            for i, t in enumerate(teams):
                new_logp, entropy, new_v = model.evaluate(obs, actions, t)
                log_ratio = new_logp - model.team_actions(data["logp"], t)[idx].reshape(-1)
                ratio = log_ratio.exp()
                adv = model.team_actions(data["advantages"], t)[idx].reshape(-1)
                adv = normalize(adv) if len(adv) > 1 else adv
                pg = policy_loss(adv, ratio, hp.clip_coef)
                vf = value_loss(new_v, old_values[t][idx].reshape(-1), targets[t][idx].reshape(-1),
                                hp.clip_coef, hp.clip_vloss)
                ent = entropy.mean()
                loss = loss + pg - hp.ent_coef * ent + hp.vf_coef * vf
                with torch.no_grad():
                    kl = ((ratio - 1) - log_ratio).mean()
                    clipfrac = ((ratio - 1).abs() > hp.clip_coef).float().mean()
                    sums[i] += torch.stack([pg, vf, ent, kl, clipfrac]).detach()
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            if grad_hook is not None:
                grad_hook([_grad(p) for p in params])
            for g in groups:
                nn.utils.clip_grad_norm_(g, hp.max_grad_norm)
            optimizer.step()
            steps += 1
    means = (sums / steps).tolist()
    out: dict[str, float] = {}
    for i, t in enumerate(teams):
        for j, part in enumerate(PARTS):
            out[f"losses/{part}/{model.layout.names[t]}"] = means[i][j]
    for j, part in enumerate(PARTS):
        out[f"losses/{part}"] = float(np.mean([m[j] for m in means]))
    return out


def _grad(p: nn.Parameter) -> Tensor:
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


class MAPPOLearner:
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
    >>> m["agents"], "return_mean/adversary" in m, learner.gradient_steps()
    (16, True, 2)
    """

    def __init__(self, layout: TeamLayout, model: ModelSpec, hp: MAPPOHyper, seed: int,
                 device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.layout, self.hp, self.device = layout, hp, device
        self.model = MAPPOModel(layout, model).to(device)
        names = hp.trained_teams if hp.trained_teams is not None else layout.names
        self.teams = sorted(layout.team_index(n) for n in names)
        if not self.teams:
            raise ValueError("no team to train: leave at least one team out of random_teams")
        params = [p for g in self.model.parameter_groups(self.teams) for p in g]
        self.optimizer = torch.optim.Adam(params, lr=hp.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)

    def gradient_steps(self) -> int:
        """Calls of ``grad_hook`` per :meth:`update`: one for the batch statistics (value
        normalisation and team returns, averaged over data-parallel replicas), then one per
        minibatch."""
        return 1 + self.hp.update_epochs * self.hp.num_minibatches

    def update(self, batches: list[dict[str, Any]], progress: float,
               grad_hook: GradHook | None = None) -> dict[str, float]:
        """One MAPPO update on the batches; returns losses, team returns and speeds.

        With ``grad_hook`` (data-parallel), its first call averages this batch's value-target
        statistics and team-return sums over the replicas, so every replica's value
        normalisers make the same step and ``return_mean/<team>`` covers all replicas.
        """
        t0 = time.time()
        stats = [b["stats"] for b in batches]
        data = concat(batches, self.device)
        model, teams = self.model, self.teams
        sync = self._batch_sync(data, stats)
        if grad_hook is not None:
            grad_hook(sync)
        old_values = {}
        for i, t in enumerate(teams):
            vn = model.value_norms[t]
            old_values[t] = vn.normalize(model.team_actions(data["values"], t))
            vn.update(sync[0][2 * i : 2 * i + 2])
        lr = self.hp.learning_rate * (1.0 - progress) if self.hp.anneal_lr else None
        for group in self.optimizer.param_groups:
            group["lr"] = self.hp.learning_rate if lr is None else lr
        metrics = mappo_update(model, self.optimizer, data, old_values, self.hp, teams,
                               self.generator, grad_hook)
        metrics.update(self._explained_variance(data))
        metrics.update(team_metrics(stats, self.layout.names))
        sums = sync[1].view(-1, 2).tolist()
        for name, (total, count) in zip(self.layout.names, sums, strict=True):
            metrics[f"return_mean/{name}"] = total / count if count else float("nan")
        update_s = time.time() - t0
        rollout_s = max(s["t_end"] - s["t_start"] for s in stats)
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        metrics.update(update_s=update_s,
                       agent_steps_per_s=metrics["agent_steps"] / max(rollout_s + update_s, 1e-9))
        return metrics

    def _batch_sync(self, data: dict[str, Tensor], stats: list[dict[str, Any]]) -> list[Tensor]:
        """``[value-target stats of each trained team, (return sum, count) of each team]``."""
        vstats = [self.model.value_norms[t].batch_stats(self.model.team_actions(
            data["returns"], t)) for t in self.teams]
        rsum = []
        for name in self.layout.names:
            values = [r for s in stats for r in s.get("team_returns", {}).get(name, [])]
            rsum += [float(np.sum(values)) if values else 0.0, float(len(values))]
        dev = data["obs"].device
        return [torch.cat(vstats).to(dev), torch.tensor(rsum, dtype=torch.float64, device=dev)]

    @torch.no_grad()
    def _explained_variance(self, data: dict[str, Tensor]) -> dict[str, float]:
        out = {}
        for t in self.teams:
            y = self.model.team_actions(data["returns"], t).reshape(-1).float()
            v = self.model.team_actions(data["values"], t).reshape(-1).float()
            var = torch.var(y) if len(y) > 1 else torch.tensor(0.0)
            ev = float("nan") if var == 0 else float(1 - torch.var(y - v) / var)
            out[f"losses/explained_variance/{self.layout.names[t]}"] = ev
        return out

    def weights(self) -> dict[str, Tensor]:
        """CPU copy of every team's actor, critic and value normaliser."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimiser and shuffling-generator state (CPU)."""
        optim = self.optimizer.state_dict()
        state = {i: {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                     for k, v in s.items()} for i, s in optim["state"].items()}
        return {"model": self.weights(),
                "optimizer": {"param_groups": optim["param_groups"], "state": state},
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
