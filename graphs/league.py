"""A self-play league on a two-player PettingZoo classic game, with a coordinator.

Run: ``daskrl train graphs/league.py --env connect_four_v3 --steps 2000000``, then
``daskrl league RUN`` for the league table.

The learning policy (PPO over legal moves) plays against the league the coordinator keeps:
frozen snapshots of itself every ``--snapshot-every`` iterations and the uniformly random
player, drawn by fictitious self-play (uniformly; ``--pfsp hard`` draws the opponents it
loses to most more often), plus a ``--self-play`` share of games against its latest self. Every game
with a league member is rated with OpenSkill. The coordinator is a role of its own
(``--resources coordinator=...``); its league travels with the run, so checkpoints hold it
and ``--resume`` goes on with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch

from daskrl import Algorithm, Resources, setting
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.ppo import PPOHyper
from daskrl.core.algorithm import EvalRequest
from daskrl.league import LeagueCoordinator, LeagueSettings
from daskrl.league.coordinator import learner_weights
from marl.board_game import (
    GAMES,
    GameShape,
    MaskedActorCritic,
    MaskedPolicy,
    both_seats,
    lookahead_player,
    network_player,
    random_player,
)
from marl.league_actor import GameActor
from marl.league_learner import LeagueLearner, member_names


@dataclass
class Config:
    """League settings; each field is a ``--flag`` of ``daskrl train graphs/league.py``."""

    env: Literal["connect_four_v3", "tictactoe_v3"] = setting(
        "PettingZoo classic two-player game", "connect_four_v3")
    num_actors: int = setting("actor replicas (each plays its own games)", 2)
    num_envs: int = setting("games each actor plays at once (one forward pass per side)", 64)
    num_steps: int = setting("learner moves per game slot per rollout", 8)
    update_epochs: int = setting("passes over each batch", 4)
    num_minibatches: int = setting("minibatches per epoch", 4)
    learning_rate: float = setting("Adam learning rate", 1e-3)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", True)
    gamma: float = setting("discount factor", 0.99)
    gae_lambda: float = setting("GAE lambda", 0.95)
    clip_coef: float = setting("surrogate clipping coefficient", 0.2)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float = setting("value loss coefficient", 0.5)
    max_grad_norm: float = setting("gradient-norm clip", 0.5)
    hidden: int = setting("hidden units (each of the MLP's two layers; the conv torso's one)",
                          128)
    torso: Literal["conv", "mlp"] = setting(
        "the network's torso: convolutions over the board (then one hidden layer), or an MLP "
        "over the flattened planes", "mlp")
    snapshot_every: int = setting("iterations between frozen snapshots of the policy", 10)
    max_snapshots: int = setting("snapshots kept in the league, the main agent's and the "
                                 "exploiters' together (the oldest leaves)", 20)
    self_play: float = setting("share of games against the latest policy itself", 0.2)
    pfsp: Literal["hard", "variance", "uniform"] = setting(
        "weighting of a league member by the main agent's win rate x against it: (1-x)^2 "
        "(PFSP hard), x(1-x) (PFSP variance) or uniform (fictitious self-play; measured "
        "best on Connect Four, benchmarks/league.md)", "uniform")
    slots: int = setting("league opponents sent to the actors each iteration", 4)
    exploiters: int = setting("main exploiters: learners trained only against the main "
                              "agent's latest policy, their snapshots joining the league", 0)
    exploiter_share: float = setting("share of the games that are an exploiter's against the "
                                     "main agent", 0.25)
    rating_share: float = setting("share of the games between two league members (no "
                                  "learner), which rate the members among themselves", 0.1)
    eval_games: int = setting("games from each seat in an evaluation", 50)

    def hyper(self) -> PPOHyper:
        """The PPO update settings."""
        return PPOHyper(update_epochs=self.update_epochs, num_minibatches=self.num_minibatches,
                        learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
                        clip_coef=self.clip_coef, ent_coef=self.ent_coef, vf_coef=self.vf_coef,
                        max_grad_norm=self.max_grad_norm)

    def league(self) -> LeagueSettings:
        """The coordinator's settings."""
        return LeagueSettings(snapshot_every=self.snapshot_every,
                              max_snapshots=self.max_snapshots, self_play=self.self_play,
                              weighting=self.pfsp, slots=self.slots,
                              exploiters=self.exploiters)


def network(config: Config) -> MaskedActorCritic:
    """The policy-value network for the game's board and moves."""
    shape = GameShape.of(config.env)
    return MaskedActorCritic(shape.board, shape.actions, (config.hidden,) * 2, config.torso)


def make_learner(config: Config, seed: int, device: str) -> LeagueLearner:
    """Role ``learner``: PPO for the main agent and each exploiter, on their own moves."""
    def one(member_seed: int) -> ActorCriticLearner:
        return ActorCriticLearner(0, 0, member_seed, (config.hidden,) * 2, config.hyper(),
                                  device, network=partial(network, config))
    return LeagueLearner(member_names(config.exploiters), one, seed)


def make_actor(config: Config, seed: int) -> GameActor:
    """Role ``rollout``: games against the coordinator's picks."""
    return GameActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                     config.gae_lambda, config.torso, config.exploiters, config.exploiter_share,
                     config.rating_share)


def benchmark_player(config: Config, name: str, seed: int) -> Any:
    """The fixed player ``name`` (``lookahead``, Connect Four only, or ``random``)."""
    shape = GameShape.of(config.env)
    if name == "lookahead" and config.env == "connect_four_v3":
        return lookahead_player(shape, seed)
    if name in ("random", "lookahead"):
        return random_player(shape, seed)
    raise ValueError(f"--opponent {name!r} is not known: choose lookahead or random")


def policy_player(config: Config, weights: dict, deterministic: bool, seed: int) -> Any:
    """The trained policy as a player."""
    net = network(config)
    net.load_state_dict(learner_weights(weights))
    return network_player(net, deterministic, seed)


def score_line(seats: dict[str, Any], tag: str) -> dict[str, float]:
    """Win rates from each seat and the mean game result (+1 win, 0 draw, -1 loss)."""
    games = sum(s.games for s in seats.values())
    result = sum(s.wins - s.losses for s in seats.values()) / max(1, games)
    return {f"{tag}_win_rate_first": seats["first"].win_rate,
            f"{tag}_win_rate_second": seats["second"].win_rate, f"{tag}_result": result}


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: the greedy policy against the look-ahead player (Connect Four) or
    the random player, ``eval_games`` games from each seat; ``eval_return_mean`` is the mean
    result."""
    other = "lookahead" if config.env == "connect_four_v3" else "random"
    seats = both_seats(config.env, policy_player(config, weights, True, seed),
                       benchmark_player(config, other, seed + 1), config.eval_games, seed)
    line = score_line(seats, other)
    return {"eval_return_mean": line[f"{other}_result"], **line}


def evaluator(config: Config, weights: dict, request: EvalRequest) -> dict[str, Any]:
    """``daskrl eval``: ``request.episodes`` games from each seat against ``--opponent``
    (``lookahead`` by default on Connect Four, else ``random``)."""
    other = request.opponent or ("lookahead" if config.env == "connect_four_v3" else "random")
    seats = both_seats(config.env, policy_player(config, weights, request.deterministic,
                                                 request.seed),
                       benchmark_player(config, other, request.seed + 1), request.episodes,
                       request.seed)
    line = score_line(seats, other)
    return {"eval_return_mean": line[f"{other}_result"], "opponent": other, **line}


def make_policy(config: Config, weights: dict, deterministic: bool) -> torch.nn.Module:
    """The trained policy alone: flat observations (planes, then mask) in, moves out."""
    net = network(config)
    net.load_state_dict(learner_weights(weights))
    return MaskedPolicy(net, deterministic)


def build(config: Config) -> Algorithm:
    """The league as an :class:`~daskrl.Algorithm` with a coordinator."""
    if config.env not in GAMES:
        raise ValueError(f"--env {config.env!r} is not served: choose {' or '.join(GAMES)}")
    settings = config.league()  # checks the league's settings before any worker starts
    if not 0.0 <= config.rating_share < 1.0:
        raise ValueError(f"--rating-share must be in [0, 1), got {config.rating_share}")
    if not 0.0 <= config.exploiter_share < 1.0:
        raise ValueError(f"--exploiter-share must be in [0, 1), got {config.exploiter_share}")
    if config.eval_games < 1:
        raise ValueError(f"--eval-games must be >= 1, got {config.eval_games}")
    return Algorithm(
        name="league",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config),
        evaluate=partial(evaluate, config),
        make_policy=partial(make_policy, config),
        evaluator=partial(evaluator, config),
        make_coordinator=partial(LeagueCoordinator, settings),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
            "coordinator": Resources(cpu=1),
        },
        capabilities={"resizable-actor"},  # GameActor.resized: fused replicas, single
    )
