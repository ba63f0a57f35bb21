"""Simple tag with both teams learning in a league (``graphs/league.py --env simple_tag``):
each team's final policy against the other team's snapshots the league kept, against the
other team's final policy and against a uniformly random team, ``--episodes`` fresh
episodes each (sampled actions), a team's return per agent as mean ± standard error.

    python benchmarks/league_tag.py --steps 1000000          # train, then measure
    python benchmarks/league_tag.py --run runs/league-tag    # measure a finished run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    run_config,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
GRAPH = str(ROOT / "graphs" / "league.py")


def measure(run: Path, episodes: int, seed: int) -> dict[str, Any]:
    """Every match-up of a final team with the other team's snapshots, final and random."""
    from daskrl.core.script import load_graph
    from daskrl.league.table import read_league
    from daskrl.runtime.checkpoint import load_latest
    from marl.mappo import mean_se
    from marl.tag_league import matchup_returns

    graph = load_graph(GRAPH)
    config = run_config(graph, run).resolved()
    env, model = graph.tag_env(config), graph.tag_model(config)
    final = load_latest(run / "checkpoints")["learner"]["model"]
    league, iteration = read_league(run)

    def play(adversary: Any, good: Any) -> dict[str, list[float]]:
        out = matchup_returns(env, model, {"adversary": adversary, "good": good}, seed,
                              episodes, deterministic=False)
        return {team: list(mean_se(x)) for team, x in out.items()}

    rows: dict[str, Any] = {"final vs final": play(final, final),
                            "final vs random": {"adversary": play(final, None)["adversary"],
                                                "good": play(None, final)["good"]},
                            "random vs random": play(None, None)}
    snapshots: dict[str, list[dict[str, Any]]] = {}
    for team, other in (("adversary", "good"), ("good", "adversary")):
        snapshots[team] = []
        for m in league["teams"][team]["members"]:
            if m["kind"] != "snapshot":
                continue
            snap = league["teams"][team]["weights"][m["id"]]
            sides = {team: final, other: snap}
            snapshots[team].append({"opponent": m["name"], "version": m["version"],
                                    "return": play(sides["adversary"], sides["good"])[team]})
    summary = json.loads((run / "summary.json").read_text())
    return {"run": str(run), "iteration": iteration, "env_steps": summary["env_steps"],
            "wall_s": summary["wall_s"], "env_steps_per_s": summary["env_steps_per_s"],
            "episodes": episodes, "matchups": rows, "vs_snapshots": snapshots,
            "goal": config.goal}


def cross_play(run: Path, other: Path, episodes: int, seed: int) -> dict[str, Any]:
    """Each final team of ``run`` against the other team of ``other`` (a run of
    ``graphs/mappo.py`` on simple tag with the same network sizes, say)."""
    from daskrl.core.script import load_graph
    from daskrl.runtime.checkpoint import load_latest
    from marl.mappo import mean_se
    from marl.tag_league import matchup_returns

    graph = load_graph(GRAPH)
    config = run_config(graph, run).resolved()
    ours = load_latest(run / "checkpoints")["learner"]["model"]
    theirs = load_latest(other / "checkpoints")["learner"]["model"]

    def play(adversary: Any, good: Any) -> dict[str, list[float]]:
        out = matchup_returns(graph.tag_env(config), graph.tag_model(config),
                              {"adversary": adversary, "good": good}, seed, episodes,
                              deterministic=False)
        return {team: list(mean_se(x)) for team, x in out.items()}
    return {"against": str(other), "ours_vs_ours": play(ours, ours),
            "theirs_vs_theirs": play(theirs, theirs),
            "our_predators_vs_their_prey": play(ours, theirs),
            "their_predators_vs_our_prey": play(theirs, ours)}


def table(result: dict[str, Any]) -> str:
    """The markdown section: the fixed match-ups, then each team against the snapshots."""
    load = f"{result['load_before']['load_1m']:.1f}-{result['load_after']['load_1m']:.1f}"
    head = (f"Simple tag (3 predators, 1 prey, 2 obstacles, 25 steps), `graphs/league.py "
            f"--env simple_tag` defaults, seed {result['seed']}, {result['env_steps']:,} env "
            f"steps in {result['wall_s']:.0f} s ({result['env_steps_per_s']:.0f}/s), embedded "
            f"cluster, {result['load_before']['time'][:10]}; load (1 min) while this script "
            f"ran {load}. Return per agent per episode, mean ± standard error over "
            f"{result['episodes']:,} fresh episodes each, sampled actions (predators: +10 "
            "per touch of the prey; prey: -10 per touch, minus its boundary penalty).\n\n")

    def cell(v: list[float]) -> str:
        return f"{v[0]:.2f} ± {v[1]:.2f}"
    fixed = [[name, cell(r["adversary"]), cell(r["good"])]
             for name, r in result["matchups"].items()]
    text = head + markdown_table(["match-up", "predators' return", "prey's return"], fixed)
    for team, label in (("adversary", "final predators"), ("good", "final prey")):
        rows = [[s["opponent"], cell(s["return"])] for s in result["vs_snapshots"][team]]
        if rows:
            text += (f"\n\nThe {label} against the other team's snapshots the league kept "
                     f"(their own return):\n\n"
                     + markdown_table(["opponent", f"return of the {label}"], rows))
    return text + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="measure this finished run instead of training one")
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps to train")
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per match-up")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "league-tag")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "league_tag.json")
    parser.add_argument("--against", type=Path, default=None,
                        help="also cross-play the final teams with this run's (e.g. a "
                             "graphs/mappo.py run on simple tag: co-training without a league)")
    args = parser.parse_args()
    run = args.run
    load_before = load_average()
    if run is None:
        import daskrl

        started = time.perf_counter()
        daskrl.train(GRAPH, steps=args.steps, out=args.out, seed=args.seed, env="simple_tag")
        print(f"trained in {time.perf_counter() - started:.0f} s")
        run = args.out
    result = measure(run, args.episodes, args.seed)
    if args.against is not None:
        result["cross_play"] = cross_play(run, args.against, args.episodes, args.seed)
    result.update(seed=args.seed, load_before=load_before, load_after=load_average(),
                  machine=machine_info())
    from daskrl.league.table import plot_ratings

    plot_ratings(run, args.json.with_name("league_tag_ratings.png"))
    write_json(args.json, result)
    text = table(result)
    update_section(HERE / "league.md", "league-simple-tag", text)
    print(text)


if __name__ == "__main__":
    main()
