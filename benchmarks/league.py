"""A self-play league on Connect Four (``graphs/league.py``): the final learning policy
against a uniformly random player and the one-step look-ahead player (wins when it can,
blocks when it must), ``--games`` games from each seat with the greedy policy, win rates with
Wilson 95 % intervals; and the league's rating curve (the policy's OpenSkill ``mu`` over the
run, each snapshot's rating when the run ended).

    python benchmarks/league.py --steps 1500000            # train, then measure
    python benchmarks/league.py --run runs/league-c4       # measure a finished run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    graph_setting,
    load_average,
    machine_info,
    markdown_table,
    run_config,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
GRAPH = str(ROOT / "graphs" / "league.py")


def measure(run: Path, games: int, seed: int) -> dict[str, Any]:
    """Both seats against both fixed players, and the rating curve of ``run``."""
    from daskrl.core.script import load_graph
    from daskrl.league.table import read_league
    from daskrl.observe.plot import read_metrics
    from daskrl.runtime.checkpoint import load_latest
    from marl.board_game import both_seats

    graph = load_graph(GRAPH)
    config = run_config(graph, run).resolved()
    weights = load_latest(run / "checkpoints")["learner"]["model"]
    player = graph.policy_player(config, weights, True, seed)
    rows = {}
    for other in ("random", "lookahead"):
        seats = both_seats("connect_four_v3", player,
                           graph.benchmark_player(config, other, seed + 1), games, seed)
        rows[other] = {seat: {"wins": s.wins, "draws": s.draws, "losses": s.losses,
                              "win_rate": s.win_rate, "interval": s.interval()}
                       for seat, s in seats.items()}
    league, iteration = read_league(run)
    columns = read_metrics(run)
    curve = list(zip(columns["iteration"], columns["league/rating_mu"], strict=True))
    snapshots = [(m["version"], m["rating"]["mu"], m["rating"]["sigma"])
                 for m in league["members"] if m["kind"] == "snapshot"]
    summary = json.loads((run / "summary.json").read_text())
    return {"run": str(run), "iteration": iteration, "env_steps": summary["env_steps"],
            "wall_s": summary["wall_s"], "env_steps_per_s": summary["env_steps_per_s"],
            "games_per_seat": games, "results": rows, "rating_curve": curve[:: max(1, len(curve)
                                                                                 // 50)],
            "snapshots": snapshots}


def tactics(run: Path, games: int, seed: int) -> dict[str, dict[str, float]]:
    """How often the greedy policy takes an immediate win when it has one, and blocks the
    other side's immediate win when it must, in ``games`` games from each seat against each
    fixed player (a position with both counts as a win to take)."""
    from daskrl.core.script import load_graph
    from daskrl.runtime.checkpoint import load_latest
    from marl.board_game import both_seats, called_for

    graph = load_graph(GRAPH)
    config = run_config(graph, run).resolved()
    policy = graph.policy_player(config, load_latest(run / "checkpoints")["learner"]["model"],
                                 True, seed)
    out = {}
    for other in ("random", "lookahead"):
        seen = {"wins": 0, "taken": 0, "threats": 0, "blocked": 0}

        def counting(obs: Any, seen: dict[str, int] = seen) -> Any:
            actions = policy(obs)
            planes = obs[:, :-7].reshape(len(obs), 6, 7, 2)
            for board, action in zip(planes, actions, strict=True):
                kind, columns = called_for(board[:, :, 0], board[:, :, 1])
                if kind == "win":
                    seen["wins"] += 1
                    seen["taken"] += int(action in columns)
                elif kind == "block":
                    seen["threats"] += 1
                    seen["blocked"] += int(action in columns)
            return actions
        both_seats("connect_four_v3", counting, graph.benchmark_player(config, other, seed + 1),
                   games, seed)
        out[other] = {**seen, "took_win": seen["taken"] / max(1, seen["wins"]),
                      "blocked_share": seen["blocked"] / max(1, seen["threats"])}
    return out


def round_robin(run: Path, games: int, seed: int) -> dict[str, Any]:
    """Ratings from games among the snapshots the run kept, the random and the look-ahead
    player alone (fresh OpenSkill ratings, no game with the main agent): ``games`` games from
    each seat for every pair, rated in a shuffled order."""
    import numpy as np
    from scipy.stats import spearmanr

    from daskrl.core.script import load_graph
    from daskrl.league.ratings import new_rating, rate_game
    from daskrl.league.table import read_league
    from marl.board_game import both_seats

    graph = load_graph(GRAPH)
    config = run_config(graph, run).resolved()
    league, _ = read_league(run)
    players: dict[str, Any] = {
        "random": graph.benchmark_player(config, "random", seed),
        "lookahead": graph.benchmark_player(config, "lookahead", seed + 1)}
    versions = {}
    for m in league["members"]:
        if m["kind"] == "snapshot":
            players[m["name"]] = graph.policy_player(config, league["weights"][m["id"]], False,
                                                     seed + m["version"])
            versions[m["name"]] = m["version"]
    names = list(players)
    results = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            seats = both_seats("connect_four_v3", players[a], players[b], games, seed)
            for s in seats.values():
                results += ([(a, b, 1.0)] * s.wins + [(a, b, 0.5)] * s.draws
                            + [(a, b, 0.0)] * s.losses)
    order = np.random.default_rng(seed).permutation(len(results))
    ratings = {n: new_rating() for n in names}
    for k in order:
        a, b, score = results[k]
        ratings[a], ratings[b] = rate_game(ratings[a], ratings[b], score)
    snaps = sorted(versions, key=versions.get)
    rho = spearmanr([versions[n] for n in snaps], [ratings[n]["mu"] for n in snaps])[0]
    return {"games_per_pair": 2 * games, "ratings": ratings, "versions": versions,
            "spearman_version_mu": float(rho)}


def table(result: dict[str, Any]) -> str:
    load = (f"{result['load_before']['load_1m']:.1f}-{result['load_after']['load_1m']:.1f}"
            if "load_before" in result else "not recorded")
    head = (f"Connect Four, `graphs/league.py` defaults, seed {result['seed']}, "
            f"{result['env_steps']:,} learner moves, embedded cluster, "
            f"{result['load_before']['time'][:10]}; load (1 min) while this script ran {load}. "
            "The greedy policy, "
            f"{result['games_per_seat']:,} games from each seat against each player.\n\n")
    rows = []
    for other, seats in result["results"].items():
        for seat, s in seats.items():
            lo, hi = s["interval"]
            rows.append([other, seat, s["wins"], s["draws"], s["losses"],
                         f"{s['win_rate']:.3f} [{lo:.3f}, {hi:.3f}]"])
    snaps = result["snapshots"]
    rising = sum(b[1] > a[1] for a, b in zip(snaps, snaps[1:], strict=False))
    robin = ""
    if "round_robin" in result:
        rr = result["round_robin"]
        ranked = sorted(rr["ratings"].items(), key=lambda kv: -kv[1]["mu"])
        robin = ("\n\nRound robin of the kept snapshots (sampling their policies), the random "
                 f"and the look-ahead player, {rr['games_per_pair']} games per pair, rated from "
                 "fresh OpenSkill ratings without the main agent: "
                 + ", ".join(f"{n} {r['mu']:.1f}" for n, r in ranked)
                 + f". Spearman correlation of a snapshot's version with its rating: "
                 f"{rr['spearman_version_mu']:.2f}.")
    tac = ""
    if "tactics" in result:
        tac = "\n\nTactics of the greedy policy (games from each seat, counted per position): " + (
            "; ".join(f"against {o}, it took an immediate win in {t['took_win']:.0%} of "
                      f"{t['wins']} positions that had one and blocked the other's in "
                      f"{t['blocked_share']:.0%} of {t['threats']}"
                      for o, t in result["tactics"].items())) + "."
    return head + (markdown_table(["opponent", "seat", "wins", "draws", "losses",
                            "win rate [95 % Wilson]"], rows)
            + f"\n\n{result['env_steps']:,} learner moves in {result['wall_s']:.0f} s "
              f"({result['env_steps_per_s']:.0f}/s); {len(snaps)} snapshots kept, each rated "
              f"above the one before in {rising} of {max(0, len(snaps) - 1)} pairs "
              f"(ratings from {snaps[0][1]:.1f} to {snaps[-1][1]:.1f}); the rating curve is "
              "`results/league_ratings.png`." + robin + tac + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="measure this finished run instead of training one")
    parser.add_argument("--steps", type=int, default=1_500_000, help="learner moves to train")
    parser.add_argument("--games", type=int, default=1000, help="games from each seat")
    parser.add_argument("--pair-games", type=int, default=10,
                        help="round robin: games from each seat per pair of players")
    parser.add_argument("--tactics-games", type=int, default=300,
                        help="games from each seat in which immediate wins and blocks are "
                             "counted")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--torso", choices=("mlp", "conv", "fcn"), default="mlp",
                        help="the network's torso (graphs/league.py --torso)")
    parser.add_argument("--pfsp", choices=("hard", "variance", "uniform"), default="hard",
                        help="PFSP's weighting (graphs/league.py --pfsp)")
    parser.add_argument("--gamma", type=float, default=None,
                        help="discount factor (graphs/league.py --gamma; default: its own)")
    parser.add_argument("--set", type=graph_setting, action="append", default=[],
                        metavar="FIELD=VALUE", help="another setting of graphs/league.py, "
                        "e.g. --set hidden=256 (repeatable)")
    parser.add_argument("--section", default="league-connect-four",
                        help="the marked section of league.md that gets the table")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "league-c4")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "league.json")
    args = parser.parse_args()
    run = args.run
    load_before = load_average()
    if run is None:
        import daskrl

        started = time.perf_counter()
        daskrl.train(GRAPH, steps=args.steps, out=args.out, seed=args.seed,
                     env="connect_four_v3", torso=args.torso, pfsp=args.pfsp,
                     gamma=args.gamma, **dict(args.set))
        print(f"trained in {time.perf_counter() - started:.0f} s")
        run = args.out
    result = measure(run, args.games, args.seed)
    result["round_robin"] = round_robin(run, args.pair_games, args.seed)
    result["tactics"] = tactics(run, args.tactics_games, args.seed)
    result.update(seed=args.seed, load_before=load_before, load_after=load_average(),
                  machine=machine_info())
    from daskrl.league.table import plot_ratings

    plot_ratings(run, args.json.with_name("league_ratings.png"))
    write_json(args.json, result)
    text = table(result)
    update_section(HERE / "league.md", args.section, text)
    print(text)


if __name__ == "__main__":
    main()
