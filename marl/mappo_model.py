"""MAPPO networks: one shared actor per team, a critic per team, value normalisation.

All agents of a team, in all environments of a batch, go through one forward pass
(``[E, A_team, obs_dim]`` flattened to ``[E * A_team, obs_dim]``), whatever the team sizes.
The critic of a team sees either the global state plus the agent's own observation
(``critic="central"``, MAPPO) or only the agent's own observation (``critic="local"``, IPPO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from daskrl.algos.networks import mlp, sample

from .activations import SigmoidTanh, swap_tanh
from .team_layout import TeamLayout
from .value_norm import ValueNorm

__all__ = ["CRITICS", "STATES", "MAPPOModel", "ModelSpec", "SigmoidTanh", "TeamLayout",
           "ValueNorm", "sample", "swap_tanh"]

CRITICS = ("central", "local")
STATES = ("concat", "pooled")


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


def _as_slice(agents: tuple[int, ...]) -> slice | None:
    """A slice when ``agents`` are consecutive (a view instead of a gather)."""
    first = agents[0]
    return slice(first, first + len(agents)) if agents == tuple(
        range(first, first + len(agents))) else None
