"""A league of two learning teams in an asymmetric game (simple tag's predators and prey):
each team's learning policy plays the other team's frozen snapshots.

The state is one league per team (:func:`~daskrl.league.coordinator.new_league`): team
``T``'s league has ``T``'s learning policy as its ``main`` and, as members, the uniformly
random player (the anchor) and the snapshots of the *other* team. Every ``snapshot_every``
iterations each team's policy is frozen into the other team's league, entering with the
rating its learner has in its own league. The actors receive, besides the learner's weights:

- ``league/<team>/ids``: the member ids of team ``<team>``'s opponent slots (int64);
- ``league/<team>/<slot>/<param>``: a snapshot slot's weights (the other team's policy
  parameters, under the learner's own names);
- ``league/self_play``: the share of episodes where both teams play their latest policies
  (and both learn).

They report each finished episode as ``(team, opponent id, score)``: the learning team's
name, the member id it played (:data:`~daskrl.league.coordinator.SELF` for the other team's
latest policy) and its score (1 win, 0.5 draw, 0 loss). A self-play episode is reported once
per team.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from daskrl.core.algorithm import LearnerOutput, Weights
from daskrl.league.coordinator import (
    PREFIX,
    LeagueCoordinator,
    LeagueSettings,
    copy_league,
    new_league,
)
from daskrl.league.ratings import ordinal


class TeamLeagueCoordinator:
    """Role ``coordinator`` of a two-team league (:class:`~daskrl.core.contracts.Coordinator`).

    Parameters
    ----------
    settings : LeagueSettings
        Snapshots, slots, weighting and self-play share, for both teams' leagues (main
        exploiters are not served: a team's opponents are the other team's snapshots).
    teams : dict of str to str
        Each team's name and the prefix of its policy's parameters among the learner's
        weights (what a snapshot of the team keeps).

    Examples
    --------
    >>> out = LearnerOutput(0, {}, {"a.w": torch.zeros(2), "b.w": torch.ones(2)}, {})
    >>> coord = TeamLeagueCoordinator(LeagueSettings(slots=2), {"pred": "a.", "prey": "b."})
    >>> first = coord.start(out)
    >>> [m["name"] for m in first.coordinator["teams"]["pred"]["members"]]
    ['random', 'prey-v0']
    >>> first.weights["league/pred/ids"].tolist()  # random player 0, the prey's snapshot 1
    [1, 0]
    >>> first.weights["league/pred/0/b.w"].tolist()  # slot 0: the prey's parameters
    [1.0, 1.0]
    """

    def __init__(self, settings: LeagueSettings, teams: dict[str, str]) -> None:
        if settings.exploiters:
            raise ValueError("--exploiters is not served by a two-team league (each team's "
                             "opponents are the other team's snapshots): drop it")
        if len(teams) != 2:
            raise ValueError(f"a team league needs two teams, got {sorted(teams)}")
        self.settings, self.teams = settings, dict(teams)
        self.inner = LeagueCoordinator(settings)

    def other(self, team: str) -> str:
        """The team ``team`` plays against."""
        return next(t for t in self.teams if t != team)

    def start(self, output: LearnerOutput) -> LearnerOutput:
        """The first iteration's input: the leagues as they are (new ones, each with the
        other team's initial policy as its first snapshot, when there are none) and their
        picks; nothing is rated or decayed."""
        return self._planned(output, self._leagues(output), dict(output.metrics))

    def coordinate(self, output: LearnerOutput, iteration: int) -> LearnerOutput:
        """The next iteration's input: the episodes rated per team, snapshots when due, the
        picks in the weights and each team's league columns in the metrics."""
        leagues = self._leagues(output)
        metrics = dict(output.metrics)
        matches = metrics.pop("matches", [])
        for team, league in leagues.items():
            mine = [(0, int(ident), float(score)) for name, ident, score in matches
                    if name == team]
            for key, value in self.inner.record(league, mine).items():
                if not key.startswith(f"{PREFIX}exploiter") and key != f"{PREFIX}rating_games":
                    metrics[f"{PREFIX}{team}/{key[len(PREFIX):]}"] = value
        planned = self._planned(output, leagues, metrics)
        for team, league in leagues.items():
            rating = league["main"]["rating"]
            planned.metrics.update({
                f"{PREFIX}{team}/rating_mu": rating["mu"],
                f"{PREFIX}{team}/rating_sigma": rating["sigma"],
                f"{PREFIX}{team}/rating_ordinal": ordinal(rating),
                f"{PREFIX}{team}/members": len(league["members"])})
        return planned

    def _leagues(self, output: LearnerOutput) -> dict[str, dict[str, Any]]:
        state = output.coordinator or {}
        if state and set(state.get("teams", {})) != set(self.teams):
            raise ValueError(f"the run's league has teams {sorted(state.get('teams', {}))}, "
                             f"not {sorted(self.teams)}: resume it with the env it trained on")
        settings = dataclasses.replace(self.settings, exploiters=0)
        return {t: copy_league(state["teams"][t]) if state else new_league(settings)
                for t in self.teams}

    def team_weights(self, weights: Weights, team: str) -> Weights:
        """Team ``team``'s policy parameters among ``weights`` (names kept)."""
        prefix = self.teams[team]
        return {k: v for k, v in weights.items() if k.startswith(prefix)}

    def _planned(self, output: LearnerOutput, leagues: dict[str, dict[str, Any]],
                 metrics: dict[str, Any]) -> LearnerOutput:
        s = self.settings
        own = {k: v for k, v in output.weights.items() if not k.startswith(PREFIX)}
        if output.version % s.snapshot_every == 0:
            for team in self.teams:  # team's policy joins the other team's league
                league = leagues[self.other(team)]
                if not any(m["version"] == output.version for m in league["members"]):
                    self.inner.snapshot(league, self.team_weights(own, team), output.version,
                                        source=(team, leagues[team]["main"]["rating"]))
        weights = dict(own)
        weights[f"{PREFIX}self_play"] = torch.tensor(s.self_play, dtype=torch.float64)
        for number, (team, league) in enumerate(leagues.items()):
            rng = np.random.default_rng([output.version, number, league["next_id"],
                                         league["main"]["played"]])
            picks = self.inner.pick(league, rng)
            weights[f"{PREFIX}{team}/ids"] = torch.tensor([m["id"] for m in picks],
                                                          dtype=torch.int64)
            for slot, member in enumerate(picks):
                for name, value in league["weights"].get(member["id"], {}).items():
                    weights[f"{PREFIX}{team}/{slot}/{name}"] = value
        return dataclasses.replace(output, weights=weights, metrics=metrics,
                                   coordinator={"teams": leagues})
