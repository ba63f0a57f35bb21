"""Can a board-game network represent Connect Four's tactics? Each torso of
``graphs/league.py`` (``--torso mlp``, ``conv``, ``fcn``) trained supervised on positions
from random games that call for a move (win now: any winning column; or block the other
side's only immediate win; :func:`marl.board_game.tactical_positions`), then asked for it in
positions it has not seen.

This separates what a network can learn from what the league's self-play teaches it: the
league's greedy policy misses immediate wins and blocks (``league.md``'s tactics lines), and
a torso that picks them out poorly even from labelled positions limits what training on
games can reach.

    python benchmarks/board_tactics.py              # results/board_tactics.json + the table
    python benchmarks/board_tactics.py --quick      # smoke: 2k positions, 2 epochs, 1 seed
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _common import (
    ROOT,
    fmt,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

sys.path.insert(0, str(ROOT))  # daskrl and marl from this checkout

HERE = Path(__file__).resolve().parent
TORSOS = ("mlp", "conv", "fcn")


def called_loss(logits: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the set of right moves: minus the log of the probability the
    network gives to all of them together (a position with two winning columns has two)."""
    low = torch.finfo(logits.dtype).min
    return (torch.logsumexp(logits, -1) - torch.logsumexp(logits.masked_fill(~right, low), -1)
            ).mean()


def train_and_test(torso: str, train: tuple[Any, Any], test: tuple[Any, Any], epochs: int,
                   seed: int, batch: int = 256) -> dict[str, Any]:
    """One torso, as ``graphs/league.py`` builds it by default (hidden 128), trained with
    Adam (1e-3) on :func:`called_loss`; after each epoch, the share of ``test`` positions
    where its greedy move is a right one. ``cpu_s``: the training's CPU seconds (not the
    tests')."""
    from marl.board_game import GameShape
    from marl.board_network import MaskedActorCritic

    shape = GameShape.of("connect_four_v3")
    torch.manual_seed(seed)
    net = MaskedActorCritic(shape.board, shape.actions, (128, 128), torso, cells=shape.cells)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)
    (x, right), (x_test, right_test) = train, test
    curve = []
    cpu_s = 0.0
    for _ in range(epochs):
        started = time.process_time()
        for idx in torch.randperm(len(x)).split(batch):
            loss = called_loss(net.logits(x[idx]), right[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        cpu_s += time.process_time() - started
        with torch.no_grad():
            moves = net.logits(x_test).argmax(-1)
            curve.append(right_test[torch.arange(len(moves)), moves].float().mean().item())
    return {"accuracy": curve[-1], "curve": curve, "cpu_s": cpu_s,
            "params": sum(p.numel() for p in net.parameters()),
            "policy_params": policy_params(net)}


def policy_params(net: Any) -> int:
    """Parameters that choose moves (all but the critic's, which :func:`called_loss` leaves
    untrained)."""
    return sum(p.numel() for name, p in net.named_parameters() if not name.startswith("critic"))


def unseen(x: torch.Tensor, right: torch.Tensor, split: int
           ) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The first ``split`` positions to train on, the rest to test on less any position that
    is also among the training ones (random games repeat their early positions)."""
    seen = {row.numpy().tobytes() for row in x[:split]}
    keep = torch.tensor([row.numpy().tobytes() not in seen for row in x[split:]], dtype=bool)
    return (x[:split], right[:split]), (x[split:][keep], right[split:][keep])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torsos", nargs="+", choices=TORSOS, default=list(TORSOS))
    parser.add_argument("--positions", type=int, default=50_000, help="training positions")
    parser.add_argument("--test", type=int, default=10_000, help="held-out positions")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="network seeds (the positions are the same for each)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2k positions, 2 epochs, one seed; writes nothing")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "board_tactics.json")
    parser.add_argument("--md", type=Path, default=HERE / "league.md")
    args = parser.parse_args()
    if args.quick:
        args.positions, args.test, args.epochs, args.seeds = 2000, 500, 2, [1]
    from marl.board_game import tactical_positions

    torch.set_num_threads(1)  # CPU seconds comparable across torsos, one core each
    load_before = load_average()
    obs, right = tactical_positions(args.positions + args.test, seed=0)
    train, test = unseen(torch.as_tensor(obs), torch.as_tensor(right), args.positions)
    rows = []
    for torso in args.torsos:
        runs = [train_and_test(torso, train, test, args.epochs, seed) for seed in args.seeds]
        rows.append({"torso": torso, "seeds": args.seeds, "runs": runs,
                     "median_accuracy": median(r["accuracy"] for r in runs),
                     "median_cpu_s": median(r["cpu_s"] for r in runs),
                     "params": runs[0]["params"], "policy_params": runs[0]["policy_params"]})
        print(torso, [round(r["accuracy"], 3) for r in runs], flush=True)
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "test_positions": len(test[0]), "rows": rows, "load_before": load_before,
              "load_after": load_average(), "machine": machine_info()}
    table = markdown_table(
        ["torso", "policy parameters", "right moves, held out (median)", "per seed",
         "CPU s to train"],
        [[r["torso"], r["policy_params"], fmt(r["median_accuracy"]),
          " / ".join(fmt(run["accuracy"]) for run in r["runs"]), fmt(r["median_cpu_s"])]
         for r in rows])
    text = (f"{args.positions:,} training positions and {len(test[0]):,} held-out ones (of "
            f"{args.test:,}: those also among the training ones left out), {args.epochs} "
            f"epochs, seeds {', '.join(map(str, args.seeds))}, one torch thread; a move is "
            "right if it wins now (any winning column) or blocks the only threat; load (1 min) "
            f"{load_before['load_1m']:.1f}-{result['load_after']['load_1m']:.1f}.\n\n"
            f"{table}\n")
    print(text)
    if not args.quick:
        write_json(args.json, result)
        update_section(args.md, "board-tactics", text)


if __name__ == "__main__":
    main()
