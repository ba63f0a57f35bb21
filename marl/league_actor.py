"""A league's actor: games of a PettingZoo classic game between the learning policy and the
opponents the coordinator picked (:class:`daskrl.league.LeagueCoordinator`).

Each game seats its learning member second with probability ``second_seat`` (0.5: at random;
more favours the seat that starts behind). A main agent's game draws its opponent: the
latest policy itself with the league's ``self_play`` share, else one of the iteration's
opponent slots. With exploiters, an ``exploiter_share`` of the games are an exploiter's
against the main agent's latest policy, and a ``rating_share`` are rating games between two
of the iteration's league members (no learner; only their result counts, for the members'
ratings). A scripted member of the league (``fixed``: Connect Four's look-ahead player) plays
by its own rules. Only the learning member's own moves become transitions (tagged with the
member's index, ``member``); a game's result (+1, 0, -1 from its seat) is the reward of its
last move, and GAE runs over the member's moves of that game. A game still going when a
rollout ends goes on in the next one (its moves keep the log-probabilities of the policy
that made them, which PPO's ratio accounts for).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from daskrl.league.coordinator import MAIN, PREFIX, RANDOM, RATING, SELF, member_weights
from marl.board_game import (
    GameShape,
    flat_observation,
    make_game,
    random_player,
    scripted_player,
)
from marl.board_network import MaskedActorCritic


def game_advantages(values: np.ndarray, reward: float, gamma: float, lam: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """GAE over one finished game's moves: zero reward until the last, which gets
    ``reward``; nothing is bootstrapped after it.

    Examples
    --------
    >>> adv, ret = game_advantages(np.zeros(3, np.float32), 1.0, 1.0, 1.0)
    >>> adv.tolist(), ret.tolist()
    ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    """
    n = len(values)
    adv = np.zeros(n, np.float32)
    last = 0.0
    for t in range(n - 1, -1, -1):
        next_value = values[t + 1] if t + 1 < n else 0.0
        r = reward if t == n - 1 else 0.0
        delta = r + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, adv + values


class GameActor:
    """``num_envs`` games played at once, one batched forward pass per side per move.

    Examples
    --------
    >>> actor = GameActor("tictactoe_v3", 4, seed=0)
    >>> net = MaskedActorCritic((3, 3, 2), 9)
    >>> actor.set_weights(net.state_dict(), 0)
    >>> batch = actor.rollout(4)
    >>> len(batch["obs"]) >= 16, batch["obs"].shape[1], len(batch["stats"]["matches"]) > 0
    (True, 27, True)
    """

    def __init__(self, game: str, num_envs: int, seed: int, hidden: tuple[int, ...] = (128, 128),
                 gamma: float = 0.99, gae_lambda: float = 0.95, torso: str = "mlp",
                 exploiters: int = 0, exploiter_share: float = 0.25,
                 rating_share: float = 0.0, fixed: tuple[str, ...] = (),
                 mirror: bool = False, second_seat: float = 0.5) -> None:
        if not 0.0 <= second_seat <= 1.0:
            raise ValueError(f"second_seat must be a share in [0, 1], got {second_seat}")
        self.game, self.num_envs, self.hidden, self.torso = game, num_envs, hidden, torso
        self.mirror, self.second_seat = mirror, second_seat
        self.fixed = tuple(fixed)
        # the league's scripted members, by their ids (LeagueSettings.fixed's order)
        self.scripted = {RANDOM + 1 + i: scripted_player(game, name, seed + 2 + i)
                         for i, name in enumerate(self.fixed)}
        self.exploiters, self.exploiter_share = exploiters, exploiter_share
        self.rating_share = rating_share
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.shape = GameShape.of(game)
        self.nets = [self._network() for _ in range(1 + exploiters)]  # main, then exploiters
        self.net = self.nets[0]
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.random = random_player(self.shape, seed + 1)
        self.version = -1
        self.slots: list[int] = []
        self.self_play = 1.0
        self.opponents: dict[int, MaskedActorCritic] = {}
        self.envs = [make_game(game) for _ in range(num_envs)]
        self.seat: list[str] = [""] * num_envs
        self.member = [0] * num_envs  # whose game: 0 the main agent, 1 + i exploiter i
        self.rated = [RANDOM] * num_envs  # a rating game's member in the ``seat`` seat
        self.against: list[int] = [SELF] * num_envs
        self.moves: list[list[tuple[np.ndarray, int, float, float]]] = [[] for _ in self.envs]
        self.plies = [0] * num_envs
        self._started = False

    def _network(self) -> MaskedActorCritic:
        return MaskedActorCritic(self.shape.board, self.shape.actions, self.hidden, self.torso,
                                 mirror=self.shape.mirror if self.mirror else None,
                                 cells=self.shape.cells)

    def resized(self, num_envs: int, seed: int) -> GameActor:
        """A copy playing ``num_envs`` games (fused replicas, ``single``)."""
        return GameActor(self.game, num_envs, seed, self.hidden, self.gamma, self.gae_lambda,
                         self.torso, self.exploiters, self.exploiter_share, self.rating_share,
                         self.fixed, self.mirror, self.second_seat)

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Load the learner's weights and the coordinator's opponent slots."""
        if version == self.version:
            return
        for index, net in enumerate(self.nets):
            net.load_state_dict(member_weights(weights, "main" if index == 0
                                               else f"exploiter{index - 1}"))
        ids = weights.get(f"{PREFIX}ids")
        self.slots = [int(i) for i in ids.tolist()] if ids is not None else []
        share = weights.get(f"{PREFIX}self_play")
        self.self_play = float(share) if share is not None else 1.0
        wanted: dict[int, MaskedActorCritic] = {}
        for slot, ident in enumerate(self.slots):
            if ident == RANDOM or ident in self.scripted or ident in wanted:
                continue
            net = self.opponents.get(ident)
            if net is None:  # snapshots are frozen: load each once
                prefix = f"{PREFIX}{slot}/"
                net = self._network()
                net.load_state_dict({k[len(prefix):]: v for k, v in weights.items()
                                     if k.startswith(prefix)})
            wanted[ident] = net
        if self._started:  # games going on keep their opponents (pairs of a rating game too)
            for ident in {*self.against, *self.rated}:
                if ident in self.opponents and ident not in wanted:
                    wanted[ident] = self.opponents[ident]
        self.opponents = wanted
        self.version = version

    def _seat_index(self) -> int:
        """The seat of a new game's member: 1 (second) with probability ``second_seat``."""
        if self.second_seat == 0.5:  # the draw runs made before the setting existed used
            return int(self.rng.integers(2))
        return int(self.rng.random() < self.second_seat)

    def _new_game(self, i: int) -> None:
        env = self.envs[i]
        env.reset(seed=int(self.rng.integers(2**31)))
        self.seat[i] = env.possible_agents[self._seat_index()]
        self.member[i] = 0
        members = sorted(set(self.slots))
        if len(members) >= 2 and self.rng.random() < self.rating_share:
            a, b = self.rng.choice(members, 2, replace=False)
            self.member[i], self.rated[i], self.against[i] = RATING, int(a), int(b)
        elif self.exploiters and self.rng.random() < self.exploiter_share:
            self.member[i] = 1 + int(self.rng.integers(self.exploiters))
            self.against[i] = MAIN
        elif not self.slots or self.rng.random() < self.self_play:
            self.against[i] = SELF
        else:
            self.against[i] = self.slots[int(self.rng.integers(len(self.slots)))]
        self.moves[i] = []
        self.plies[i] = 0

    def _opponent_moves(self, who: int, obs: np.ndarray) -> np.ndarray:
        if who in (SELF, MAIN):
            return self.net.act(obs, self.generator)[0].numpy()
        if who in self.scripted:
            return self.scripted[who](obs)
        net = self.opponents.get(who)
        if net is None:  # the random player (or a member whose weights did not come)
            return self.random(obs)
        return net.act(obs, self.generator)[0].numpy()

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Play until ``num_steps * num_envs`` of the learner's moves from finished games are
        collected; return them (with GAE) and the games' outcomes."""
        t_start = time.time()
        if not self._started:
            for i in range(self.num_envs):
                self._new_game(i)
            self._started = True
        target = num_steps * self.num_envs
        out: list[tuple[np.ndarray, ...]] = []
        collected = 0
        matches: list[tuple[Any, ...]] = []
        returns: list[float] = []
        lengths: list[int] = []
        exploiter_returns: list[float] = []
        inference_s = env_s = 0.0
        while collected < target:
            groups: dict[tuple[str, int], list[int]] = {}
            for i, env in enumerate(self.envs):
                if env.agent_selection != self.seat[i]:
                    mover = ("opponent", self.against[i])
                elif self.member[i] == RATING:
                    mover = ("opponent", self.rated[i])
                else:
                    mover = ("learner", self.member[i])
                groups.setdefault(mover, []).append(i)
            for (side, who), idx in groups.items():
                t0 = time.perf_counter()
                obs = np.stack([flat_observation(self.envs[i].observe(
                    self.envs[i].agent_selection)) for i in idx])
                if side == "learner":
                    actions, logp, values = self.nets[who].act(obs, self.generator)
                    actions = actions.numpy()
                    for j, i in enumerate(idx):
                        self.moves[i].append((obs[j], int(actions[j]), float(logp[j]),
                                              float(values[j])))
                else:
                    actions = self._opponent_moves(who, obs)
                t1 = time.perf_counter()
                for i, a in zip(idx, actions, strict=True):
                    self.envs[i].step(int(a))
                    self.plies[i] += 1
                env_s += time.perf_counter() - t1
                inference_s += t1 - t0
            for i, env in enumerate(self.envs):
                if not all(env.terminations.values()) and not all(env.truncations.values()):
                    continue
                reward = float(env.rewards[self.seat[i]])
                if self.member[i] == RATING:  # two league members: only its result counts
                    matches.append((RATING, self.rated[i], self.against[i],
                                    0.5 + 0.5 * float(np.sign(reward))))
                    self._new_game(i)
                    continue
                moves = self.moves[i]
                if moves:
                    values = np.array([m[3] for m in moves], np.float32)
                    adv, ret = game_advantages(values, reward, self.gamma, self.gae_lambda)
                    out.append((np.stack([m[0] for m in moves]),
                                np.array([m[1] for m in moves], np.int64),
                                np.array([m[2] for m in moves], np.float32), values, adv, ret,
                                np.full(len(moves), self.member[i], np.int64)))
                    collected += len(moves)
                matches.append((self.member[i], self.against[i],
                                0.5 + 0.5 * float(np.sign(reward))))
                if self.member[i] == 0:  # the run's returns are the main agent's
                    returns.append(reward)
                    lengths.append(self.plies[i])
                else:
                    exploiter_returns.append(reward)
                self._new_game(i)
        obs, actions, logp, values, adv, ret, member = (
            np.concatenate(parts) for parts in zip(*out, strict=True))
        return {
            "obs": obs, "actions": actions, "logp": logp, "values": values,
            "advantages": adv, "returns": ret, "member": member,
            "stats": {"env_steps": len(obs), "rollout_steps": int(sum(lengths)),
                      "episode_returns": returns, "episode_lengths": lengths,
                      "matches": matches, "t_start": t_start, "t_end": time.time(),
                      "inference_s": inference_s, "env_s": env_s,
                      "policy_version": self.version,
                      **({"team_returns": {"exploiters": exploiter_returns}}
                         if self.exploiters else {})},
        }

    def close(self) -> None:
        """Close the games."""
        for env in self.envs:
            env.close()
