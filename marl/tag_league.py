"""A two-team league on batched simple tag: predators and prey both learn (MAPPO), each
against the other team's frozen snapshots, picked by the coordinator
(:class:`daskrl.league.teams.TeamLeagueCoordinator`).

An actor's envs each play one match-up per episode, drawn when the episode starts: with the
league's ``self_play`` share both teams play their latest policies and both learn;
otherwise one team (either, at random) plays its latest policy against one of the other
team's snapshots from its opponent slots (or the uniformly random team), and only the
latest team learns from that env (the batch's ``learn`` mask, which
:class:`marl.mappo_learner.MAPPOLearner` honours). Simple tag's episodes all start together,
so an episode never changes opponents half-way.

Scoring an episode for the ratings: the predators win when they made at least ``goal``
touches, else the prey win. A touch is one predator in contact with the prey for one step
(three predators on the prey for a step are three touches); every predator's return is 10
per touch of the team. Simple tag has no winner of its own; the goal is the league's
choice, stated with its results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from daskrl.league.coordinator import PREFIX, RANDOM, SELF, learner_weights
from marl.mappo_env import EnvSpec, layout_of
from marl.mappo_model import MAPPOModel, ModelSpec, sample
from marl.mappo_rollout import MAPPOActor, RolloutSpec, play_episodes

CATCH_REWARD = 10.0
"""An adversary's reward for each touch of a good agent (simple tag's rules)."""
BOTH = -1
"""The learning-team index of a self-play episode: both teams learn."""


def actor_prefix(team: int) -> str:
    """The prefix of team ``team``'s actor parameters among :class:`MAPPOModel` weights
    (what a snapshot of the team keeps).

    Examples
    --------
    >>> actor_prefix(1)
    'actors.1.'
    """
    return f"actors.{team}."


def predators_score(adversary_return: float, goal: float) -> float:
    """The predators' score of an episode: 1 when their (per-agent) return counts at least
    ``goal`` touches (predator-prey contacts, summed over predators and steps), else 0.

    Examples
    --------
    >>> predators_score(20.0, 2), predators_score(10.0, 2)
    (1.0, 0.0)
    """
    return 1.0 if adversary_return >= goal * CATCH_REWARD - 1e-6 else 0.0


class TagLeagueActor(MAPPOActor):
    """:class:`~marl.mappo_rollout.MAPPOActor` whose envs play the league's match-ups.

    Parameters
    ----------
    env, model, rollout, num_envs, seed, device
        As :class:`~marl.mappo_rollout.MAPPOActor` (``rollout.random_teams`` must be empty:
        the league decides who plays whom).
    goal : float
        Touches that make an episode the predators' win (:func:`predators_score`).

    Examples
    --------
    >>> spec = EnvSpec(max_cycles=5)
    >>> actor = TagLeagueActor(spec, ModelSpec(), RolloutSpec(), 4, seed=0)
    >>> w = MAPPOModel(layout_of(spec), ModelSpec()).state_dict()
    >>> w["league/self_play"] = torch.tensor(0.0)
    >>> w["league/adversary/ids"] = torch.tensor([0])  # predators learn vs the random prey
    >>> w["league/good/ids"] = torch.tensor([0])
    >>> actor.set_weights(w, 0)
    >>> batch = actor.rollout(10)
    >>> batch["learn"].shape, batch["learn"].sum(1).tolist() == [1] * 40  # one team each
    ((40, 2), True)
    >>> sorted({m[0] for m in batch["stats"]["matches"]}) <= ["adversary", "good"]
    True
    """

    def __init__(self, env: EnvSpec, model: ModelSpec, rollout: RolloutSpec, num_envs: int,
                 seed: int, device: str = "auto", goal: float = 2.0) -> None:
        if rollout.random_teams:
            raise ValueError("--random-teams is not served by a league: its opponents are "
                             "the league's (the random team among them)")
        super().__init__(env, model, rollout, num_envs, seed, device)
        self.goal = goal
        self.rng = np.random.default_rng([seed, 17])
        self.slots: dict[int, list[int]] = {}  # learning team -> opponent member ids
        self.snapshots: dict[tuple[int, int], dict[str, Tensor]] = {}
        self.nets: dict[tuple[int, int], MAPPOModel] = {}
        self.self_play = 1.0
        self.learner_team = np.full(num_envs, BOTH)  # per env: who learns (BOTH: both)
        self.opponent = np.full(num_envs, SELF)  # per env: the member id the learner plays
        self.matches: list[tuple[str, int, float]] = []
        self._assigned = False
        # the envs of each (learning team, opponent) match-up and the learn mask, rebuilt
        # only when match-ups change (at episode ends), not at every step
        self._groups: list[tuple[int, int, Tensor]] | None = None
        self._learn = torch.zeros(0)

    def resized(self, num_envs: int, seed: int) -> TagLeagueActor:
        """The same settings with ``num_envs`` envs and ``seed`` (fusion, ``single``)."""
        return TagLeagueActor(self.env_spec, self.model_spec, self.spec, num_envs, seed,
                              self.requested_device, self.goal)

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's weights and the coordinator's opponent slots of each team."""
        if version == self.version:
            return
        super().set_weights(learner_weights(weights), version)
        share = weights.get(f"{PREFIX}self_play")
        self.self_play = float(share) if share is not None else 1.0
        slots: dict[int, list[int]] = {}
        snapshots: dict[tuple[int, int], dict[str, Tensor]] = {}
        for team, name in enumerate(self.layout.names):
            ids = weights.get(f"{PREFIX}{name}/ids")
            slots[team] = [int(i) for i in ids.tolist()] if ids is not None else []
            for slot, ident in enumerate(slots[team]):
                prefix = f"{PREFIX}{name}/{slot}/"
                if ident != RANDOM and (team, ident) not in snapshots:
                    snapshots[team, ident] = {k[len(prefix):]: v for k, v in weights.items()
                                              if k.startswith(prefix)}
        for env in range(self.num_envs):  # episodes going on keep their opponents
            key = (int(self.learner_team[env]), int(self.opponent[env]))
            if key in self.snapshots and key not in snapshots:
                snapshots[key] = self.snapshots[key]
        self.nets = {k: v for k, v in self.nets.items() if k in snapshots}
        self.slots, self.snapshots = slots, snapshots

    def _assign(self, rows: np.ndarray) -> None:
        """Draw the next episode's match-up of each env in ``rows``."""
        for env in rows:
            team = int(self.rng.integers(2))
            if not self.slots.get(team) or self.rng.random() < self.self_play:
                self.learner_team[env], self.opponent[env] = BOTH, SELF
            else:
                picks = self.slots[team]
                self.learner_team[env] = team
                self.opponent[env] = picks[int(self.rng.integers(len(picks)))]
        self._groups = None

    def _match_ups(self, device: torch.device
                   ) -> tuple[list[tuple[int, int, Tensor]], Tensor]:
        """The envs (a tensor on ``device``) of each (learning team, opponent) match-up
        that seats a snapshot or the random team, and the ``[E, 2]`` learn mask."""
        if self._groups is None:
            groups: dict[tuple[int, int], list[int]] = {}
            for env in np.flatnonzero(self.learner_team != BOTH):
                groups.setdefault((int(self.learner_team[env]), int(self.opponent[env])),
                                  []).append(int(env))
            self._groups = [(team, ident, torch.tensor(envs, device=device))
                            for (team, ident), envs in groups.items()]
            learn = np.zeros((self.num_envs, 2), bool)
            learn[self.learner_team == BOTH] = True
            for team in (0, 1):
                learn[self.learner_team == team, team] = True
            self._learn = torch.from_numpy(learn).to(device)
        return self._groups, self._learn

    def _net(self, key: tuple[int, int], device: torch.device) -> MAPPOModel:
        net = self.nets.get(key)
        if net is None:  # a snapshot's policy: the other team's actor, loaded once
            net = MAPPOModel(self.layout, self.model_spec).to(device)
            net.load_state_dict(self.snapshots[key], strict=False)
            self.nets[key] = net
        return net

    def act(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """The latest policies everywhere, then each snapshot's (or the random team's) moves
        for its team in the envs playing it."""
        if not self._assigned:
            self._assign(np.arange(self.num_envs))
            self._assigned = True
        actions, logp = self.model.act(obs, self.generator)
        for team, ident, rows in self._match_ups(obs.device)[0]:
            other = 1 - team
            idx = self.model.agent_index(other)
            if ident == RANDOM or (team, ident) not in self.snapshots:
                logits = torch.zeros(len(rows) * len(idx), self.layout.team_num_actions(other),
                                     device=obs.device)
            else:
                logits = self._net((team, ident), obs.device).logits(obs[rows], other)
            a, lp = sample(logits, self.generator)
            actions[rows[:, None], idx] = a.view(len(rows), -1)
            logp[rows[:, None], idx] = lp.view(len(rows), -1).to(logp.dtype)
        return actions, logp

    def learning(self) -> Tensor:
        """``[E, 2]``: both teams learn in self-play envs, only the latest team elsewhere."""
        return self._match_ups(self.obs.device)[1]

    def episodes_finished(self, rows: Tensor, team_means: Tensor) -> None:
        """Report each finished episode's result to the league; draw the next match-ups."""
        names = self.layout.names
        adversary = names.index("adversary")
        envs = rows.cpu().numpy()
        for env, means in zip(envs, team_means.cpu().tolist(), strict=True):
            score = predators_score(means[adversary], self.goal)  # the predators' score
            team, ident = int(self.learner_team[env]), int(self.opponent[env])
            for t in ((0, 1) if team == BOTH else (team,)):
                own = score if t == adversary else 1.0 - score
                self.matches.append((names[t], SELF if team == BOTH else ident, own))
        self._assign(envs)

    def collect(self, num_steps: int) -> dict[str, Any]:
        """:meth:`MAPPOActor.collect`, its stats with the episodes' ``matches``."""
        batch = super().collect(num_steps)
        batch["stats"]["matches"], self.matches = self.matches, []
        return batch


def matchup_returns(env: EnvSpec, model: ModelSpec, sides: dict[str, dict[str, Tensor] | None],
                    seed: int, episodes: int, deterministic: bool = True
                    ) -> dict[str, np.ndarray]:
    """Per-episode team returns of ``episodes`` fresh episodes with each team playing the
    policy ``sides[team]`` (weights holding that team's actor; None: uniformly random).

    Examples
    --------
    >>> spec = EnvSpec(max_cycles=5)
    >>> w = MAPPOModel(layout_of(spec), ModelSpec()).state_dict()
    >>> out = matchup_returns(spec, ModelSpec(), {"adversary": w, "good": None}, 0, 3)
    >>> {k: v.shape for k, v in out.items()}
    {'adversary': (3,), 'good': (3,)}
    """
    layout = layout_of(env)
    net = MAPPOModel(layout, model)
    merged = dict(net.state_dict())
    random = set()
    for team, name in enumerate(layout.names):
        weights = sides.get(name)
        if weights is None:
            random.add(team)
            continue
        prefix = actor_prefix(team)
        merged.update({k: v for k, v in weights.items() if k.startswith(prefix)})
    net.load_state_dict(merged)
    return play_episodes(env, net, seed, episodes, deterministic, frozenset(random))
