"""The self-play league: PFSP match-making, OpenSkill ratings, snapshots, the games' actor, the
Connect Four look-ahead player against PettingZoo's own rules, and league runs on real Dask
workers (the coordinator placed on its own worker, resumed with its league, learning)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client, get_task_stream

import daskrl
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.ppo import PPOHyper
from daskrl.core.algorithm import LearnerOutput
from daskrl.core.script import load_graph
from daskrl.distributions import Unsupported, get_distribution
from daskrl.league.coordinator import (
    MAIN,
    RANDOM,
    RATING,
    SELF,
    LeagueCoordinator,
    LeagueSettings,
    new_league,
)
from daskrl.league.pfsp import pfsp_probabilities
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend
from marl.board_game import (
    GameShape,
    both_seats,
    flat_observation,
    lookahead_player,
    make_game,
    random_player,
    winning_moves,
)
from marl.board_network import MaskedActorCritic
from marl.league_actor import GameActor
from marl.league_learner import LeagueLearner, member_names

ROOT = Path(__file__).resolve().parents[1]
GRAPH = str(ROOT / "graphs" / "league.py")
SMALL = {"env": "tictactoe_v3", "num_actors": 2, "num_envs": 8, "num_steps": 8,
         "snapshot_every": 2, "eval_games": 10}


def _league_with(rates: list[float], settings: LeagueSettings) -> dict:
    """A league whose members the learner beats at exactly ``rates`` (a long history)."""
    league = new_league(settings)
    coordinator = LeagueCoordinator(settings)
    for version in range(len(rates) - 1):
        coordinator.snapshot(league, {"w": torch.zeros(1)}, version)
    for member, rate in zip(league["members"], rates, strict=True):
        member["games"], member["score"] = 1e6, rate * 1e6
    return league


def test_match_making_follows_pfsp_for_fixed_win_rates():
    rates = [0.95, 0.7, 0.4, 0.1]  # the random player, then three snapshots
    settings = LeagueSettings(slots=8)
    coordinator = LeagueCoordinator(settings)
    league = _league_with(rates, settings)
    counts: Counter[int] = Counter()
    rng = np.random.default_rng(0)
    for _ in range(4000):
        counts.update(m["id"] for m in coordinator.pick(league, rng))
    ids = [m["id"] for m in league["members"]]
    seen = np.array([counts[i] for i in ids]) / sum(counts.values())
    want = (1 - np.array(rates)) ** 2 / ((1 - np.array(rates)) ** 2).sum()
    assert np.abs(seen - want).max() < 0.01, (seen, want)
    # the opponent the learner loses to most is drawn most, the one it beats least
    assert seen.argmax() == 3 and seen.argmin() == 0


def test_pfsp_weightings_and_refusal():
    assert pfsp_probabilities([0.5, 0.5], "variance").tolist() == [0.5, 0.5]
    assert pfsp_probabilities([0.1, 0.9], "uniform").tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="weighting 'elo' is not known"):
        pfsp_probabilities([0.5], "elo")  # type: ignore[arg-type]


def test_games_are_rated_and_the_random_anchor_stays():
    settings = LeagueSettings(snapshot_every=1)
    out = LearnerOutput(0, {}, {"w": torch.zeros(2)}, {})
    coordinator = LeagueCoordinator(settings)
    first = coordinator.coordinate(out, -1)  # snapshot v0 joins
    snap = next(m for m in first.coordinator["members"] if m["kind"] == "snapshot")
    games = [(snap["id"], 1.0)] * 20 + [(RANDOM, 1.0)] * 5 + [(SELF, 0.0)] * 7
    after = coordinator.coordinate(LearnerOutput(
        1, {}, {"w": torch.ones(2)}, {"matches": games}, coordinator=first.coordinator), 0)
    league = after.coordinator
    main, members = league["main"], {m["name"]: m for m in league["members"]}
    assert main["rating"]["mu"] > members["v0"]["rating"]["mu"] + 5  # 20 wins against v0
    assert members["random"]["rating"] == first.coordinator["members"][0]["rating"]  # anchor
    assert members["v0"]["played"] == 20 and members["v0"]["won"] == 0
    assert after.metrics["league/games"] == 25 and after.metrics["league/self_games"] == 7
    assert after.metrics["league/win_rate"] == 1.0 and "matches" not in after.metrics
    assert members["v1"]["rating"] == main["rating"]  # a new snapshot is rated as main is
    # the earlier league is left as it was (the coordinator works on a copy)
    assert first.coordinator["main"]["played"] == 0
    # an iteration without games against v0: its counts decay, its rating stays
    quiet = coordinator.coordinate(LearnerOutput(
        2, {}, {"w": torch.ones(2)}, {"matches": []}, coordinator=league), 1).coordinator
    v0 = next(m for m in quiet["members"] if m["name"] == "v0")
    assert v0["games"] == pytest.approx(20 * settings.decay)
    assert v0["rating"] == members["v0"]["rating"]


def test_snapshots_every_k_iterations_and_the_oldest_leaves():
    settings = LeagueSettings(snapshot_every=3, max_snapshots=2)
    coordinator = LeagueCoordinator(settings)
    state: dict = {}
    for version in range(10):
        out = coordinator.coordinate(
            LearnerOutput(version, {}, {"w": torch.full((1,), float(version))}, {},
                          coordinator=state), version - 1)
        state = out.coordinator
    names = [m["name"] for m in state["members"]]
    assert names == ["random", "v6", "v9"]
    assert sorted(float(w["w"]) for w in state["weights"].values()) == [6.0, 9.0]
    # the picks ride in the weights: every slot's member id and, for snapshots, its weights
    ids = out.weights["league/ids"].tolist()
    assert len(ids) == settings.slots and set(ids) <= {m["id"] for m in state["members"]}
    for slot, ident in enumerate(ids):
        has = f"league/{slot}/w" in out.weights
        assert has == (ident != RANDOM)


def test_lookahead_sees_the_wins_pettingzoo_scores():
    """For positions of random games, a column is a winning move by the look-ahead's rules
    exactly when PettingZoo's env ends the game with the mover winning."""
    rng = np.random.default_rng(3)
    checked = wins_found = 0
    for game in range(60):
        env = make_game("connect_four_v3")
        env.reset(seed=game)
        history: list[int] = []
        while not all(env.terminations.values()):
            agent = env.agent_selection
            obs = env.observe(agent)
            planes = obs["observation"].astype(np.float32)
            predicted = set(winning_moves(planes[:, :, 0], planes[:, :, 1]))
            for col in np.flatnonzero(obs["action_mask"]):
                trial = make_game("connect_four_v3")  # the position again, then the move
                trial.reset(seed=game)
                for move in [*history, int(col)]:
                    trial.step(move)
                scored = all(trial.terminations.values()) and trial.rewards[agent] == 1
                assert (int(col) in predicted) == scored, (game, col, planes.sum(-1))
                checked += 1
                wins_found += scored
            history.append(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            env.step(history[-1])
    assert checked > 1000 and wins_found > 20


def test_lookahead_beats_random_and_blocks():
    shape = GameShape.of("connect_four_v3")
    seats = both_seats("connect_four_v3", lookahead_player(shape, 1), random_player(shape, 2),
                       100)
    assert seats["first"].win_rate > 0.8 and seats["second"].win_rate > 0.7
    env = make_game("connect_four_v3")
    env.reset(seed=0)
    for col in (0, 6, 0, 6, 0):  # player_0 threatens column 0; player_1 must block
        env.step(col)
    obs = flat_observation(env.observe(env.agent_selection))[None]
    assert lookahead_player(shape, 0)(obs).tolist() == [0]


@pytest.mark.parametrize("game", ["connect_four_v3", "tictactoe_v3"])
def test_the_mirror_map_is_the_games_own_and_the_symmetric_network_keeps_it(game: str):
    """Playing each move's mirror (``GameShape.mirror``) gives, at every ply, the mirror image
    of the position (planes flipped left to right, the mask permuted) and the same ending;
    the network built with the map gives mirrored positions the mirrored move probabilities
    and the same value, where one built without it does not."""
    shape = GameShape.of(game)
    mirror = np.array(shape.mirror)
    rng = np.random.default_rng(0)
    pairs = []
    for seed in range(20):
        env, flipped = make_game(game), make_game(game)
        env.reset(seed=seed)
        flipped.reset(seed=seed)
        while not all(env.terminations.values()):
            obs = env.observe(env.agent_selection)
            other = flipped.observe(flipped.agent_selection)
            np.testing.assert_array_equal(other["observation"], obs["observation"][:, ::-1])
            np.testing.assert_array_equal(other["action_mask"], obs["action_mask"][mirror])
            pairs.append((flat_observation(obs), flat_observation(other)))
            move = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            env.step(move)
            flipped.step(int(mirror[move]))
        assert all(flipped.terminations.values()) and flipped.rewards == env.rewards
    x = torch.as_tensor(np.stack([a for a, _ in pairs]))
    x_mirrored = torch.as_tensor(np.stack([b for _, b in pairs]))
    torch.manual_seed(0)
    for torso in ("mlp", "conv", "fcn"):
        sym = MaskedActorCritic(shape.board, shape.actions, (32, 32), torso, mirror=shape.mirror,
                                cells=shape.cells)
        probs = torch.softmax(sym.logits(x), -1)
        torch.testing.assert_close(torch.softmax(sym.logits(x_mirrored), -1), probs[:, mirror])
        torch.testing.assert_close(sym.value(x_mirrored), sym.value(x))
    plain = MaskedActorCritic(shape.board, shape.actions, (32, 32))
    assert not torch.allclose(plain.value(x_mirrored), plain.value(x), atol=1e-4)
    with pytest.raises(ValueError, match="not a permutation"):
        MaskedActorCritic(shape.board, shape.actions, mirror=(0,) * shape.actions)


def test_the_actor_plays_the_coordinators_picks():
    actor = GameActor("connect_four_v3", 8, seed=0, hidden=(16, 16))
    net = MaskedActorCritic((6, 7, 2), 7, (16, 16))
    weights = dict(net.state_dict())
    snapshot = MaskedActorCritic((6, 7, 2), 7, (16, 16)).state_dict()
    weights.update({f"league/1/{k}": v for k, v in snapshot.items()})
    weights["league/ids"] = torch.tensor([RANDOM, 5])
    weights["league/self_play"] = torch.tensor(0.0)
    actor.set_weights(weights, 1)
    assert set(actor.opponents) == {5}
    batch = actor.rollout(8)
    ids = {m[1] for m in batch["stats"]["matches"]}
    assert ids <= {RANDOM, 5} and len(ids) == 2
    assert {m[0] for m in batch["stats"]["matches"]} == {0}  # the main agent's games
    assert len(batch["obs"]) == batch["stats"]["env_steps"] >= 64
    results = batch["stats"]["episode_returns"]
    assert [0.5 + 0.5 * np.sign(r) for r in results] == [m[2] for m in batch["stats"]["matches"]]
    # every learner move recorded is legal under its own mask
    legal = batch["obs"][np.arange(len(batch["obs"])), 84 + batch["actions"]]
    assert (legal == 1).all()
    weights["league/self_play"] = torch.tensor(1.0)
    weights["league/ids"] = torch.tensor([RANDOM])
    for key in [k for k in weights if k.startswith("league/1/")]:
        del weights[key]
    actor.set_weights(weights, 2)
    # snapshot 5 is no longer picked, but games against it go on: it keeps playing them
    # (not the random player in its place)
    going = {actor.against[i] for i in range(actor.num_envs)}
    assert 5 in going and set(actor.opponents) == {5}
    actor.rollout(40)  # 80+ moves of every game: the games begun before the change end
    later = actor.rollout(8)["stats"]["matches"]
    assert later and {m[1] for m in later} == {SELF}
    actor.set_weights(weights, 3)
    assert actor.opponents == {}  # no game uses snapshot 5 any more: its net is let go


def test_scripted_members_stay_in_the_league_and_play_by_their_rules():
    settings = LeagueSettings(snapshot_every=1, max_snapshots=2, fixed=("lookahead",))
    coordinator = LeagueCoordinator(settings)
    league = new_league(settings)
    for version in range(4):
        coordinator.snapshot(league, {"w": torch.zeros(1)}, version)
    assert [(m["id"], m["name"]) for m in league["members"]] == [
        (RANDOM, "random"), (1, "lookahead"), (4, "v2"), (5, "v3")]
    out = LearnerOutput(0, {}, {"w": torch.zeros(1)}, {}, coordinator=league)
    with pytest.raises(ValueError, match="--fixed-players lookahead"):
        LeagueCoordinator(LeagueSettings()).start(out)

    def score(opponent: int) -> float:
        actor = GameActor("connect_four_v3", 64, seed=0, hidden=(16, 16), fixed=("lookahead",))
        weights = dict(MaskedActorCritic((6, 7, 2), 7, (16, 16)).state_dict())
        weights["league/ids"] = torch.tensor([opponent])
        weights["league/self_play"] = torch.tensor(0.0)
        actor.set_weights(weights, 0)
        matches = actor.rollout(24)["stats"]["matches"]
        assert {m[1] for m in matches} == {opponent} and len(matches) > 100
        return float(np.mean([m[2] for m in matches]))
    # an untrained policy wins about half its games against the random player, and few
    # against the look-ahead player, which takes every win and blocks every threat
    assert score(RANDOM) > 0.35 and score(1) < 0.2


def test_fixed_players_are_checked_against_the_game():
    graph = load_graph(GRAPH)
    assert graph.Config().fixed() == ("lookahead",)  # connect_four_v3's own
    assert graph.Config(env="tictactoe_v3").fixed() == ()
    assert graph.Config(fixed_players="none").fixed() == ()
    for env, names, match in (("tictactoe_v3", "lookahead", "no scripted player"),
                              ("connect_four_v3", "random", "always in the league"),
                              ("simple_tag", "lookahead", "simple tag has no scripted")):
        with pytest.raises(ValueError, match=match):
            graph.build(graph.Config(env=env, fixed_players=names))


@pytest.mark.parametrize("share", [0.0, 0.8, 1.0])
def test_the_second_seat_share_seats_the_member_second_that_often(share: float):
    actor = GameActor("connect_four_v3", 200, seed=3, hidden=(16,), second_seat=share)
    weights = dict(MaskedActorCritic((6, 7, 2), 7, (16,)).state_dict())
    weights["league/ids"] = torch.tensor([RANDOM])  # only the member's moves are recorded
    weights["league/self_play"] = torch.tensor(0.0)
    actor.set_weights(weights, 0)
    obs = actor.rollout(12)["obs"]  # the member's moves of finished games: 250+ games
    board = obs[:, :84].reshape(-1, 6, 7, 2)
    own, other = board[..., 0].sum((1, 2)), board[..., 1].sum((1, 2))
    # seated first the member moves with as many pieces as the other side, second with one less
    assert set((other - own).tolist()) <= {0.0, 1.0}
    first_moves = own == 0
    assert first_moves.sum() >= 200
    second = float((other[first_moves] == 1).mean())
    assert abs(second - share) < 0.08, second
    with pytest.raises(ValueError, match="second_seat"):
        GameActor("tictactoe_v3", 2, seed=0, second_seat=1.5)
    graph = load_graph(GRAPH)
    with pytest.raises(ValueError, match="--second-seat must be a share"):
        graph.build(graph.Config(second_seat=-0.1))
    with pytest.raises(ValueError, match="--second-seat is for board games"):
        graph.build(graph.Config(env="simple_tag", second_seat=0.7))


def test_rating_games_between_league_members_rate_them_among_themselves():
    actor = GameActor("tictactoe_v3", 16, seed=2, hidden=(16,), rating_share=0.5)
    net = MaskedActorCritic((3, 3, 2), 9, (16,))
    weights = dict(net.state_dict())
    weights.update({f"league/1/{k}": v for k, v in net.state_dict().items()})
    weights["league/ids"] = torch.tensor([RANDOM, 7])
    weights["league/self_play"] = torch.tensor(0.0)
    actor.set_weights(weights, 1)
    batch = actor.rollout(16)
    rated = [m for m in batch["stats"]["matches"] if m[0] == RATING]
    assert rated and all({m[1], m[2]} == {RANDOM, 7} and len(m) == 4 for m in rated)
    played = [m for m in batch["stats"]["matches"] if m[0] != RATING]
    assert len(batch["stats"]["episode_returns"]) == len(played)  # no transitions, no returns
    # the coordinator rates the two members; the random anchor keeps its rating
    settings = LeagueSettings(snapshot_every=1)
    coordinator = LeagueCoordinator(settings)
    league = coordinator.coordinate(LearnerOutput(0, {}, {"w": torch.zeros(1)}, {}), -1)
    v0 = next(m["id"] for m in league.coordinator["members"] if m["name"] == "v0")
    games = [(RATING, v0, RANDOM, 1.0)] * 6 + [(RATING, RANDOM, v0, 0.0)] * 6
    after = coordinator.coordinate(LearnerOutput(1, {}, {"w": torch.zeros(1)},
                                                 {"matches": games},
                                                 coordinator=league.coordinator), 0)
    members = {m["name"]: m for m in after.coordinator["members"]}
    assert members["v0"]["rating"]["mu"] > 30 and after.metrics["league/rating_games"] == 12
    assert members["random"]["rating"] == league.coordinator["members"][0]["rating"]
    assert after.coordinator["main"]["played"] == 0  # not the main agent's games


def test_exploiters_play_the_main_agent_and_learn_only_from_their_own_moves():
    actor = GameActor("tictactoe_v3", 16, seed=1, hidden=(16,), exploiters=1,
                      exploiter_share=0.5)
    make = lambda seed: ActorCriticLearner(  # noqa: E731
        0, 0, seed, (16,), PPOHyper(), network=lambda: MaskedActorCritic((3, 3, 2), 9, (16,)))
    learner = LeagueLearner(member_names(1), make, seed=0)
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(16)
    games = batch["stats"]["matches"]
    assert {m[0] for m in games} == {0, 1}
    assert {m[1] for m in games if m[0] == 1} == {MAIN}  # exploiters play the main agent
    assert set(batch["member"].tolist()) == {0, 1}
    assert len(batch["stats"]["team_returns"]["exploiters"]) == sum(m[0] == 1 for m in games)
    before = {k: v.clone() for k, v in learner.weights().items()}
    main_only = {k: (v[batch["member"] == 0] if isinstance(v, np.ndarray) else v)
                 for k, v in batch.items()}
    metrics = learner.update([main_only], 0.0)
    after = learner.weights()
    assert not any(k.startswith("exploiter0/") for k in metrics)
    assert all(torch.equal(before[k], after[k]) for k in after if k.startswith("exploiter0/"))
    assert not torch.equal(before["actor.0.weight"], after["actor.0.weight"])
    metrics = learner.update([batch], 0.0)
    assert "exploiter0/losses/policy_loss" in metrics
    # the coordinator rates the exploiter against the main agent and snapshots both
    coordinator = LeagueCoordinator(LeagueSettings(snapshot_every=1, exploiters=1))
    out = coordinator.coordinate(LearnerOutput(0, {}, learner.weights(), {}), -1)
    names = [m["name"] for m in out.coordinator["members"]]
    assert names == ["random", "v0", "exploiter0-v0"]
    won = coordinator.coordinate(LearnerOutput(1, {}, learner.weights(), {
        "matches": [(1, MAIN, 1.0)] * 10}, coordinator=out.coordinator), 0)
    exploiter = won.coordinator["exploiters"][0]
    assert exploiter["rating"]["mu"] > won.coordinator["main"]["rating"]["mu"]
    assert won.metrics["league/exploiter_win_rate"] == 1.0
    assert won.metrics["league/exploiter_games"] == 10


def test_a_league_refuses_distributions_that_cannot_serve_a_coordinator():
    algo = load_graph(GRAPH).build(load_graph(GRAPH).Config(**SMALL))
    get_distribution("actors-learner").check(algo)
    get_distribution("single").check(algo)
    with pytest.raises(Unsupported, match="has a coordinator"):
        get_distribution("impala").check(algo)


def _cluster() -> tuple[object, Client]:
    """Two worker processes of daskrl's own cluster; only ``w1`` offers ``league``."""
    from daskrl.cluster.local import local_cluster

    cluster = local_cluster([{"CPU": 1}, {"CPU": 1, "league": 1}])
    return cluster, Client(cluster)


def test_league_runs_with_its_coordinator_on_its_own_worker_and_resumes(tmp_path: Path):
    cluster, client = _cluster()
    try:
        out = tmp_path / "league"
        steps = 8 * 2 * 8 * 2 * 6  # 12 iterations
        with get_task_stream(client) as ts:
            daskrl.train(GRAPH, client, steps=steps // 2, out=out, progress=False,
                         checkpoint_every=2, resources={"coordinator": "league:1"}, **SMALL)
        places = {t["key"].split("-")[0]: set() for t in ts.data}
        names = {w: info["name"] for w, info in client.scheduler_info()["workers"].items()}
        for t in ts.data:
            places[t["key"].split("-")[0]].add(names[t["worker"]])
        assert places["coordinator"] == {"w1"}, places
        first = load_latest(out / "checkpoints")
        assert [m["name"] for m in first["coordinator"]["members"]] == [
            "random", "v0", "v2", "v4", "v6"]
        daskrl.train(GRAPH, client, steps=steps, out=out, progress=False, resume=True,
                     checkpoint_every=2, resources={"coordinator": "league:1"}, **SMALL)
    finally:
        client.close()
        cluster.close()
    league = load_latest(out / "checkpoints")["coordinator"]
    names = [m["name"] for m in league["members"]]
    assert names == ["random", "v0", "v2", "v4", "v6", "v8", "v10", "v12"]
    assert league["main"]["played"] > first["coordinator"]["main"]["played"]
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 12
    table = subprocess.run([sys.executable, "-m", "daskrl.cli", "league", str(out), "--plot",
                            str(tmp_path / "ratings.png")], capture_output=True, text=True,
                           cwd=ROOT, check=True).stdout
    assert "league after iteration 12: 9 players" in table and "v12" in table
    assert (tmp_path / "ratings.png").stat().st_size > 1000


@pytest.mark.parametrize("backend", ["sync", "dask"])
def test_the_league_goes_on_whole_when_the_chain_restarts(tmp_path: Path, backend: str):
    """Chains of two graphs and no checkpoint until the end: every restart of the chain
    takes the coordinator's state from its worker (not the start's), so no game or
    snapshot is lost."""
    graph = load_graph(GRAPH)
    algo = graph.build(graph.Config(**{**SMALL, "num_actors": 1, "torso": "mlp",
                                      "hidden": 16}))
    settings = RunSettings(out=tmp_path / "run", steps=9 * algo.steps_per_iteration, seed=3,
                           progress=False, eval=False, tensorboard=False, chain=2,
                           checkpoint_every=100)
    if backend == "sync":
        train(SyncBackend(), algo, get_distribution("actors-learner"), settings)
    else:
        cluster, client = _cluster()
        try:
            train(client, algo, get_distribution("actors-learner"), settings)
        finally:
            client.close()
            cluster.close()
    league = load_latest(tmp_path / "run" / "checkpoints")["coordinator"]
    assert [m["name"] for m in league["members"]] == ["random", "v0", "v2", "v4", "v6", "v8"]
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    games = sum(float(r["league/games"]) + float(r["league/self_games"]) for r in rows)
    assert len(rows) == 9 and league["main"]["played"] == games > 0


def test_a_league_learns_tictactoe_against_the_random_player(tmp_path: Path):
    """The greedy policy after 60k of its own moves wins most games against a uniformly
    random player from either seat (an untrained one wins about half as first player)."""
    run = daskrl.train(GRAPH, steps=60_000, out=tmp_path / "ttt", progress=False,
                       distribution="single", env="tictactoe_v3", num_actors=1,
                       eval_games=200)
    summary = json.loads((tmp_path / "ttt" / "summary.json").read_text())
    assert run.summary["env_steps"] >= 60_000
    assert summary["eval_return_mean"] > 0.6, summary
    assert summary["random_win_rate_second"] > 0.5, summary
