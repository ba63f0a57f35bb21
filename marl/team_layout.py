"""Which agents of a batched multi-agent env form which team, with their observation and
action sizes: what MAPPO's networks are shaped by (one shared actor and critic per team)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TeamLayout"]


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
