"""The league's coordinator: snapshots of the learning policy, their ratings, and the
opponents each iteration's games are played against.

Its state is plain data carried from one coordinator task to the next
(``LearnerOutput.coordinator``), not a Dask actor: a checkpoint holds the whole league,
``--resume`` restores it exactly, and after a lost worker the run goes on with the league of
its last checkpointed iteration and the learner as it last finished (see
:class:`~daskrl.core.contracts.Coordinator`).

What it puts into the weights the actors receive (besides the learner's own):

- ``league/ids``: the member id of each opponent slot (int64);
- ``league/<slot>/<param>``: a snapshot slot's policy weights (a random-player slot has none);
- ``league/self_play``: the share of games played against the latest policy itself.

The actors report each finished game as ``(learning member, opponent id, score)`` in their
batches' stats (``matches``): the learning member's index (0 the main agent, ``1 + i``
exploiter ``i``), the opponent's member id (:data:`SELF` for the main agent's latest policy
against itself, :data:`MAIN` for an exploiter's game against it) and the learning member's
score (1 win, 0.5 draw, 0 loss). A rating game between two league members is reported as
``(RATING, member id, other member id, the first member's score)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from daskrl.core.algorithm import LearnerOutput, Weights
from daskrl.league.pfsp import Weighting, estimated_win_rate, pfsp_probabilities
from daskrl.league.ratings import new_rating, ordinal, rate_game

PREFIX = "league/"
"""Weights under this prefix are the league's, not the learner's."""
SELF = -1
"""The member id the actors report for a game against the latest policy itself."""
MAIN = -2
"""The opponent id an exploiter's game reports: the main agent's latest policy."""
RATING = -1
"""The learning-member index a rating game reports: two league members, no learner."""
RANDOM = 0
"""The id of the uniformly random player, the league's fixed anchor."""

COLUMNS = ("league/rating_mu", "league/rating_sigma", "league/rating_ordinal", "league/members",
           "league/games", "league/self_games", "league/win_rate", "league/win_rate_random",
           "league/exploiter_games", "league/exploiter_win_rate", "league/rating_games")
"""The ``metrics.csv`` columns the coordinator writes every iteration."""


@dataclass(frozen=True)
class LeagueSettings:
    """How the league grows and picks opponents.

    Examples
    --------
    >>> LeagueSettings(snapshot_every=5).snapshot_every
    5
    >>> LeagueSettings(self_play=1.5)
    Traceback (most recent call last):
    ...
    ValueError: self_play must be in [0, 1], got 1.5
    """

    snapshot_every: int = 10
    """Iterations between frozen snapshots of the learning policy."""
    max_snapshots: int = 20
    """Snapshots kept; the oldest leaves the league beyond this."""
    self_play: float = 0.2
    """Share of games against the latest policy itself (the rest against league members)."""
    weighting: Weighting = "hard"
    """PFSP's weighting of an opponent by the learner's win rate ``x`` against it."""
    slots: int = 4
    """Opponents sent to the actors each iteration (drawn by PFSP, with replacement)."""
    decay: float = 0.98
    """Per-iteration decay of the win-rate counts: the estimate follows a changing learner."""
    random_player: bool = True
    """Keep the uniformly random player in the league (the rating anchor)."""
    fixed: tuple[str, ...] = ()
    """Scripted players that stay in the league beside the random player (member ids
    ``1..len(fixed)`` in this order; the actors play them by name, e.g. Connect Four's
    ``lookahead``). Rated like snapshots; PFSP draws them like any member."""
    exploiters: int = 0
    """Main exploiters learning beside the main agent, trained only against its latest
    policy (AlphaStar's): their snapshots join the league, so the main agent meets the
    weaknesses they found."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.self_play <= 1.0:
            raise ValueError(f"self_play must be in [0, 1], got {self.self_play}")
        if self.exploiters < 0:
            raise ValueError(f"exploiters must be >= 0, got {self.exploiters}")
        for name in ("snapshot_every", "max_snapshots", "slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")


def learner_weights(weights: Weights) -> Weights:
    """The main agent's weights from what the actors receive: the names without a ``/``
    (the league's picks and the exploiters' weights are under prefixes)."""
    return {k: v for k, v in weights.items() if "/" not in k}


def member_weights(weights: Weights, member: str) -> Weights:
    """One learning member's weights: ``main``'s, or an exploiter's under ``<member>/``.

    Examples
    --------
    >>> w = {"a": 1, "exploiter0/a": 2, "league/ids": 3}
    >>> member_weights(w, "main"), member_weights(w, "exploiter0")
    ({'a': 1}, {'a': 2})
    """
    if member == "main":
        return learner_weights(weights)
    prefix = f"{member}/"
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def new_league(settings: LeagueSettings) -> dict[str, Any]:
    """A league with the learning policy (``main``) and, if asked, the random player."""
    def player(ident: int, name: str, kind: str) -> dict[str, Any]:
        return {"id": ident, "name": name, "kind": kind, "version": None,
                "rating": new_rating(), "score": 0.0, "games": 0.0, "played": 0, "won": 0,
                "drawn": 0}
    members = [player(RANDOM, "random", "random")] if settings.random_player else []
    members += [player(RANDOM + 1 + i, name, "fixed") for i, name in enumerate(settings.fixed)]
    exploiters = [{"name": f"exploiter{i}", "rating": new_rating(), "played": 0, "won": 0,
                   "drawn": 0} for i in range(settings.exploiters)]
    return {"main": {"rating": new_rating(), "played": 0}, "members": members, "weights": {},
            "next_id": RANDOM + 1 + len(settings.fixed), "exploiters": exploiters}


def fixed_players(league: dict[str, Any]) -> tuple[str, ...]:
    """The names of a league's scripted members (:attr:`LeagueSettings.fixed`), in id order."""
    return tuple(m["name"] for m in sorted(league["members"], key=lambda m: m["id"])
                 if m["kind"] == "fixed")


class LeagueCoordinator:
    """Role ``coordinator`` of a self-play league (:class:`~daskrl.core.contracts.Coordinator`).

    :meth:`start` sets up the first iteration's picks; each :meth:`coordinate` rates the
    iteration's games (OpenSkill), freezes a snapshot every ``snapshot_every`` versions, and
    draws the next iteration's opponents by PFSP.

    Examples
    --------
    >>> out = LearnerOutput(0, {}, {"w": torch.zeros(2)}, {})
    >>> league = LeagueCoordinator(LeagueSettings(snapshot_every=1)).start(out)
    >>> [m["name"] for m in league.coordinator["members"]]
    ['random', 'v0']
    >>> league.weights["league/ids"].tolist()  # four slots, drawn by PFSP
    [0, 0, 1, 0]
    >>> sorted(league.weights)[:2]  # the snapshot's weights in its slot, then the ids
    ['league/2/w', 'league/ids']
    """

    def __init__(self, settings: LeagueSettings | None = None) -> None:
        self.settings = settings or LeagueSettings()

    def start(self, output: LearnerOutput) -> LearnerOutput:
        """The first iteration's input (a fresh run's, or a resumed one's): the league as it
        is (a new one, with the initial policy as its first snapshot, when there is none)
        and its picks; nothing is rated or decayed, the metrics stay as they are.

        Raises
        ------
        ValueError
            When a resumed league has another number of exploiters than the settings.
        """
        if output.coordinator and "teams" in output.coordinator:
            raise ValueError("the run's league is a two-team one (simple_tag): resume it with "
                             "the env it trained on")
        league = (copy_league(output.coordinator) if output.coordinator
                  else new_league(self.settings))
        have = len(league["exploiters"])
        if have != self.settings.exploiters:
            raise ValueError(f"the run's league has {have} exploiter(s), not "
                             f"{self.settings.exploiters}: resume it with --exploiters {have}")
        fixed = fixed_players(league)
        if fixed != self.settings.fixed:
            raise ValueError(f"the run's league has the fixed players {list(fixed)}, not "
                             f"{list(self.settings.fixed)}: resume it with --fixed-players "
                             f"{','.join(fixed) or 'none'}")
        return self._planned(output, league, dict(output.metrics))

    def coordinate(self, output: LearnerOutput, iteration: int) -> LearnerOutput:
        """The output the next iteration takes: the iteration's games rated, a snapshot when
        one is due, the picks in the weights and the league's columns in the metrics."""
        league = (copy_league(output.coordinator) if output.coordinator
                  else new_league(self.settings))
        metrics = dict(output.metrics)
        metrics.update(self.record(league, metrics.pop("matches", [])))
        planned = self._planned(output, league, metrics)  # a snapshot may join: then count
        main = league["main"]["rating"]
        metrics.update({
            "league/rating_mu": main["mu"], "league/rating_sigma": main["sigma"],
            "league/rating_ordinal": ordinal(main), "league/members": len(league["members"])})
        return planned

    def _planned(self, output: LearnerOutput, league: dict[str, Any],
                 metrics: dict[str, Any]) -> LearnerOutput:
        """``output`` with ``league`` (a snapshot added when one is due) and its next picks."""
        s = self.settings
        own = {k: v for k, v in output.weights.items() if not k.startswith(PREFIX)}
        if output.version % s.snapshot_every == 0 and not any(
                m["version"] == output.version for m in league["members"]):
            self.snapshot(league, learner_weights(own), output.version)
            for exploiter in league["exploiters"]:
                self.snapshot(league, member_weights(output.weights, exploiter["name"]),
                              output.version, exploiter)
        picks = self.pick(league, np.random.default_rng([output.version, league["next_id"],
                                                         league["main"]["played"]]))
        weights = dict(own)  # the learning members' weights
        weights[f"{PREFIX}ids"] = torch.tensor([m["id"] for m in picks], dtype=torch.int64)
        weights[f"{PREFIX}self_play"] = torch.tensor(s.self_play, dtype=torch.float64)
        for slot, member in enumerate(picks):
            for name, value in league["weights"].get(member["id"], {}).items():
                weights[f"{PREFIX}{slot}/{name}"] = value
        return dataclasses.replace(output, weights=weights, metrics=metrics,
                                   coordinator=league)

    def record(self, league: dict[str, Any], matches: list[Any]) -> dict[str, float]:
        """Rate the games ``matches`` (``(learning member, opponent id, score)``; a pair
        ``(opponent id, score)`` is the main agent's) and update the win-rate counts;
        returns this iteration's league columns about them."""
        decay = self.settings.decay
        by_id = {m["id"]: m for m in league["members"]}
        for member in league["members"]:
            member["score"] *= decay
            member["games"] *= decay
        scores, random_scores, exploiter_scores, self_games = [], [], [], 0
        main = league["main"]
        rating_games = 0
        for match in matches:
            if len(match) == 4:  # a rating game between two league members
                _, a, b, score = match
                first, second = by_id.get(int(a)), by_id.get(int(b))
                if first is not None and second is not None:
                    rating_games += 1
                    first["rating"], second["rating"] = _rate_members(first, second,
                                                                      float(score))
                continue
            learning, ident, score = (0, *match) if len(match) == 2 else match
            learning, ident, score = int(learning), int(ident), float(score)
            if learning > 0:  # an exploiter's game against the main agent
                exploiter = league["exploiters"][learning - 1]
                exploiter_scores.append(score)
                exploiter["played"] += 1
                exploiter["won"] += int(score == 1.0)
                exploiter["drawn"] += int(score == 0.5)
                exploiter["rating"], main["rating"] = rate_game(
                    exploiter["rating"], main["rating"], score)
                continue
            main["played"] += 1
            if ident == SELF:
                self_games += 1
                continue
            member = by_id.get(ident)
            if member is None:  # left the league while its game was played
                continue
            scores.append(score)
            if member["kind"] == "random":
                random_scores.append(score)
            main["rating"], member["rating"] = rate_game(
                main["rating"], member["rating"], score, b_fixed=member["kind"] == "random")
            member["score"] += score
            member["games"] += 1.0
            member["played"] += 1
            member["won"] += int(score == 0.0)  # the member's own wins
            member["drawn"] += int(score == 0.5)
        return {"league/games": float(len(scores)), "league/self_games": float(self_games),
                "league/win_rate": _mean(scores), "league/win_rate_random": _mean(random_scores),
                "league/exploiter_games": float(len(exploiter_scores)),
                "league/exploiter_win_rate": _mean(exploiter_scores),
                "league/rating_games": float(rating_games)}

    def snapshot(self, league: dict[str, Any], weights: Weights, version: int,
                 exploiter: dict[str, Any] | None = None, *,
                 source: tuple[str, dict[str, float]] | None = None) -> None:
        """Freeze ``weights`` (the main agent's, or ``exploiter``'s) as a member rated as its
        learner is now; the oldest snapshot leaves beyond ``max_snapshots``. ``source``
        (name, rating) freezes another league's learner instead (the other team's, in
        :class:`~daskrl.league.teams.TeamLeagueCoordinator`)."""
        ident = league["next_id"]
        league["next_id"] = ident + 1
        if source is not None:
            name, rating = f"{source[0]}-v{version}", source[1]
        elif exploiter is not None:
            name, rating = f"{exploiter['name']}-v{version}", exploiter["rating"]
        else:
            name, rating = f"v{version}", league["main"]["rating"]
        league["members"].append({
            "id": ident, "kind": "snapshot" if exploiter is None else "exploiter",
            "name": name, "version": version, "rating": dict(rating), "score": 0.0,
            "games": 0.0, "played": 0, "won": 0, "drawn": 0})
        league["weights"][ident] = {k: v.detach().clone() for k, v in weights.items()}
        snaps = [m for m in league["members"] if m["kind"] in ("snapshot", "exploiter")]
        for old in snaps[: max(0, len(snaps) - self.settings.max_snapshots)]:
            league["members"].remove(old)
            league["weights"].pop(old["id"], None)

    def probabilities(self, league: dict[str, Any]) -> np.ndarray:
        """PFSP's chance of drawing each member of the league, in member order."""
        rates = [estimated_win_rate(m["score"], m["games"]) for m in league["members"]]
        return pfsp_probabilities(rates, self.settings.weighting)

    def pick(self, league: dict[str, Any], rng: np.random.Generator) -> list[dict[str, Any]]:
        """The next iteration's opponent slots, drawn by PFSP with replacement."""
        members = league["members"]
        if not members:
            return []
        drawn = rng.choice(len(members), size=self.settings.slots, p=self.probabilities(league))
        return [members[i] for i in drawn]


def _rate_members(a: dict[str, Any], b: dict[str, Any], score: float
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Both members' ratings after a game ``a`` scored ``score`` in (the random player, the
    anchor, stays as it is)."""
    if a["kind"] == "random":
        after_b, after_a = rate_game(b["rating"], a["rating"], 1.0 - score, b_fixed=True)
        return after_a, after_b
    return rate_game(a["rating"], b["rating"], score, b_fixed=b["kind"] == "random")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def copy_league(league: dict[str, Any]) -> dict[str, Any]:
    """A copy to change: members and counters copied, snapshot tensors shared (frozen)."""
    return {"main": {"rating": dict(league["main"]["rating"]),
                     "played": league["main"]["played"]},
            "members": [{**m, "rating": dict(m["rating"])} for m in league["members"]],
            "exploiters": [{**x, "rating": dict(x["rating"])}
                           for x in league.get("exploiters", [])],
            "weights": dict(league["weights"]), "next_id": league["next_id"]}


def league_table(league: dict[str, Any]) -> list[dict[str, Any]]:
    """The league as rows, best rated first: name, kind, rating, the learning policy's win
    rate against the member (decayed estimate) and games played.

    Examples
    --------
    >>> rows = league_table(new_league(LeagueSettings()))
    >>> [(r["name"], r["games"]) for r in rows]
    [('main', 0), ('random', 0)]
    """
    main = league["main"]
    rows = [{"name": "main", "kind": "learner", "version": None, "mu": main["rating"]["mu"],
             "sigma": main["rating"]["sigma"], "ordinal": ordinal(main["rating"]),
             "main_win_rate": float("nan"), "games": main["played"], "won": 0, "drawn": 0}]
    for x in league.get("exploiters", []):  # learning too: rated by their games with main
        rows.append({"name": x["name"], "kind": "learner", "version": None,
                     "mu": x["rating"]["mu"], "sigma": x["rating"]["sigma"],
                     "ordinal": ordinal(x["rating"]), "main_win_rate": float("nan"),
                     "games": x["played"], "won": x["won"], "drawn": x["drawn"]})
    for m in league["members"]:
        rows.append({"name": m["name"], "kind": m["kind"], "version": m["version"],
                     "mu": m["rating"]["mu"], "sigma": m["rating"]["sigma"],
                     "ordinal": ordinal(m["rating"]),
                     "main_win_rate": estimated_win_rate(m["score"], m["games"]),
                     "games": m["played"], "won": m["won"], "drawn": m["drawn"]})
    return sorted(rows, key=lambda r: -r["ordinal"])
