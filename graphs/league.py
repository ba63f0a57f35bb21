"""A self-play league on a two-player PettingZoo classic game, or on simple tag with both
teams learning, with a coordinator.

Run: ``daskrl train graphs/league.py --env connect_four_v3 --steps 2000000``, then
``daskrl league RUN`` for the league table.

The learning policy (PPO over legal moves) plays against the league the coordinator keeps:
frozen snapshots of itself every ``--snapshot-every`` iterations, the uniformly random
player and the game's scripted players (``--fixed-players``; Connect Four's look-ahead
player), drawn by prioritised fictitious self-play (``--pfsp hard``: the opponents it loses
to most come most often), plus a ``--self-play`` share of games against its latest self.
Every game with a league member is rated with OpenSkill. The coordinator is a role of its own
(``--resources coordinator=...``); its league travels with the run, so checkpoints hold it
and ``--resume`` goes on with it.

``--env simple_tag``: predators and prey both learn (MAPPO on the batched simple tag), each
against the other team's snapshots (:mod:`marl.tag_league`,
:class:`daskrl.league.teams.TeamLeagueCoordinator`); an episode is the predators' win when
they touch the prey ``--goal`` times.
"""

from __future__ import annotations

import dataclasses
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
from daskrl.league.teams import TeamLeagueCoordinator
from marl.board_game import (
    GAMES,
    SCRIPTED,
    GameShape,
    both_seats,
    lookahead_player,
    random_player,
    scripted_player,
)
from marl.board_network import MaskedActorCritic, MaskedPolicy, network_player
from marl.league_actor import GameActor
from marl.league_learner import LeagueLearner, member_names
from marl.mappo import (
    EnvSpec,
    MAPPOHyper,
    MAPPOLearner,
    MAPPOModel,
    MAPPOPolicy,
    ModelSpec,
    RolloutSpec,
    evaluate_teams,
    layout_of,
)
from marl.tag_league import TagLeagueActor, actor_prefix

TAG = "simple_tag"
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "games": {"num_envs": 64, "num_steps": 8, "update_epochs": 4, "num_minibatches": 4,
              "learning_rate": 1e-3, "anneal_lr": True, "vf_coef": 0.5, "max_grad_norm": 0.5,
              "hidden": 128, "gamma": 0.9},
    TAG: {"num_envs": 128, "num_steps": 25, "update_epochs": 10, "num_minibatches": 1,
          "learning_rate": 7e-4, "anneal_lr": False, "vf_coef": 1.0, "max_grad_norm": 10.0,
          "hidden": 64, "gamma": 0.99},
}
"""The settings that differ by env: the board games' PPO, and MAPPO's on simple tag (as
``graphs/mappo.py``); ``Config.resolved`` fills the unset ones from here."""


@dataclass
class Config:
    """League settings; each field is a ``--flag`` of ``daskrl train graphs/league.py``."""

    env: Literal["connect_four_v3", "tictactoe_v3", "simple_tag"] = setting(
        "PettingZoo classic two-player game, or simple_tag (both teams learning)",
        "connect_four_v3")
    num_actors: int = setting("actor replicas (each plays its own games)", 2)
    # The settings below that default to None take the env's own (ENV_DEFAULTS): the board
    # games' PPO, or MAPPO's on simple tag (graphs/mappo.py's; measured in
    # benchmarks/league.md).
    num_envs: int | None = setting("games each actor plays at once (one forward pass per "
                                   "side; simple tag: envs); default 64, simple tag 128", None)
    num_steps: int | None = setting("learner moves per game slot per rollout (simple tag: "
                                    "steps per env); default 8, simple tag 25", None)
    update_epochs: int | None = setting("passes over each batch; default 4, simple tag 10",
                                        None)
    num_minibatches: int | None = setting("minibatches per epoch; default 4, simple tag 1",
                                          None)
    learning_rate: float | None = setting("Adam learning rate; default 1e-3, simple tag 7e-4",
                                          None)
    anneal_lr: bool | None = setting("anneal the learning rate linearly to 0; default True, "
                                     "simple tag False", None)
    gamma: float | None = setting("discount factor; default 0.9 (a win now is worth clearly "
                                  "more than one later: tactics), simple tag 0.99", None)
    gae_lambda: float = setting("GAE lambda", 0.95)
    clip_coef: float = setting("surrogate clipping coefficient", 0.2)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float | None = setting("value loss coefficient; default 0.5, simple tag 1.0", None)
    max_grad_norm: float | None = setting("gradient-norm clip (simple tag: of each team's "
                                          "actor and critic); default 0.5, simple tag 10", None)
    hidden: int | None = setting("hidden units (each of the MLP's two layers; the conv "
                                 "torso's one; the fcn torso's critic MLP's two); default 128, "
                                 "simple tag 64", None)
    torso: Literal["conv", "fcn", "mlp"] = setting(
        "the network's torso: an MLP over the flattened planes (mlp); convolutions over the "
        "board, then one hidden layer (conv); or convolutions to a score per board cell, a "
        "move scored by its empty cells, the value from an MLP (fcn: it learns Connect Four's "
        "tactics from labelled positions far better, but in the league it has trained worse "
        "than mlp so far: benchmarks/league.md)", "mlp")
    mirror: bool = setting(
        "board games: a network symmetric under the board's left-right mirror (logits and value "
        "averaged over the position and its mirror image)", False)
    second_seat: float = setting(
        "board games: share of the games in which the league's member plays second (0.5: "
        "seated at random; more gives the second seat, which starts behind, more of the "
        "training games)", 0.5)
    snapshot_every: int = setting("iterations between frozen snapshots of the policy", 10)
    max_snapshots: int = setting("snapshots kept in the league, the main agent's and the "
                                 "exploiters' together (the oldest leaves)", 20)
    self_play: float = setting("share of games against the latest policy itself", 0.2)
    pfsp: Literal["hard", "variance", "uniform"] = setting(
        "weighting of a league member by the main agent's win rate x against it: (1-x)^2 "
        "(PFSP hard: the members it loses to, the scripted ones among them, most often), "
        "x(1-x) (PFSP variance) or uniform (fictitious self-play); benchmarks/league.md "
        "compares them on Connect Four", "hard")
    fixed_players: str = setting(
        "comma-separated scripted players kept in the league beside the random player, or "
        "none; auto: the game's own (connect_four_v3: lookahead, which wins when it can and "
        "blocks when it must; tictactoe_v3 and simple_tag: none)", "auto")
    slots: int = setting("league opponents sent to the actors each iteration", 4)
    exploiters: int = setting("main exploiters (board games): learners trained only against "
                              "the main agent's latest policy, their snapshots joining the "
                              "league", 0)
    exploiter_share: float = setting("share of the games that are an exploiter's against the "
                                     "main agent", 0.25)
    rating_share: float = setting("share of the games between two league members (no "
                                  "learner), which rate the members among themselves (board "
                                  "games)", 0.1)
    eval_games: int = setting("games from each seat in an evaluation (simple tag: episodes)",
                              50)
    goal: float = setting("simple tag: touches (one predator on the prey for one step) that "
                          "make an episode the predators' win (the league's score)", 2.0)
    num_good: int = setting("simple tag: good agents (prey)", 1)
    num_adversaries: int = setting("simple tag: adversaries (predators)", 3)

    def resolved(self) -> Config:
        """These settings with every unset one (None) taken from :data:`ENV_DEFAULTS`.

        Examples
        --------
        >>> Config(env="simple_tag").resolved().num_envs, Config().resolved().num_envs
        (128, 64)
        """
        defaults = ENV_DEFAULTS[TAG if self.env == TAG else "games"]
        return dataclasses.replace(self, **{k: v for k, v in defaults.items()
                                            if getattr(self, k) is None})

    def hyper(self) -> PPOHyper:
        """The PPO update settings."""
        return PPOHyper(update_epochs=self.update_epochs, num_minibatches=self.num_minibatches,
                        learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
                        clip_coef=self.clip_coef, ent_coef=self.ent_coef, vf_coef=self.vf_coef,
                        max_grad_norm=self.max_grad_norm)

    def fixed(self) -> tuple[str, ...]:
        """The ``--fixed-players``, checked against the game's scripted players."""
        names = self.fixed_players.strip()
        if names == "auto":
            return SCRIPTED.get(self.env, ())
        chosen = tuple(n.strip() for n in names.split(",") if n.strip() not in ("", "none"))
        if chosen and self.env == TAG:
            raise ValueError(f"--fixed-players {names}: simple tag has no scripted players; "
                             "use auto or none")
        for name in chosen:
            if name == "random":
                raise ValueError("--fixed-players random: the random player is always in the "
                                 "league; name only the others")
            scripted_player(self.env, name)  # raises, naming the game's players
        return chosen

    def league(self) -> LeagueSettings:
        """The coordinator's settings."""
        return LeagueSettings(snapshot_every=self.snapshot_every,
                              max_snapshots=self.max_snapshots, self_play=self.self_play,
                              weighting=self.pfsp, slots=self.slots,
                              exploiters=self.exploiters, fixed=self.fixed())


def network(config: Config) -> MaskedActorCritic:
    """The policy-value network for the game's board and moves."""
    shape = GameShape.of(config.env)
    return MaskedActorCritic(shape.board, shape.actions, (config.hidden,) * 2, config.torso,
                             mirror=shape.mirror if config.mirror else None, cells=shape.cells)


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
                     config.rating_share, config.fixed(), config.mirror, config.second_seat)


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


def tag_env(config: Config) -> EnvSpec:
    """Simple tag's settings."""
    return EnvSpec(TAG, num_good=config.num_good, num_adversaries=config.num_adversaries)


def tag_model(config: Config) -> ModelSpec:
    """The teams' actors and central critics."""
    return ModelSpec(hidden=(config.hidden,) * 2)


def tag_weights(weights: dict) -> dict:
    """Both teams' networks, without the league's picks."""
    return learner_weights(weights)


def tag_actor(config: Config, seed: int) -> TagLeagueActor:
    """Role ``rollout`` on simple tag: envs playing the league's match-ups."""
    return TagLeagueActor(tag_env(config), tag_model(config),
                          RolloutSpec(config.gamma, config.gae_lambda), config.num_envs, seed,
                          goal=config.goal)


def tag_evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate`` on simple tag: the teams as trained, each against a random team, and
    both random, ``eval_games`` episodes each (:func:`marl.mappo.evaluate_teams`)."""
    return evaluate_teams(tag_env(config), tag_model(config), tag_weights(weights), seed,
                          config.eval_games)


def tag_evaluator(config: Config, weights: dict, request: EvalRequest) -> dict[str, Any]:
    """``daskrl eval`` on simple tag: :func:`marl.mappo.evaluate_teams` with the request's
    episodes, seed and mode (``--opponent random``: each team against a random one)."""
    return evaluate_teams(tag_env(config), tag_model(config), tag_weights(weights),
                          request.seed, request.episodes, request.deterministic,
                          opponent=request.opponent)


def tag_policy(config: Config, weights: dict, deterministic: bool) -> torch.nn.Module:
    """Both teams' trained actors as one module (:class:`marl.mappo.MAPPOPolicy`)."""
    model = MAPPOModel(layout_of(tag_env(config)), tag_model(config))
    model.load_state_dict(tag_weights(weights))
    return MAPPOPolicy(model, deterministic).eval()


def build_tag(config: Config) -> Algorithm:
    """Simple tag with both teams learning, each against the other's snapshots."""
    if config.torso != "mlp":
        raise ValueError(f"--torso {config.torso} is for board games: simple tag's networks "
                         "are MLPs; drop --torso")
    if config.mirror:
        raise ValueError("--mirror is for board games: simple tag's teams have no mirror "
                         "move map; drop --mirror")
    if config.second_seat != 0.5:
        raise ValueError("--second-seat is for board games: simple tag's teams play at once, "
                         "not in turns; drop --second-seat")
    if config.goal <= 0:
        raise ValueError(f"--goal must be > 0 touches, got {config.goal}")
    if config.eval_games < 1:
        raise ValueError(f"--eval-games must be >= 1, got {config.eval_games}")
    layout = layout_of(tag_env(config))
    model = tag_model(config)
    hyper = MAPPOHyper(update_epochs=config.update_epochs,
                       num_minibatches=config.num_minibatches,
                       learning_rate=config.learning_rate, anneal_lr=config.anneal_lr,
                       clip_coef=config.clip_coef, ent_coef=config.ent_coef,
                       vf_coef=config.vf_coef, max_grad_norm=config.max_grad_norm)
    teams = {name: actor_prefix(t) for t, name in enumerate(layout.names)}
    TeamLeagueCoordinator(config.league(), teams)  # refuses exploiters before any worker
    return league_algorithm(
        config,
        make_actor=partial(tag_actor, config),
        make_learner=partial(MAPPOLearner, layout, model, hyper),
        evaluate=partial(tag_evaluate, config),
        make_policy=partial(tag_policy, config),
        evaluator=partial(tag_evaluator, config),
        make_coordinator=partial(TeamLeagueCoordinator, config.league(), teams))


def league_algorithm(config: Config, **roles: Any) -> Algorithm:
    """The league's :class:`~daskrl.Algorithm` from its ``roles`` (actor, learner,
    coordinator, evaluation, policy): one iteration's size and where each role runs are the
    same for every game."""
    return Algorithm(
        name="league",
        **roles,
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
            "coordinator": Resources(cpu=1),
        },
        # GameActor and TagLeagueActor resize (fused replicas, single)
        capabilities={"resizable-actor"},
    )


def build(config: Config) -> Algorithm:
    """The league as an :class:`~daskrl.Algorithm` with a coordinator."""
    config = config.resolved()
    if config.env == TAG:
        return build_tag(config)
    if config.env not in GAMES:
        raise ValueError(f"--env {config.env!r} is not served: choose {' or '.join(GAMES)}")
    settings = config.league()  # checks the league's settings before any worker starts
    if not 0.0 <= config.rating_share < 1.0:
        raise ValueError(f"--rating-share must be in [0, 1), got {config.rating_share}")
    if not 0.0 <= config.exploiter_share < 1.0:
        raise ValueError(f"--exploiter-share must be in [0, 1), got {config.exploiter_share}")
    if not 0.0 <= config.second_seat <= 1.0:
        raise ValueError(f"--second-seat must be a share in [0, 1], got {config.second_seat}")
    if config.eval_games < 1:
        raise ValueError(f"--eval-games must be >= 1, got {config.eval_games}")
    return league_algorithm(
        config,
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config),
        evaluate=partial(evaluate, config),
        make_policy=partial(make_policy, config),
        evaluator=partial(evaluator, config),
        make_coordinator=partial(LeagueCoordinator, settings))
