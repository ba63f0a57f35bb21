"""MAPPO networks: one shared actor per team, a critic per team, value normalisation.

All agents of a team, in all environments of a batch, go through one forward pass
(``[E, A_team, obs_dim]`` flattened to ``[E * A_team, obs_dim]``), whatever the team sizes.
The critic of a team sees either the global state plus the agent's own observation
(``critic="central"``, MAPPO) or only the agent's own observation (``critic="local"``, IPPO).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from daskrl.algos.networks import mlp, sample

__all__ = ["CRITICS", "STATES", "MAPPOModel", "MAPPOPolicy", "ModelSpec", "SigmoidTanh",
           "TeamLayout", "ValueNorm", "sample"]

CRITICS = ("central", "local")
STATES = ("concat", "pooled")


@dataclass(frozen=True)
class TeamLayout:
    """Which agents form which team, and the observation and action sizes.

    Attributes
    ----------
    names : tuple of str
        Team names, in team-id order (e.g. ``("adversary", "good")``).
    agents : tuple of tuple of int
        Agent indices of each team.
    obs_dims : tuple of int
        True observation length of each agent (observations are zero-padded to
        ``max(obs_dims)``).
    num_actions : int
        Discrete actions of the agent with the most (actions ``[N, A]`` hold each agent's
        own index, so no padding of actions is needed).
    team_actions : tuple of int
        Discrete actions of each team's agents (empty: ``num_actions`` for every team). Teams
        differ in e.g. ``simple_world_comm`` (the lead adversary has 20) or
        ``simple_speaker_listener`` (speaker 3, listener 5); each team's actor has its own.

    Examples
    --------
    >>> lay = TeamLayout(("adversary", "good"), ((0, 1, 2), (3,)), (16, 16, 16, 14), 5)
    >>> lay.num_agents, lay.obs_dim, lay.state_dim, lay.team_obs_dim(1)
    (4, 16, 62, 14)
    >>> TeamLayout(("speaker", "listener"), ((0,), (1,)), (3, 11), 5, (3, 5)).team_num_actions(0)
    3
    """

    names: tuple[str, ...]
    agents: tuple[tuple[int, ...], ...]
    obs_dims: tuple[int, ...]
    num_actions: int
    team_actions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.team_actions and len(self.team_actions) != len(self.names):
            raise ValueError(f"team_actions {self.team_actions}: give one count per team "
                             f"{list(self.names)}")

    @classmethod
    def of(cls, env: Any) -> TeamLayout:
        """The layout of a batched env (:class:`~marl.simple_tag.SimpleTag` or
        :class:`~marl.pettingzoo.PettingZooBatchEnv`).

        Examples
        --------
        >>> from marl.simple_tag import SimpleTag
        >>> TeamLayout.of(SimpleTag(1, num_good=2, num_adversaries=5)).agents
        ((0, 1, 2, 3, 4), (5, 6))
        """
        if getattr(env, "continuous_actions", False):
            raise ValueError("MAPPO here needs discrete actions, got a continuous-action env: "
                             "build it with continuous_actions=False")
        team = [int(t) for t in env.team.tolist()]
        names = tuple(env.team_names)
        agents = tuple(tuple(i for i, t in enumerate(team) if t == k) for k in range(len(names)))
        kept = [(n, a) for n, a in zip(names, agents, strict=True) if a]
        counts = [int(c) for c in env.action_counts]
        per_team = []
        for name, members in kept:
            mine = {counts[i] for i in members}
            if len(mine) != 1:  # one shared actor per team needs one action space
                raise ValueError(f"team {name!r}: its agents have {sorted(mine)} actions; give "
                                 "agents with different action spaces different teams (team_of)")
            per_team.append(mine.pop())
        return cls(tuple(n for n, _ in kept), tuple(a for _, a in kept),
                   tuple(int(d) for d in env.obs_dims.tolist()), int(env.num_actions),
                   tuple(per_team))

    @property
    def num_agents(self) -> int:
        """Agents per environment."""
        return len(self.obs_dims)

    @property
    def obs_dim(self) -> int:
        """Padded observation width."""
        return max(self.obs_dims)

    @property
    def state_dim(self) -> int:
        """Length of the global state (all agents' unpadded observations)."""
        return sum(self.obs_dims)

    def team_num_actions(self, team: int) -> int:
        """Discrete actions of ``team``'s agents."""
        return self.team_actions[team] if self.team_actions else self.num_actions

    def team_obs_dim(self, team: int) -> int:
        """Observation width of ``team`` (its widest agent's)."""
        return max(self.obs_dims[i] for i in self.agents[team])

    def team_index(self, name: str) -> int:
        """The id of the team called ``name``; the error lists the teams."""
        if name not in self.names:
            raise ValueError(f"unknown team {name!r}: this env's teams are {list(self.names)}")
        return self.names.index(name)


class ValueNorm(nn.Module):
    """Running mean and variance of value targets, debiased (MAPPO's ValueNorm).

    ``running = beta * running + (1 - beta) * batch``; the debiasing term makes the early
    estimates the plain mean of the batches seen. Its buffers travel with the weights.

    Examples
    --------
    >>> vn = ValueNorm()
    >>> vn.update(vn.batch_stats(torch.tensor([1.0, 3.0])))
    >>> vn.normalize(torch.tensor([2.0])).item()
    0.0
    >>> round(vn.denormalize(torch.tensor([1.0])).item(), 4)
    3.0
    """

    def __init__(self, beta: float = 0.99999, eps: float = 1e-5, enabled: bool = True) -> None:
        super().__init__()
        self.beta, self.eps, self.enabled = beta, eps, enabled
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    @staticmethod
    def batch_stats(x: Tensor) -> Tensor:
        """``[mean, mean of squares]`` of ``x`` (what replicas average before :meth:`update`)."""
        x = x.detach().double()
        return torch.stack([x.mean(), (x * x).mean()])

    @torch.no_grad()
    def update(self, stats: Tensor) -> None:
        """Fold a batch's :meth:`batch_stats` into the running estimates."""
        if not self.enabled:
            return
        b = self.beta
        stats = stats.to(self.running_mean.device, torch.float64)
        self.running_mean.mul_(b).add_(stats[0] * (1 - b))
        self.running_mean_sq.mul_(b).add_(stats[1] * (1 - b))
        self.debiasing_term.mul_(b).add_(1 - b)

    def mean_std(self) -> tuple[Tensor, Tensor]:
        """Debiased mean and standard deviation (variance floored at 1e-2, as in MAPPO)."""
        d = self.debiasing_term.clamp(min=self.eps)
        mean, mean_sq = self.running_mean / d, self.running_mean_sq / d
        return mean, (mean_sq - mean * mean).clamp(min=1e-2).sqrt()

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / std`` (identity when disabled or before any update)."""
        if not self.enabled or float(self.debiasing_term) == 0.0:
            return x
        mean, std = self.mean_std()
        return ((x - mean) / std).to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        """``x * std + mean`` (identity when disabled or before any update)."""
        if not self.enabled or float(self.debiasing_term) == 0.0:
            return x
        mean, std = self.mean_std()
        return (x * std + mean).to(x.dtype)


@dataclass(frozen=True)
class ModelSpec:
    """Network settings shared by actors and learner.

    Parameters
    ----------
    critic : {"central", "local"}
        Critic input: global state + own observation (MAPPO), or own observation (IPPO).
    state : {"concat", "pooled"}
        Global state: all agents' observations concatenated (the env's ``global_state``), or
        each team's mean observation concatenated (fixed size for teams of any size).
    hidden : tuple of int
        Hidden layer widths of actors and critics.
    value_norm : bool
        Normalise value targets with :class:`ValueNorm`.

    Examples
    --------
    >>> ModelSpec(critic="IPPO")
    Traceback (most recent call last):
    ...
    ValueError: critic='IPPO': choose 'central' (MAPPO) or 'local' (IPPO)
    """

    critic: str = "central"
    state: str = "concat"
    hidden: tuple[int, ...] = (64, 64)
    value_norm: bool = True

    def __post_init__(self) -> None:
        if self.critic not in CRITICS:
            raise ValueError(f"critic={self.critic!r}: choose 'central' (MAPPO) or 'local' (IPPO)")
        if self.state not in STATES:
            raise ValueError(f"state={self.state!r}: choose 'concat' (all observations) or "
                             "'pooled' (team means, for large teams)")


class MAPPOModel(nn.Module):
    """Team actors, team critics and team value normalisers.

    Parameters
    ----------
    layout : TeamLayout
        Teams and sizes.
    spec : ModelSpec
        Critic kind, global state and widths.

    Examples
    --------
    >>> lay = TeamLayout(("adversary", "good"), ((0, 1, 2), (3,)), (16, 16, 16, 14), 5)
    >>> model = MAPPOModel(lay, ModelSpec())
    >>> obs = torch.zeros(8, 4, 16)
    >>> actions, logp = model.act(obs, torch.Generator().manual_seed(0))
    >>> actions.shape, model.values(obs, 0).shape, model.value(obs).shape
    (torch.Size([8, 4]), torch.Size([8, 3]), torch.Size([8, 4]))
    """

    def __init__(self, layout: TeamLayout, spec: ModelSpec) -> None:
        super().__init__()
        self.layout, self.spec = layout, spec
        dims = [layout.team_obs_dim(t) for t in range(len(layout.names))]
        state_dim = layout.state_dim if spec.state == "concat" else sum(dims)
        self.actors = nn.ModuleList([
            swap_tanh(mlp(d, layout.team_num_actions(t), spec.hidden, out_std=0.01),
                       SigmoidTanh) for t, d in enumerate(dims)])
        critic_in = [d + (state_dim if spec.critic == "central" else 0) for d in dims]
        self.critics = nn.ModuleList([swap_tanh(mlp(d, 1, spec.hidden, out_std=1.0),
                                                 SigmoidTanh) for d in critic_in])
        self.value_norms = nn.ModuleList([ValueNorm(enabled=spec.value_norm) for _ in dims])
        self._dims = dims
        self._slices = [_as_slice(a) for a in layout.agents]
        for t, agents in enumerate(layout.agents):  # moved with the model by .to(device)
            self.register_buffer(f"agent_index_{t}", torch.tensor(agents), persistent=False)
        flat = [i * layout.obs_dim + j for i, d in enumerate(layout.obs_dims) for j in range(d)]
        full = len(flat) == layout.num_agents * layout.obs_dim
        self.register_buffer("state_index", None if full else torch.tensor(flat),
                             persistent=False)

    def agent_index(self, team: int) -> Tensor:
        """Agent indices ``[A_team]`` of ``team``, on the model's device."""
        return getattr(self, f"agent_index_{team}")

    # -------------------------------------------------------------- inputs
    def team_obs(self, obs: Tensor, team: int) -> Tensor:
        """Observations ``[N, A_team, d_team]`` of ``team``'s agents, from ``[N, A, D]``."""
        sl = self._slices[team]
        part = obs[:, sl] if sl is not None else obs.index_select(1, self.agent_index(team))
        return part[..., : self._dims[team]]

    def global_state(self, obs: Tensor) -> Tensor:
        """Global state ``[N, S]`` built from all agents' observations ``[N, A, D]``.

        With ``state="concat"`` it equals the env's ``global_state(obs)``.
        """
        if self.spec.state == "pooled":
            return torch.cat([self.team_obs(obs, t).mean(1) for t in range(len(self._dims))], -1)
        flat = obs.reshape(len(obs), -1)
        if self.state_index is None:
            return flat
        return flat.index_select(1, self.state_index)

    def critic_input(self, obs: Tensor, team: int) -> Tensor:
        """Critic input ``[N * A_team, in]``: own observation, after the global state when
        the critic is central."""
        own = self.team_obs(obs, team)
        n, a, d = own.shape
        if self.spec.critic == "local":
            return own.reshape(n * a, d)
        state = self.global_state(obs)
        both = torch.cat([state[:, None, :].expand(n, a, state.shape[-1]), own], -1)
        return both.reshape(n * a, -1)

    # ------------------------------------------------------------- forward
    def logits(self, obs: Tensor, team: int) -> Tensor:
        """Action logits ``[N * A_team, num_actions]``: one fused pass over the team."""
        own = self.team_obs(obs, team)
        return self.actors[team](own.reshape(-1, own.shape[-1]))

    split_state_layer: bool = True
    """Run a central critic's first layer as ``W_state @ state`` once per env plus
    ``W_own @ own`` per agent (the same weights, the same maths as on the concatenation),
    instead of on ``[state, own]`` per agent: a team of ``A_team`` agents computes the
    state's part ``A_team`` times fewer, and the ``[N * A_team, S + d]`` concatenation is
    never built."""

    def values(self, obs: Tensor, team: int) -> Tensor:
        """Normalised-scale values ``[N, A_team]`` of ``team``'s agents."""
        critic = self.critics[team]
        if self.spec.critic == "local" or not self.split_state_layer:
            return critic(self.critic_input(obs, team)).view(len(obs), -1)
        state, own = self.global_state(obs), self.team_obs(obs, team)
        first, s = critic[0], state.shape[-1]
        h = F.linear(state, first.weight[:, :s], first.bias)[:, None, :] + F.linear(
            own, first.weight[:, s:])  # [N, A_team, H]
        return critic[1:](h).view(len(obs), -1)

    @torch.no_grad()
    def value(self, obs: Tensor, chunk: int = 1 << 16) -> Tensor:
        """Values in return units ``[N, A]`` for every agent (chunks of ``chunk`` rows)."""
        out = torch.empty(obs.shape[:2], dtype=obs.dtype, device=obs.device)
        for s in range(0, len(obs), chunk):
            part = obs[s : s + chunk]
            for t in range(len(self._dims)):
                v = self.value_norms[t].denormalize(self.values(part, t))
                out[s : s + chunk, self.agent_index(t)] = v
        return out

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None = None,
            deterministic: bool = False, random_teams: frozenset[int] = frozenset()
            ) -> tuple[Tensor, Tensor]:
        """Actions ``[N, A]`` (long) and their log-probabilities, one pass per team.

        Teams in ``random_teams`` act uniformly at random (untrained opponents) whatever
        ``deterministic`` says: the argmax of their flat logits would be action 0 (no-op), an
        opponent that never moves.
        """
        n = len(obs)
        actions = torch.empty(n, self.layout.num_agents, dtype=torch.long, device=obs.device)
        logp = torch.empty(n, self.layout.num_agents, dtype=obs.dtype, device=obs.device)
        for t in range(len(self._dims)):
            idx = self.agent_index(t)
            if t in random_teams:
                logits = torch.zeros(n * len(idx), self.layout.team_num_actions(t),
                                     device=obs.device)
                a, lp = sample(logits, generator, deterministic=False)
            else:
                a, lp = sample(self.logits(obs, t), generator, deterministic)
            actions[:, idx] = a.view(n, -1)
            logp[:, idx] = lp.view(n, -1).to(obs.dtype)
        return actions, logp

    def evaluate(self, obs: Tensor, actions: Tensor, team: int
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities, entropies and normalised values of ``team``, each
        ``[N * A_team]``, for observations ``[N, A, D]`` and actions ``[N, A]``."""
        logp_all = torch.log_softmax(self.logits(obs, team), -1)
        act = self.team_actions(actions, team).reshape(-1, 1)
        logp = logp_all.gather(-1, act).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.values(obs, team).reshape(-1)

    def team_actions(self, x: Tensor, team: int) -> Tensor:
        """Columns of ``team``'s agents of a per-agent tensor ``[N, A, ...]``."""
        sl = self._slices[team]
        return x[:, sl] if sl is not None else x.index_select(1, self.agent_index(team))

    def parameter_groups(self, teams: list[int]) -> list[list[nn.Parameter]]:
        """Per-team actor and critic parameters of ``teams`` (each clipped on its own)."""
        return [list(m.parameters()) for t in teams for m in (self.actors[t], self.critics[t])]


class _SigmoidTanh(torch.autograd.Function):
    """``tanh(x) = 2 sigmoid(2x) - 1``, with tanh's own backward ``g (1 - y^2)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # noqa: D102
        if x.device.type == "cpu":
            y = torch.mul(x, 2.0).sigmoid_().mul_(2.0).sub_(1.0)
        else:  # GPU tanh kernels are fast: one kernel instead of four
            y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # noqa: D102
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class SigmoidTanh(nn.Module):
    """``nn.Tanh`` computed as ``2 sigmoid(2x) - 1`` (within 2e-7 of it in float32).

    torch's CPU ``tanh`` kernel costs 3-9x its ``sigmoid`` on the same tensor (measured in
    ``benchmarks/mappo_scale.md``), and the hidden layers' activations were about a fifth
    of a MAPPO update's time; the backward is tanh's own. On other devices it is ``tanh``.
    The training model uses it; :class:`MAPPOPolicy` (exported, scripted) keeps ``nn.Tanh``.

    Examples
    --------
    >>> x = torch.linspace(-6, 6, 101)
    >>> bool((SigmoidTanh()(x) - torch.tanh(x)).abs().max() < 1e-6)
    True
    """

    def forward(self, x: Tensor) -> Tensor:
        """``tanh(x)``."""
        return _SigmoidTanh.apply(x)


def swap_tanh(seq: nn.Sequential, to: type[nn.Module]) -> nn.Sequential:
    """``seq`` with its ``nn.Tanh``/:class:`SigmoidTanh` activations replaced by ``to()``
    (in place; no parameters change).

    Examples
    --------
    >>> swap_tanh(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), SigmoidTanh)[1]
    SigmoidTanh()
    """
    for i, m in enumerate(seq):
        if isinstance(m, (nn.Tanh, SigmoidTanh)):
            seq[i] = to()
    return seq


def _as_slice(agents: tuple[int, ...]) -> slice | None:
    """A slice when ``agents`` are consecutive (a view instead of a gather)."""
    first = agents[0]
    return slice(first, first + len(agents)) if agents == tuple(
        range(first, first + len(agents))) else None



class MAPPOPolicy(nn.Module):
    """The team actors alone: ``forward(obs) -> actions`` for every agent of a batch of envs.

    Observations are the batched env's layout, ``[B, A, obs_dim]`` (agent ``i`` in row ``i``,
    in the env's ``agent_names`` order, each zero-padded to the widest observation); the
    actions are ``[B, A]`` (int64, agent ``i``'s index into its own action space). Each team's
    actor sees its agents' first ``team_obs_dim`` columns. Teams in ``random_teams`` (not
    trained) act uniformly at random, in greedy mode too. No observation normalisation:
    MAPPO trains on raw observations.

    Examples
    --------
    >>> lay = TeamLayout(("adversary", "good"), ((0, 1, 2), (3,)), (16, 16, 16, 14), 5)
    >>> model = MAPPOModel(lay, ModelSpec())
    >>> pi = MAPPOPolicy(model, deterministic=True)
    >>> pi(torch.zeros(6, 4, 16)).shape
    torch.Size([6, 4])
    >>> torch.jit.script(pi)(torch.zeros(2, 4, 16)).dtype
    torch.int64
    """

    def __init__(self, model: MAPPOModel, deterministic: bool = True,
                 random_teams: frozenset[int] = frozenset()) -> None:
        super().__init__()
        lay = model.layout
        self.actors = nn.ModuleList([swap_tanh(copy.deepcopy(a), nn.Tanh) for a in model.actors])
        self.deterministic = deterministic
        self.num_agents = lay.num_agents
        self.register_buffer("order", torch.tensor([i for a in lay.agents for i in a]))
        self.starts = [sum(len(a) for a in lay.agents[:t]) for t in range(len(lay.names) + 1)]
        self.dims = [lay.team_obs_dim(t) for t in range(len(lay.names))]
        self.counts = [lay.team_num_actions(t) for t in range(len(lay.names))]
        self.random = [t in random_teams for t in range(len(lay.names))]

    def forward(self, obs: Tensor) -> Tensor:
        """Actions ``[B, A]`` for observations ``[B, A, obs_dim]``."""
        n = obs.shape[0]
        obs = obs.float()
        out = torch.zeros(n, self.num_agents, dtype=torch.long, device=obs.device)
        for t, actor in enumerate(self.actors):
            idx = self.order[self.starts[t] : self.starts[t + 1]]
            if self.random[t]:
                a = torch.randint(0, self.counts[t], (n, idx.shape[0]), device=obs.device)
            else:
                own = obs.index_select(1, idx)[:, :, : self.dims[t]]
                logits = actor(own.reshape(-1, self.dims[t]))
                if self.deterministic:
                    a = logits.argmax(-1)
                else:
                    a = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
                a = a.view(n, -1)
            out[:, idx] = a
        return out
