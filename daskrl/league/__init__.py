"""A self-play league: a coordinator (:class:`LeagueCoordinator`) that keeps frozen snapshots
of the learning policy, rates them (OpenSkill) and picks each iteration's opponents by
prioritised fictitious self-play (:mod:`daskrl.league.pfsp`)."""

from daskrl.league.coordinator import LeagueCoordinator, LeagueSettings

__all__ = ["LeagueCoordinator", "LeagueSettings"]
